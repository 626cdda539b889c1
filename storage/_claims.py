"""Claims: which trial trains which points right now, so that no point trains twice.

Any number of launches of one sweep may run at once (on one machine or many), and they
need not pack the grid into the same chunks (an extended grid, another chunk size or
number of trials). Before a trial trains, it claims its points in the store; it trains
only the points it got, re-reads which of them are stored after claiming, and releases
its claim after its commit. A claim costs a few file operations per trial, whatever its
number of points. Layout under the store root, per sweep and group (the points whose
chunks share a group tag, :func:`pipeline.grid._groups.group_tag`; a point is always claimed
in its group)::

    claims/sweep={name}/group={tag}/lock.{gen}          the group's lock, generation gen
    claims/sweep={name}/group={tag}/lease-{lease}.json  one per trial attempt: holder,
                                                         expiry, the run ids it holds
    claims/sweep={name}/group={tag}/revoked-{lease}     a lease taken over after it expired

Protocol:

- A lease is live while its file exists, no ``revoked-`` marker names it, its
  ``expires`` (UTC epoch seconds) is in the future, and — when the holder runs on this
  host — its process is still alive (so a SIGKILLed holder on this machine is taken
  over at once; elsewhere after the TTL). The holder renews it every ``ttl / 3``
  seconds (:class:`Renewer`) while it trains.
- Claiming happens under the group's lock: the claimer reads every lease of the group,
  takes the points of its request that no live lease holds, and writes its lease. Dead
  leases it meets are revoked (marker first, then the file is removed), so that a holder
  that only stalled learns it lost its points (:meth:`Lease.owned`) and cannot make its
  lease live again by renewing it.
- The lock is mutual exclusion by generations: the holder of the lock is the creator of
  the highest ``lock.{gen}``, created exclusively (a hard link of a complete temp file on
  a local disk, a conditional PUT ``If-None-Match: *`` on S3) after reading that the
  previous generation was released or its holder dead. A creator that finds a higher
  generation after creating its own (its listing was stale) backs off. The highest
  generation is never removed (release rewrites it as released), so generations only
  grow; older ones are removed by the next holder.
- Release removes the lease and its marker. A relaunch finds only the group's released
  lock file of a finished sweep.

Limits: expiry compares wall clocks, so hosts' clocks must agree to well within the
TTL. A holder that stalls longer than the TTL (e.g. a paused VM) can lose its points to
another launch while still training; it checks :meth:`Lease.owned` before committing and
drops them, so only a stall in the moment between that check and the commit can store a
point twice — and the catalog shows the earliest copy of a run. Likewise a lock holder
stalled past :data:`LOCK_TTL` inside its few-millisecond critical section.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem
from phasesweep.storage._store import Store

#: Default lease lifetime (seconds) without a renewal; overridable with ``$PHASESWEEP_LEASE_TTL``.
LEASE_TTL = 60.0

#: Lifetime (seconds) of a group lock whose holder does not release it: its holder only
#: reads the group's leases and writes its own while it holds it.
LOCK_TTL = 30.0

#: Longest wait (seconds) for a group's lock before :meth:`Claims.acquire` gives up.
LOCK_WAIT = 600.0

#: The group of a claim made without one.
ALL = "all"


def lease_ttl() -> float:
    """The lease TTL in seconds: ``$PHASESWEEP_LEASE_TTL`` or :data:`LEASE_TTL`."""
    return float(os.environ.get("PHASESWEEP_LEASE_TTL") or LEASE_TTL)


def _process_start(pid: int) -> str | None:
    """An id of process ``pid``'s incarnation (its start time in clock ticks on Linux), or
    None when no such process exists: a reused pid gets a different value."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    try:  # no /proc: existence only
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "alive"


def create_exclusive(fs: AbstractFileSystem, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True if this call created it.

    Readers never see a partial file: locally the complete file is hard-linked to its
    name (``link`` fails if the name exists); on S3 one conditional PUT with
    ``If-None-Match: *`` (S3 and compatible servers answer 412 when the key exists).
    """
    if isinstance(fs, LocalFileSystem):
        directory = posixpath.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{directory}/.{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True
    try:
        fs.pipe_file(path, data, mode="create")  # s3fs: PUT with If-None-Match: *
    except FileExistsError:  # s3fs: 412 Precondition Failed on If-None-Match
        return False
    return True


def _holder_body(holder: str, ttl: float, **extra: object) -> dict:
    pid = os.getpid()
    return {
        "holder": holder,
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start": _process_start(pid),
        "expires": time.time() + ttl,
        **extra,
    }


def _alive(body: dict | None, now: float, host: str) -> bool:
    """Whether a lease or lock body is live: unexpired, and its process alive where it
    ran on this host."""
    if not body or body.get("released") or body.get("expires", 0) <= now:
        return False
    return body.get("host") != host or _process_start(body["pid"]) == body.get("pid_start")


@dataclass
class Lease:
    """One trial attempt's lease on the points it claimed (see the module docstring)."""

    claims: Claims
    lease_id: str
    run_ids: set[str]
    holder: str = ""

    def renew(self) -> None:
        """Push the expiry ``ttl`` seconds into the future, unless the lease was revoked."""
        if not self.claims._revoked(self.lease_id):
            self.claims._write_lease(self.lease_id, self.holder, self.run_ids)

    def owned(self) -> set[str]:
        """The claimed run ids this lease still holds: all of them, or none once it was
        revoked (taken over after it expired)."""
        return set() if self.claims._revoked(self.lease_id) else set(self.run_ids)

    def release(self) -> None:
        """Remove this lease and its revocation marker."""
        fs = self.claims.store.fs
        for path in (self.claims.lease_path(self.lease_id), self.claims._marker(self.lease_id)):
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)


class Claims:
    """The claims of one sweep's group in ``store``; ``ttl``: lease lifetime in seconds.

    ``group``: the group tag of the points claimed (:func:`pipeline.grid._groups.group_tag`);
    every claim of a point must name the same group.
    """

    def __init__(
        self, store: Store, sweep: str, ttl: float | None = None, group: str = ALL
    ) -> None:
        self.store, self.sweep, self.group = store, sweep, group
        self.ttl = lease_ttl() if ttl is None else ttl
        self.dir = f"{store.root}/claims/sweep={sweep}/group={group}"

    def acquire(self, run_ids: Iterable[str], holder: str = "") -> tuple[Lease, set[str]]:
        """Claim the free points of ``run_ids`` under a new lease.

        Returns the lease (holding the points this call got) and the run ids that a
        live lease of someone else holds. ``holder``: free text stored in the lease
        (e.g. the launch and trial). Waits for the group's lock at most
        :data:`LOCK_WAIT` seconds (``TimeoutError``).
        """
        wanted = set(run_ids)
        lease_id = uuid.uuid4().hex[:16]
        with self._locked():
            held = self._held(clean=True)
            busy = wanted & held
            got = wanted - held
            self._write_lease(lease_id, holder, got)
        return Lease(self, lease_id, got, holder), busy

    def held(self, run_ids: Iterable[str]) -> set[str]:
        """The run ids of ``run_ids`` that a live lease holds right now."""
        return set(run_ids) & self._held(clean=False)

    # -- files ------------------------------------------------------------------------
    def lease_path(self, lease_id: str) -> str:
        """The store path of a lease's file (JSON: holder, host, pid, expiry, run ids)."""
        return f"{self.dir}/lease-{lease_id}.json"

    def _marker(self, lease_id: str) -> str:
        return f"{self.dir}/revoked-{lease_id}"

    def _lock(self, gen: int) -> str:
        return f"{self.dir}/lock.{gen}"

    def _names(self) -> list[str]:
        try:
            return [posixpath.basename(p) for p in self.store.fs.ls(self.dir, detail=False)]
        except FileNotFoundError:
            return []

    def _read_json(self, path: str) -> dict | None:
        try:
            return json.loads(self.store.fs.cat_file(path))
        except (FileNotFoundError, ValueError):  # gone, or a torn write of a dead writer
            return None

    def _write_lease(self, lease_id: str, holder: str, run_ids: set[str]) -> None:
        body = _holder_body(holder, self.ttl, run_ids=sorted(run_ids))
        self.store.put(self.lease_path(lease_id), json.dumps(body).encode())

    def _revoked(self, lease_id: str) -> bool:
        return self.store.fs.exists(self._marker(lease_id))

    def _held(self, clean: bool) -> set[str]:
        """The run ids that live leases of the group hold. ``clean`` (under the lock):
        revoke and remove the dead leases met on the way."""
        names = self._names()
        revoked = {n.removeprefix("revoked-") for n in names if n.startswith("revoked-")}
        leases = [n[len("lease-") : -len(".json")] for n in names if n.startswith("lease-")]
        paths = [self.lease_path(lid) for lid in leases]
        now, host = time.time(), socket.gethostname()
        held: set[str] = set()
        for lease_id, path, blob in zip(leases, paths, self.store.read_files(paths), strict=True):
            try:
                body = json.loads(blob) if isinstance(blob, bytes) else None
            except ValueError:
                body = None
            if lease_id not in revoked and _alive(body, now, host):
                held.update(body["run_ids"])
            elif clean and not isinstance(blob, FileNotFoundError):
                if lease_id not in revoked:
                    self.store.put(self._marker(lease_id), b"")
                with contextlib.suppress(FileNotFoundError):
                    self.store.fs.rm_file(path)
        return held

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the group's lock (see the module docstring) for the ``with`` block."""
        gen = self._take_lock()
        try:
            yield
        finally:
            body = _holder_body("", 0.0, released=True)
            self.store.put(self._lock(gen), json.dumps(body).encode())

    def _take_lock(self) -> int:
        deadline = time.monotonic() + LOCK_WAIT
        pause = 0.005
        while True:
            gens = self._lock_gens()
            top = gens[-1] if gens else -1
            free = top < 0 or not _alive(
                self._read_json(self._lock(top)), time.time(), socket.gethostname()
            )
            if free:
                body = json.dumps(_holder_body(f"claims of {self.dir}", LOCK_TTL)).encode()
                if create_exclusive(self.store.fs, self._lock(top + 1), body):
                    if max(self._lock_gens()) == top + 1:
                        for old in gens[:-1]:  # the previous holder's stays: it may be reading it
                            with contextlib.suppress(FileNotFoundError):
                                self.store.fs.rm_file(self._lock(old))
                        return top + 1
                    # a stale listing: someone holds a newer generation; ours never held
                    released = json.dumps(_holder_body("", 0.0, released=True)).encode()
                    self.store.put(self._lock(top + 1), released)
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"no lock on {self.dir} within {LOCK_WAIT:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _lock_gens(self) -> list[int]:
        return sorted(
            int(n[len("lock.") :])
            for n in self._names()
            if n.startswith("lock.") and n[len("lock.") :].isdigit()
        )


class Renewer:
    """Context manager: renews ``lease`` every ``ttl / 3`` seconds in a daemon thread."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="lease-renewer")

    def _loop(self) -> None:
        while not self._stop.wait(self.lease.claims.ttl / 3):
            with contextlib.suppress(OSError):  # a missed renewal is retried; the TTL has slack
                self.lease.renew()

    def __enter__(self) -> Renewer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
