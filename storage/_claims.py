"""Claims: which trial trains which points right now, so that no point trains twice.

Any number of launches of one sweep may run at once (on one machine or many). Before a
trial trains, it claims its points in the store; it trains only the points it got,
re-reads the store's done run ids after claiming, and releases its claims after its
commit. Layout under the store root::

    claims/sweep={name}/leases/{lease}.json    one per trial attempt: holder, expiry
    claims/sweep={name}/points/{run_id}.{gen}  one per claim of a point; holds the lease id

Protocol:

- A lease is live while its file exists, its ``expires`` (UTC epoch seconds) is in the
  future, and — when the holder runs on this host — its process is still alive (so a
  SIGKILLed holder on this machine is taken over at once; elsewhere after the TTL). The
  holder renews it every ``ttl / 3`` seconds (:class:`Renewer`) while it trains.
- The owner of a point is the lease named by its claim of the highest generation. A
  point is free when it has no claim or its owner's lease is dead. Claiming a free point
  creates the next generation *exclusively*: a hard link of a complete temp file on a
  local disk (fails if the name exists), a conditional PUT (``If-None-Match: *``) on S3.
  Generations are created in order, so of two launches racing for a point exactly one
  gets it.
- Release deletes the holder's claim files (its own generation first, then the older
  ones) and its lease. A relaunch finds nothing of a finished trial.

Limits: expiry compares wall clocks, so hosts' clocks must agree to well within the
TTL. A holder that stalls longer than the TTL (e.g. a paused VM) can lose its points to
another launch while still training; it checks ownership (:meth:`Lease.owned`) before
committing and drops what it lost, so only a stall in the moment between that check and
the commit can store a point twice — and the catalog shows the earliest copy of a run.
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
from collections.abc import Iterable
from dataclasses import dataclass

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem
from phasesweep.storage._store import Store

#: Default lease lifetime (seconds) without a renewal; overridable with ``$PHASESWEEP_LEASE_TTL``.
LEASE_TTL = 60.0


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


@dataclass
class Lease:
    """One trial attempt's lease on the points it claimed (see the module docstring)."""

    claims: Claims
    lease_id: str
    run_ids: set[str]

    def renew(self) -> None:
        """Push the expiry ``ttl`` seconds into the future."""
        self.claims._write_lease(self.lease_id)

    def owned(self) -> set[str]:
        """The claimed run ids whose newest claim is still this lease's."""
        current = self.claims._owners(self.run_ids)
        return {r for r in self.run_ids if current.get(r, (None, None))[1] == self.lease_id}

    def release(self) -> None:
        """Delete this lease's claims (and older generations of them) and the lease."""
        fs = self.claims.store.fs
        for run_id, gens in self.claims._generations(self.run_ids).items():
            mine = [
                g for g in gens if self.claims._read(self.claims._point(run_id, g)) == self.lease_id
            ]
            if not mine:
                continue
            for g in sorted((g for g in gens if g <= max(mine)), reverse=True):
                with contextlib.suppress(FileNotFoundError):
                    fs.rm_file(self.claims._point(run_id, g))
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(self.claims.lease_path(self.lease_id))


class Claims:
    """The claims of one sweep in ``store``; ``ttl``: lease lifetime in seconds."""

    def __init__(self, store: Store, sweep: str, ttl: float | None = None) -> None:
        self.store, self.sweep = store, sweep
        self.ttl = lease_ttl() if ttl is None else ttl
        self.dir = f"{store.root}/claims/sweep={sweep}"

    def acquire(self, run_ids: Iterable[str], holder: str = "") -> tuple[Lease, set[str]]:
        """Claim the free points of ``run_ids`` under a new lease.

        Returns the lease (holding the points this call got) and the run ids that a
        live lease of someone else holds (or that another launch claimed first).
        ``holder``: free text stored in the lease (e.g. the launch and trial).
        """
        run_ids = list(dict.fromkeys(run_ids))
        lease_id = uuid.uuid4().hex[:16]
        self._write_lease(lease_id, holder)
        owners = self._owners(run_ids)
        alive = self._alive({lid for _, lid in owners.values()})
        got, busy = set(), set()
        for run_id in run_ids:
            gen, owner = owners.get(run_id, (-1, None))
            if owner is not None and alive.get(owner, False):
                busy.add(run_id)
            elif create_exclusive(self.store.fs, self._point(run_id, gen + 1), lease_id.encode()):
                got.add(run_id)
            else:
                busy.add(run_id)
        return Lease(self, lease_id, got), busy

    def held(self, run_ids: Iterable[str]) -> set[str]:
        """The run ids of ``run_ids`` that a live lease holds right now."""
        owners = self._owners(run_ids)
        alive = self._alive({lid for _, lid in owners.values()})
        return {r for r, (_, lid) in owners.items() if alive.get(lid, False)}

    # -- files ------------------------------------------------------------------------
    def lease_path(self, lease_id: str) -> str:
        """The store path of a lease's file (JSON: holder, host, pid, expiry)."""
        return f"{self.dir}/leases/{lease_id}.json"

    def _point(self, run_id: str, gen: int) -> str:
        return f"{self.dir}/points/{run_id}.{gen}"

    def _write_lease(self, lease_id: str, holder: str | None = None) -> None:
        pid = os.getpid()
        body = {
            "holder": holder or "",
            "host": socket.gethostname(),
            "pid": pid,
            "pid_start": _process_start(pid),
            "expires": time.time() + self.ttl,
        }
        self.store.put(self.lease_path(lease_id), json.dumps(body).encode())

    def _read(self, path: str) -> str | None:
        try:
            return self.store.fs.cat_file(path).decode()
        except FileNotFoundError:
            return None

    def _generations(self, run_ids: Iterable[str]) -> dict[str, list[int]]:
        """Claim generations present per run id (only run ids with claims)."""
        wanted = set(run_ids)
        try:
            names = self.store.fs.ls(f"{self.dir}/points", detail=False)
        except FileNotFoundError:
            return {}
        gens: dict[str, list[int]] = {}
        for name in names:
            run_id, _, gen = posixpath.basename(name).rpartition(".")
            if run_id in wanted and gen.isdigit():
                gens.setdefault(run_id, []).append(int(gen))
        return gens

    def _owners(self, run_ids: Iterable[str]) -> dict[str, tuple[int, str | None]]:
        """Per claimed run id: its newest generation and the lease id that claim names."""
        newest = {r: max(g) for r, g in self._generations(run_ids).items()}
        paths = [self._point(r, g) for r, g in newest.items()]
        out = {}
        for (run_id, gen), blob in zip(newest.items(), self.store.read_files(paths), strict=True):
            out[run_id] = (gen, blob.decode() if isinstance(blob, bytes) and blob else None)
        return out

    def _alive(self, lease_ids: set[str | None]) -> dict[str, bool]:
        """Which of ``lease_ids`` are live (see the module docstring)."""
        ids = sorted(i for i in lease_ids if i)
        blobs = self.store.read_files([self.lease_path(i) for i in ids])
        now, host = time.time(), socket.gethostname()
        alive = {}
        for lease_id, blob in zip(ids, blobs, strict=True):
            blob = blob if isinstance(blob, bytes) else None  # gone or unreadable: not live
            try:
                body = json.loads(blob) if blob else None
            except ValueError:
                body = None
            ok = bool(body) and body["expires"] > now
            if ok and body["host"] == host:
                ok = _process_start(body["pid"]) == body["pid_start"]
            alive[lease_id] = ok
        return alive


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
