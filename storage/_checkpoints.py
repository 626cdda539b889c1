"""Checkpoints of chunks in training: the whole ensemble's state, kept in the store so that
whoever trains the same points next resumes from it (:mod:`pipeline.run._trial`).

Layout: ``checkpoints/sweep=NAME/CHUNK-MEMBERS.pt``, keyed by the chunk id and a hash
of the exact set of run ids it trains (a checkpoint of other points is never found).
The bytes are the trainer's (``torch.save``); the store neither reads nor checks them.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from phasesweep.storage._store import Store, check_sweep


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint of one chunk's training of exactly ``run_ids`` (see the module)."""

    store: Store
    path: str

    @classmethod
    def of(cls, store: Store, sweep: str, chunk_id: str, run_ids: Sequence[str]) -> Checkpoint:
        """Where a trial checkpoints the training of exactly these points of a chunk."""
        check_sweep(sweep)
        members = hashlib.sha256(",".join(sorted(run_ids)).encode()).hexdigest()[:12]
        return cls(store, f"{store.root}/checkpoints/sweep={sweep}/{chunk_id}-{members}.pt")

    @staticmethod
    def count(store: Store, sweep: str | None = None) -> int:
        """How many chunks of ``sweep`` (default: of every sweep) have a checkpoint: the
        training a relaunch resumes (``phasesweep status`` says so)."""
        if sweep is not None:
            check_sweep(sweep)
        found = store.fs.glob(f"{store.root}/checkpoints/sweep={sweep or '*'}/*.pt")
        return len(found)

    def read(self) -> bytes | None:
        """The checkpoint's bytes, or None where there is none."""
        try:
            return self.store.fs.cat_file(self.path)
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> None:
        """Replace the checkpoint with ``data``, atomically (``Store.put``)."""
        self.store.put(self.path, data)

    def remove(self) -> None:
        """Remove the checkpoint (its points are committed); nothing where there is none."""
        with contextlib.suppress(FileNotFoundError):
            self.store.fs.rm_file(self.path)
