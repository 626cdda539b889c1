"""Starting or joining Ray for a launch, and counting its trial slots.

A launch runs on a private embedded Ray unless ``--address`` or ``$RAY_ADDRESS``
names a cluster (``standing``: this user's standing local Ray, see
:mod:`pipeline.run._standing`). A cluster someone else started on the machine is never
joined unless named; an unreachable address fails within seconds (exit 2).

Who else can use it (:mod:`pipeline.run._auth`, SECURITY.md): the local Rays this module
starts or joins (embedded, standing) use Ray's token authentication with the token
of this user's state folder, and keep their session files in a private folder; a
named cluster is joined with whatever token the environment gives Ray
(``RAY_AUTH_MODE=token`` and ``$RAY_AUTH_TOKEN_PATH``, docs/cluster.md), and a
refused token is an argument error (exit 2). A launch whose Ray runs without token
authentication says so once on stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

from phasesweep.pipeline.run import _auth
from phasesweep.pipeline.run import _standing as standing
from phasesweep.pipeline.run._signals import held_stop_signals, take_sigterm_as_interrupt
from phasesweep.pipeline.spec import SpecError

#: The private folder of the embedded Ray this process started (removed when it stops).
_embedded: list[str] = []


def cluster_address(address: str | None) -> str | None:
    """The cluster a launch joins: ``address``, else ``$RAY_ADDRESS``, else None (embedded);
    ``local`` names the embedded instance even where ``$RAY_ADDRESS`` is set, ``standing``
    this user's standing local Ray (:mod:`pipeline.run._standing`), started if none runs."""
    if address == "local":
        return None
    if address == STANDING:
        return standing.ensure()
    return address or os.environ.get("RAY_ADDRESS") or None


def _on_loopback(address: str | None) -> bool:
    """The embedded instance, or a cluster whose head is on this machine's loopback."""
    return not address or address.split("://")[-1].rsplit(":", 1)[0] in ("127.0.0.1", "localhost")


#: ``--address`` value that names this user's standing local Ray.
STANDING = "standing"

#: Seconds to wait for a TCP connection to a named cluster's head before giving up.
CONNECT_TIMEOUT = 10.0


def _check_reachable(address: str) -> None:
    """A ``host:port`` or ``ray://host:port`` address must accept a TCP connection within
    :data:`CONNECT_TIMEOUT` (Ray itself retries for minutes); ``auto`` is left to Ray."""
    if address == "auto":
        return
    host, sep, port = address.split("://")[-1].rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(
            "--address", address, "expected auto, HOST:PORT or ray://HOST:PORT", "argument"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as e:
        raise SpecError(
            "--address", address, f"cannot reach the cluster: {e}", "argument"
        ) from None


def connect(address: str | None) -> None:
    """Start or join Ray for a launch (idempotent within a process).

    With no ``address`` and no ``$RAY_ADDRESS``: a new local instance private to this
    launch (``address="local"``: Ray never looks for a cluster someone else started on
    the machine), its trials at the priority of other processes
    (:data:`pipeline.run._standing.LOCAL_DEFAULTS`), its token the state folder's
    (:func:`pipeline.run._standing.state_dir`), its session files in a private folder that
    :func:`disconnect` removes. ``standing``: this user's standing local Ray, started on
    demand and left running (:mod:`pipeline.run._standing`), joined with its token.
    Otherwise join that cluster with the token settings of the environment; an
    unreachable or malformed address, or a refused token, is a :class:`SpecError` naming
    ``--address`` (exit 2), raised within seconds. Sets this process's ``RAY_*``
    variables as the Ray it starts or joins needs them. A stop signal during Ray's
    start-up ends it (:func:`hold_stop_signals`). From the start-up on the process takes
    SIGTERM as it takes Ctrl-C (:func:`~pipeline.run._signals.take_sigterm_as_interrupt`),
    where Ray's init would leave ``sys.exit(15)``: a launch stopped so unwinds and exits 143.
    """
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return
    target = cluster_address(address)
    if address == STANDING:
        auth = standing.driver_env()
        standing.hold()
    elif not target:
        for name, value in standing.LOCAL_DEFAULTS.items():
            os.environ.setdefault(name, value)
        user_off = _auth.disabled_by_user()
        auth = _auth.token_env(None if user_off else _auth.token_file(standing.state_dir()))
    else:
        auth = None  # the environment's own settings, as Ray reads them
    if _on_loopback(target):
        # Ray resolves a loopback head address to the machine's outward IP unless
        # this is off (read when ray is first imported); keep everything on loopback.
        for name, value in standing.LOOPBACK.items():
            os.environ.setdefault(name, value)
    _auth.use_token(auth or {}, keep_token=auth is None)
    import ray
    from ray.exceptions import AuthenticationError

    if target:
        _check_reachable(target)
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR"
    )
    if _on_loopback(target):
        kwargs["_node_ip_address"] = "127.0.0.1"
    # from now on this process takes SIGTERM as it takes Ctrl-C: the hold below gives a
    # signal held in it to this handler, and one just after it finds the handler set
    take_sigterm_as_interrupt()
    try:
        with hold_stop_signals(), _quiet_token_refusal(bool(target)):
            if not target:
                # in the hold: a stop signal from the folder's making on removes it
                kwargs["_temp_dir"] = _auth.private_temp_dir()
                _embedded.append(os.path.dirname(kwargs["_temp_dir"]))
                # registered after Ray's own exit hook (at its import), so run before it
                atexit.unregister(_exit_hook)
                atexit.register(_exit_hook)
            ray.init(address=target or "local", **kwargs)
    except BaseException as e:
        disconnect()  # a stop held till Ray was up (hold_stop_signals) finds it started
        joining = (ConnectionError, ValueError, RuntimeError, TimeoutError, AuthenticationError)
        if target and isinstance(e, joining):
            raise SpecError("--address", target, _join_failure(e), "argument") from None
        raise
    if _auth.joined_without_token():
        if address == STANDING:
            why = "it was started with RAY_AUTH_MODE=disabled"
        elif _auth.disabled_by_user():
            why = "RAY_AUTH_MODE=disabled in the environment"
        else:
            why = "it let this launch join without a token"
        _auth.warn_open(f"the Ray at {target}" if target else "the embedded Ray", why)


#: Ray's words for a token it refused or could not find, also where it passes them on only
#: as text (the GCS client's last error, formatted into a RuntimeError).
_AUTH_FAILED = re.compile(r"AuthenticationError: (.+?)(?:\. |\.?\n|\.?$)")


def _token_failure(e: BaseException) -> str | None:
    """Ray's words if ``e`` (or anything in its chain of causes) is a refused or missing
    token, else None."""
    cause: BaseException | None = e
    while cause is not None:
        found = _AUTH_FAILED.search(f"{type(cause).__name__}: {cause}")
        if found:
            return found.group(1)
        cause = cause.__cause__ or cause.__context__
    return None


def _join_failure(e: BaseException) -> str:
    """Why a named cluster could not be joined, in one line: a refused or missing token
    with how to pass one, else Ray's first line."""
    said = _token_failure(e)
    if said is not None:
        return (
            f"token authentication failed ({said}): set RAY_AUTH_MODE=token and "
            "RAY_AUTH_TOKEN_PATH to a file holding the cluster's token (docs/cluster.md)"
        )
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"cannot join the cluster: {first}"


@contextlib.contextmanager
def _quiet_token_refusal(joining: bool) -> Iterator[None]:
    """While ``joining`` a named cluster, keep what is written to file descriptor 2 aside,
    and write it out afterwards unless the token was refused: then Ray's C++ client has
    printed a warning on each of its 20 retries, and :func:`_join_failure`'s one line
    says it all."""
    if not joining:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    refused = False
    with tempfile.TemporaryFile() as aside:
        os.dup2(aside.fileno(), 2)
        try:
            yield
        except BaseException as e:
            refused = _token_failure(e) is not None
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not refused:
                aside.seek(0)
                os.write(2, aside.read())


@contextlib.contextmanager
def hold_stop_signals() -> Iterator[None]:
    """Hold a stop signal (Ctrl-C or SIGTERM) that comes during Ray's start-up and deliver
    it after it (:func:`~pipeline.run._signals.held_stop_signals`: to the handler there
    was before; a second one ends it at once). Ray's start-up forks, and an exception
    raised in an at-fork callback (logging's lock release) is printed and lost: the
    launch would go on as if never interrupted.

    Ray's init would set SIGTERM's handler to its own ``sys.exit(15)`` (and, starting a
    node, to one that kills the node's processes and exits 1), taking SIGTERM from the
    hold and losing it in that callback as well (seen: a launch SIGTERMed at start-up
    trained its whole sweep and exited 0). So while the block runs Ray's one setter of
    SIGTERM handlers, ``ray._private.utils.set_sigterm_handler``, sets none; the test of
    this reads Ray's init, so a Ray that sets the handler otherwise fails it."""
    import ray._private.utils as ray_utils

    setter = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = _left_alone
    try:
        with held_stop_signals():
            yield
    finally:
        ray_utils.set_sigterm_handler = setter


def _left_alone(handler: object) -> None:
    """Ray's SIGTERM handler, not set: the one :func:`hold_stop_signals` holds stays."""


def embedded_processes() -> list[int]:
    """Pids of the processes this process started for its embedded Ray (its head, node,
    monitors: children running from the private folder; not its workers, which come and
    go); none where it started none."""
    return standing.running_from(_embedded[-1], parent=os.getpid()) if _embedded else []


def remove_embedded() -> None:
    """Remove the private folder of the embedded Ray, after ending any process still
    running from it (Ray's agents outlive a start-up that was interrupted, and some a
    shutdown, by up to a minute, and would write into the folder again)."""
    while _embedded:
        folder = _embedded.pop()
        standing.kill_running_from(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _exit_hook() -> None:
    """At exit: :func:`disconnect` where a private local Ray still runs (a launch from the
    Python API leaves it up for the next), so that its folder goes with it."""
    if _embedded:
        disconnect()


def disconnect() -> None:
    """Leave Ray now if this process started or joined it: a private local Ray stops (and
    its private folder goes), a standing Ray or a named cluster goes on. For a process
    about to exit (the ``phasesweep`` command): Ray's own exit hook would do the same,
    but first sleeps 0.5 s so that worker logs reach the console, which a launch never
    shows (``log_to_driver=False`` in :func:`connect`)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    remove_embedded()
