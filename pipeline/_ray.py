"""Starting or joining Ray for a launch, and counting its trial slots.

A launch runs on a private embedded Ray unless ``--address`` or ``$RAY_ADDRESS``
names a cluster (``standing``: this user's standing local Ray, see
:mod:`pipeline._standing`). A cluster someone else started on the machine is never
joined unless named; an unreachable address fails within seconds (exit 2).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from phasesweep.pipeline import _standing as standing
from phasesweep.pipeline.spec import SpecError


def cluster_address(address: str | None) -> str | None:
    """The cluster a launch joins: ``address``, else ``$RAY_ADDRESS``, else None (embedded);
    ``local`` names the embedded instance even where ``$RAY_ADDRESS`` is set, ``standing``
    this user's standing local Ray (:mod:`pipeline._standing`), started if none runs."""
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
    (:data:`pipeline._standing.LOCAL_DEFAULTS`). ``standing``: this user's standing local
    Ray, started on demand and left running (:mod:`pipeline._standing`). Otherwise join
    that cluster; an unreachable or malformed address is a :class:`SpecError` naming
    ``--address`` (exit 2), raised within seconds.
    """
    target = cluster_address(address)
    if address == STANDING:
        os.environ.update(standing.ENV)
        standing.hold()
    elif not target:
        for name, value in standing.LOCAL_DEFAULTS.items():
            os.environ.setdefault(name, value)
    if _on_loopback(target):
        # Ray resolves a loopback head address to the machine's outward IP unless
        # this is off (read when ray is first imported); keep everything on loopback.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    if target:
        _check_reachable(target)
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR"
    )
    if _on_loopback(target):
        kwargs["_node_ip_address"] = "127.0.0.1"
    try:
        ray.init(address=target or "local", **kwargs)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
        if not target:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecError(
            "--address", target, f"cannot join the cluster: {first}", "argument"
        ) from None


def disconnect() -> None:
    """Leave Ray now if this process started or joined it: a private local Ray stops, a
    standing Ray or a named cluster goes on. For a process about to exit (the
    ``phasesweep`` command): Ray's own exit hook would do the same, but first sleeps
    0.5 s so that worker logs reach the console, which a launch never shows
    (``log_to_driver=False`` in :func:`connect`)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
