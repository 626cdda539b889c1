"""Stop signals: how a launch takes Ctrl-C (SIGINT) and SIGTERM (``kill``, ``timeout``,
``ray job stop``, a batch scheduler's or Kubernetes' stop).

Both are taken alike: the first asks the work to stop cleanly (a launch's trials
checkpoint their chunks and end, nothing is marked failed), a second ends it at once
with :class:`Interrupted`. So a launch that a scheduler stops keeps the training of its
running chunks up to the stop, not only up to their last periodic checkpoint (up to
``execution.commit_every_seconds`` earlier). The exit status tells the two apart:
128 + the signal's number (130, 143), as a shell reports a process the signal killed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

#: The signals that stop a launch.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """Work ended by a stop signal: a second one; one outside training (SIGTERM, where
    Python would raise ``KeyboardInterrupt`` for Ctrl-C); or the one that stopped a
    launch that more work was to follow (a refine's batch, the gallery's sweep). A
    ``KeyboardInterrupt``, so code that handles Ctrl-C handles it too; ``signum``: which
    signal (one of :data:`STOP_SIGNALS`)."""

    def __init__(self, signum: int) -> None:
        self.signum = signal.Signals(signum)
        super().__init__(self.signum.name)


def raise_interrupted(signum: int, frame: object) -> None:
    """A signal handler that raises :class:`Interrupted`: SIGTERM's counterpart of
    Python's own Ctrl-C handler, which raises ``KeyboardInterrupt``, so that the work
    unwinds (its ``finally`` blocks and exit hooks run) wherever the signal comes."""
    raise Interrupted(signum)


@contextlib.contextmanager
def on_stop_signals(first: Callable[[signal.Signals], None]) -> Iterator[None]:
    """While the block runs, the first SIGINT or SIGTERM calls ``first(signum)`` and a
    second one of either raises :class:`Interrupted`; the handlers there were before come
    back after the block. This overrides a handler the process inherited, SIG_IGN too: a
    launch started in the background of a script takes ``kill -INT`` while it trains.

    Only in the main thread, the only one Python runs signal handlers in: elsewhere the
    block runs with the handlers the process has.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if seen:
            raise Interrupted(signum)
        seen.append(signum)
        first(signal.Signals(signum))

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, before in previous.items():
            # None: a handler installed outside Python, which cannot be put back
            signal.signal(s, signal.SIG_DFL if before is None else before)
