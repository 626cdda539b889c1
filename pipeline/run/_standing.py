"""A standing local Ray: one loopback Ray head that outlives a launch, for launches that
name it (``--address standing``).

Why: the embedded default starts a private Ray and stops it again on every launch;
that start (GCS, raylet, agents: 2.5–4 s) and the graceful stop (1.3 s) are most of
what a small sweep waits for (``benchmarks/launch.py``). A launch that names the
standing instance joins it instead (0.3 s) and leaves it running.

- **On demand**: the first launch that names it starts it (about 4 s); later ones
  reuse it. Starts are serialised by a lock, so concurrent launches start one. A stop
  signal (Ctrl-C, SIGTERM) during a start ends the launch once the start is recorded,
  never halfway.
- **This user's, on this machine**: on 127.0.0.1 only, found through the
  ``instance.json`` of its state folder (:func:`state_dir`) and nothing else, never
  through Ray's own discovery. The embedded default never joins it.
- **No one else's**: Ray's token authentication on; the token is the state folder's
  ``auth_token`` (:func:`pipeline.run._auth.token_file`: written once by the first launch,
  mode 0600), which every driver that joins presents (:func:`driver_env`). The state
  folder is trusted only if it is this user's, mode 0700 and no symbolic link
  (:func:`pipeline.run._auth.private_folder`), else every command refuses it (exit 2);
  Ray's session files live in a private folder of their own. Where the user's
  environment says ``RAY_AUTH_MODE=disabled`` the instance starts without a token
  (recorded in ``instance.json``), and every launch that joins it says so on stderr.
- **Stopped** by ``phasesweep standing stop``, or by its watchdog once no launch has used it
  for ``idle_minutes``. A launch holds a shared ``flock`` on ``in-use`` while it is
  connected (released by the kernel when it exits, even on SIGKILL); the watchdog
  counts idle time from the last moment it saw that lock held.

Its head and watchdog run in a session of their own: stopping it kills the session
(head, raylet, agents, workers, watchdog) and removes ``instance.json``. Concurrency
caveat: ``stop`` kills the trials of launches that are still connected; those
launches then fail over to their retries and a relaunch trains what they lost.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from phasesweep.pipeline.run import _auth
from phasesweep.pipeline.run._signals import held_stop_signals

from phasesweep._config import SpecError

#: Minutes a standing instance waits without launches before it stops itself (default;
#: ``$PHASESWEEP_STANDING_IDLE_MINUTES`` sets it for the instance a launch starts).
IDLE_MINUTES = 15.0
IDLE_ENV = "PHASESWEEP_STANDING_IDLE_MINUTES"
#: Seconds a start may take before it is given up (a loaded machine is slow).
START_TIMEOUT = 180.0
_POLL = 2.0
#: Ray's setting for the head and for drivers that join it: a loopback address kept as
#: it is (Ray otherwise swaps it for the machine's outward address).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: Defaults for every local Ray this tool starts (the embedded one too); the user's own
#: environment wins. Ray runs its workers at nice 15 so that its control plane stays
#: responsive, but here the workers are the trials, the work itself: beside any other
#: busy process at nice 0 they got about 3 % of a core (a tiny launch took 74 s instead of
#: 7 s on a 2-core machine kept busy by two other processes; 15 s at nice 0).
#: ``MALLOC_ARENA_MAX``: glibc gives each thread that allocates an arena of its own, and a
#: trial's worker runs its training in a thread of a process of some 25 threads: the
#: arenas' freed but kept pages made each trial of a 2·10⁴-point launch hold ~820 MB of
#: RSS, ~520 MB with two arenas (summed over the launch, 2.4 GB → 1.8 GB; the trainer's
#: speed unchanged: it allocates its buffers once per chunk).
LOCAL_DEFAULTS = {"RAY_worker_niceness": "0", "MALLOC_ARENA_MAX": "2"}


def _env(auth: dict[str, str]) -> dict[str, str]:
    """The environment of the head and of the drivers this module starts: the instance's
    token settings ``auth`` (:func:`pipeline.run._auth.token_env`) and :data:`LOOPBACK` over
    :data:`LOCAL_DEFAULTS` and the caller's, and neither ``$RAY_ADDRESS`` (it would name
    another cluster) nor ``$RAY_AUTH_TOKEN`` (it would override the token file)."""
    env = {**LOCAL_DEFAULTS, **os.environ, **auth, **LOOPBACK}
    env.pop("RAY_ADDRESS", None)
    env.pop(_auth.TOKEN, None)
    return env


def state_dir(create: bool = True) -> Path:
    """This user's state folder: the standing instance's files, and the token of every
    local Ray phasesweep starts. ``$PHASESWEEP_STANDING_DIR``, else
    ``$XDG_RUNTIME_DIR/phasesweep-ray`` (a folder of the user's own, emptied at logout)
    where that exists, else ``$TMPDIR/phasesweep-ray-$UID``. Checked before any file in
    it is used (:func:`pipeline.run._auth.private_folder`: exit 2 unless it is this user's,
    mode 0700, no symbolic link); created when missing and ``create``."""
    given = os.environ.get(_auth.FOLDER_ENV)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if given:
        folder = Path(given)
    elif runtime and os.path.isdir(runtime):
        folder = Path(runtime) / "phasesweep-ray"
    else:
        folder = Path(tempfile.gettempdir()) / f"phasesweep-ray-{os.getuid()}"
    _auth.private_folder(folder, create)
    return folder


def _record(folder: Path) -> dict | None:
    """The state folder's ``instance.json`` (the folder already checked), or None."""
    try:
        return json.loads((folder / "instance.json").read_text())
    except (OSError, ValueError):
        return None


def _read() -> dict | None:
    folder = state_dir(create=False)
    info = _record(folder) if folder.is_dir() else None
    return info if info is not None and _alive(info) else None


def _alive(info: dict) -> bool:
    """Its session leader lives and its GCS accepts connections."""
    try:
        os.kill(int(info["pid"]), 0)
        host, port = info["address"].rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=2).close()
    except (OSError, KeyError, ValueError, TypeError):
        return False
    return True


def address() -> str | None:
    """``host:port`` of the running standing instance, or None."""
    info = _read()
    return None if info is None else info["address"]


@contextlib.contextmanager
def _locked(name: str):
    folder = state_dir()
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        os.close(fd)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def idle_minutes() -> float:
    """The idle time after which a new standing instance stops: ``$PHASESWEEP_STANDING_IDLE_MINUTES``,
    else :data:`IDLE_MINUTES`; anything but a finite number > 0 is a :class:`SpecError`."""
    text = os.environ.get(IDLE_ENV)
    if text is None:
        return IDLE_MINUTES
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SpecError(f"${IDLE_ENV}", text, "expected minutes, a number > 0", "environment")
    return value


def ensure(num_cpus: int | None = None) -> str:
    """The standing instance's address, starting it first if none runs (with token
    authentication, unless the caller's environment says ``RAY_AUTH_MODE=disabled``)."""
    idle = idle_minutes()
    found = address()
    if found:
        return found
    with _locked("start.lock") as folder:
        found = address()  # another launch may have started it while we waited
        if found:
            return found
        hold()  # from now on: the watchdog's idle clock must not run out while it starts
        # a stop signal waits till the start is recorded or cleaned up: stopped halfway, a
        # head that no instance.json names would run on till its watchdog stopped it
        with held_stop_signals():
            return _start(folder, idle, num_cpus)


def _start(folder: Path, idle: float, num_cpus: int | None) -> str:
    """Start the standing instance and record it in ``folder``'s ``instance.json`` (under
    the start lock, the caller's); its address."""
    port = _free_port()
    auth = _auth.DISABLED if _auth.disabled_by_user() else "token"
    env = _env(driver_env({"auth": auth}))
    private = os.path.dirname(_auth.private_temp_dir())  # Ray's temp folder: private/r
    command = [
        sys.executable, "-m", "phasesweep.pipeline.run._standing", "serve",
        "--port", str(port), "--private-dir", private, "--idle-minutes", str(idle),
        "--num-cpus", str(num_cpus or os.cpu_count() or 1),
    ]  # fmt: skip
    fd = os.open(folder / "standing.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    leader = subprocess.Popen(
        command, env=env, stdout=fd, stderr=subprocess.STDOUT, start_new_session=True
    )
    os.close(fd)  # the child keeps it
    info = {
        "address": f"127.0.0.1:{port}", "pid": leader.pid, "temp_dir": private, "auth": auth
    }  # fmt: skip
    try:
        _wait_joinable(info, leader, env)
    except BaseException:
        _kill_session(leader.pid)
        kill_running_from(private)
        shutil.rmtree(private, ignore_errors=True)
        raise
    tmp = folder / "instance.json.tmp"
    tmp.write_text(json.dumps(info))
    tmp.replace(folder / "instance.json")
    return info["address"]


def driver_env(info: dict | None = None) -> dict[str, str]:
    """Ray's settings for a driver of the standing instance ``info`` (default: the running
    one): loopback, and its token file, or ``RAY_AUTH_MODE=disabled`` for an instance
    started so (or by a version of phasesweep that recorded no ``auth``)."""
    info = _read() if info is None else info
    if info is not None and info.get("auth", _auth.DISABLED) == _auth.DISABLED:
        return {**_auth.token_env(None), **LOOPBACK}
    return {**_auth.token_env(_auth.token_file(state_dir())), **LOOPBACK}


def _wait_joinable(info: dict, leader: subprocess.Popen, env: dict[str, str]) -> None:
    """Until a driver can join (the GCS answers before the raylet has registered)."""
    deadline = time.monotonic() + START_TIMEOUT
    join = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False)"
    while time.monotonic() < deadline:
        if leader.poll() is not None:
            raise RuntimeError(
                f"the standing Ray exited with {leader.returncode}: see "
                f"{state_dir() / 'standing.log'}"
            )
        if _alive(info):
            done = subprocess.run(
                [sys.executable, "-c", join, info["address"]], env=env, capture_output=True
            )
            if done.returncode == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the standing Ray did not start within {START_TIMEOUT:.0f} s")


_held: list[int] = []  # the fd whose shared lock marks this process as a user


def hold() -> None:
    """Mark this process as a user of the standing instance until it exits (a shared
    ``flock`` the kernel releases on exit): the watchdog does not stop it meanwhile."""
    if not _held:
        fd = os.open(state_dir() / "in-use", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _held.append(fd)  # left open on purpose: the lock lives as long as the process


def stop() -> bool:
    """Stop the standing instance (its whole session); False when none was running."""
    if not state_dir(create=False).is_dir():
        return False
    with _locked("start.lock") as folder:
        info = _record(folder)
        if info is None:
            return False
        (folder / "instance.json").unlink(missing_ok=True)
        _kill_session(int(info["pid"]))
        if info.get("temp_dir"):  # with any process of it outside the session
            kill_running_from(info["temp_dir"])
            shutil.rmtree(info["temp_dir"], ignore_errors=True)
        return True


def session_pids(leader: int) -> list[int]:
    """Pids of the live processes (not zombies) of the session ``leader`` leads."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = _stat(proc)
            if int(fields[3]) == leader and fields[0] != "Z":  # field 6: the session id
                pids.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def running_from(folder: str, parent: int | None = None) -> list[int]:
    """Pids of the live processes (not zombies) but this one whose command line names
    ``folder`` (a private ``mkdtemp`` folder: only the Ray started in it runs from it),
    only the children of ``parent`` if given. Linux (``/proc``); elsewhere none."""
    me, mark = os.getpid(), os.fsencode(folder)
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(proc.name)
            if pid == me or mark not in (proc / "cmdline").read_bytes():
                continue
            state, ppid = _stat(proc)[:2]
            if state != "Z" and parent in (None, int(ppid)):
                pids.append(pid)
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return pids


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (it exists and is no zombie). Linux (``/proc``)."""
    try:
        return _stat(Path(f"/proc/{pid}"))[0] != "Z"
    except (OSError, IndexError):
        return False


def _stat(proc: Path) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the program's name: its state (``Z``: a
    zombie), parent, process group, session, ..."""
    return (proc / "stat").read_text().rsplit(")", 1)[1].split()


def kill_running_from(folder: str) -> None:
    """SIGKILL the processes running from ``folder`` (:func:`running_from`): Ray's agents
    outlive an interrupted start-up, and some a shutdown, by up to a minute, and would
    write into the folder after it was removed."""
    for pid in running_from(folder):
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to kill
            os.kill(pid, signal.SIGKILL)


def _kill_session(leader: int) -> None:
    """SIGKILL every process of the session ``leader`` leads, this one last if it is in it."""
    me = os.getpid()
    for pid in session_pids(leader):
        if pid != me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if leader != me:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(leader, 0)


def _serve(port: int, private_dir: str, idle_minutes: float, num_cpus: int) -> None:
    """The session leader: start the head (Ray's temp folder inside ``private_dir``), then
    watch for idleness, stop the session and remove ``private_dir``."""
    head = subprocess.Popen(
        [
            sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
            f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
            f"--num-cpus={num_cpus}", "--disable-usage-stats",
            f"--temp-dir={os.path.join(private_dir, 'r')}",
        ]
    )  # fmt: skip
    in_use = os.open(state_dir() / "in-use", os.O_RDWR | os.O_CREAT, 0o600)
    last_busy = time.monotonic()
    while head.poll() is None:
        try:
            fcntl.flock(in_use, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(in_use, fcntl.LOCK_UN)
        except OSError:
            last_busy = time.monotonic()
        if time.monotonic() - last_busy > idle_minutes * 60:
            break
        time.sleep(_POLL)
    with _locked("start.lock") as folder:
        if (_record(folder) or {}).get("pid") == os.getpid():
            (folder / "instance.json").unlink(missing_ok=True)
        _kill_session(os.getpid())
    shutil.rmtree(private_dir, ignore_errors=True)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m phasesweep.pipeline.run._standing")
    ap.add_argument("command", choices=["serve"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--private-dir", required=True)
    ap.add_argument("--idle-minutes", type=float, required=True)
    ap.add_argument("--num-cpus", type=int, required=True)
    a = ap.parse_args()
    _serve(a.port, a.private_dir, a.idle_minutes, a.num_cpus)
