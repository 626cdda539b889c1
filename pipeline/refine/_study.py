"""The study's storage: the Optuna journal of a refinement in the store, the lock around
asking, and whether the process that owns a trial is alive.

The study (one per metric, level and axis) is an append-only journal,
``refine/sweep=<child>/journal.log``. On an object store it is copied to a local file at
the start and written back after every ask and every tell (:func:`open_study`'s ``sync``).

Trials record their owner process (:func:`owner_id`). A process that asks holds a lock
file beside the journal (local stores), so two refines of one sweep never propose the
same point; a trial whose owner died on this host (:func:`owner_alive`) is adopted by
the next refine. On an object store there is no lock: run one refine per sweep at a time
there. An owner on another host is taken to be alive (it cannot be checked from here).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from phasesweep.storage import Store


def owner_id() -> str:
    """This process, as trials record their owner: host, pid and start time."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def _start_ticks(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), '' elsewhere: with the
    pid it names a process uniquely, pid reuse included."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_alive(owner: str | None) -> bool:
    """Whether the process that owns a trial may still be running.

    An owner on this host is alive iff a process with its pid and start time exists; an
    owner on another host is assumed alive (it cannot be checked from here).
    """
    if not owner:
        return False
    host, pid, ticks = owner.rsplit(":", 2)
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not ticks or _start_ticks(int(pid)) == ticks


@contextlib.contextmanager
def open_study(
    store: Store, child: str, name: str, sampler: optuna.samplers.BaseSampler
) -> Iterator[tuple[optuna.Study, Callable[[], Any], Callable[[], None]]]:
    """(study, lock, sync): the study ``name`` on the journal of the refinement sweep
    ``child`` in ``store``, asking with ``sampler``; ``lock()`` is a context manager
    around asking, ``sync()`` writes the journal back (object stores). Creates the
    journal's directory (local) or a temporary copy (object stores)."""
    journal = f"refine/sweep={child}/journal.log"
    tmp = None
    path = store.local_path(journal)
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="phasesweep-refine-")
        path = os.path.join(tmp, "journal.log")
        store.download(journal, path)

    def sync() -> None:
        if tmp is not None:
            store.upload(path, journal)

    @contextlib.contextmanager
    def lock() -> Iterator[None]:
        guard = JournalFileOpenLock(path + ".ask")
        guard.acquire()
        try:
            yield
        finally:
            guard.release()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, sampler=sampler, load_if_exists=True
        )
        yield study, lock, sync
    finally:
        sync()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
