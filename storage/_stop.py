"""Stop markers: how an interrupted launch tells its trials, wherever they run, to
checkpoint and end. A marker is an empty file ``claims/sweep=NAME/stop-LAUNCH`` beside
the claims; the launch writes it on SIGINT and removes it when it ends."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from phasesweep.storage._store import Store, check_sweep


@dataclass(frozen=True)
class StopMarker:
    """The stop marker of one launch of a sweep."""

    store: Store
    path: str

    @classmethod
    def of(cls, store: Store, sweep: str, launch_id: str) -> StopMarker:
        check_sweep(sweep)
        return cls(store, f"{store.root}/claims/sweep={sweep}/stop-{launch_id}")

    def set(self) -> None:
        """Write the marker: the launch was interrupted."""
        self.store.put(self.path, b"")

    def is_set(self) -> bool:
        return self.store.fs.exists(self.path)

    def clear(self) -> None:
        """Remove the marker (the launch ends); nothing where there is none."""
        with contextlib.suppress(FileNotFoundError):
            self.store.fs.rm_file(self.path)
