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

import atexit
import contextlib
import os
import signal
import sys
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


def take_sigterm_as_interrupt() -> None:
    """From now on this process takes SIGTERM as it takes Ctrl-C: the handler is
    :func:`raise_interrupted`, and an :class:`Interrupted` that no code catches ends the
    process by its signal, as Python ends one by SIGINT for an uncaught
    ``KeyboardInterrupt`` (a shell reports 143 for SIGTERM, 130 for a second Ctrl-C).
    Python itself exits 1 for any subclass of ``KeyboardInterrupt``, so a script stopped
    outside a launch by SIGTERM looked to its scheduler like a failure.

    Process-wide, as signal handlers are, and in the main thread only (the only one
    Python runs them in); not at an interactive prompt (``python -i``, the REPL), where
    the session goes on as after Ctrl-C. Cost of the exit by signal: the exit hooks
    (``atexit``: Ray's shutdown, the embedded Ray's folder) run before the process kills
    itself, and standard output and error are flushed, but the rest of Python's
    finalization does not run: a file the script left open and unflushed loses its
    buffer, as it would under SIGTERM's default action.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, raise_interrupted)
    if not isinstance(sys.excepthook, _ExitBySignal):
        sys.excepthook = _ExitBySignal(sys.excepthook)


class _ExitBySignal:
    """``sys.excepthook`` for :func:`take_sigterm_as_interrupt`: the hook it wraps shows
    the exception; an :class:`Interrupted` then runs the exit hooks and ends the process
    by its signal, with the signal's default action."""

    def __init__(self, shown: Callable[..., object]) -> None:
        self.shown = shown

    def __call__(self, kind: type[BaseException], error: BaseException, tb: object) -> None:
        self.shown(kind, error, tb)
        if not isinstance(error, Interrupted) or hasattr(sys, "ps1") or sys.flags.interactive:
            return  # at an interactive prompt the session goes on, as after Ctrl-C
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        signal.signal(error.signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [error.signum])
        os.kill(os.getpid(), error.signum)
        os._exit(128 + error.signum)  # only if the signal did not end the process


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


@contextlib.contextmanager
def held_stop_signals() -> Iterator[None]:
    """Hold a stop signal that comes during the block and deliver it after the block, to
    the handler there was before (:class:`Interrupted` for the default one, nothing for
    SIG_IGN); a second one raises :class:`Interrupted` at once. For a step that a stop
    must not cut in two: a started Ray its caller has not yet recorded would be left
    running with nothing that names it. The handler is called, not the signal re-sent: a
    Ray start-up may leave SIGINT blocked in this thread."""
    held: list[signal.Signals] = []
    with on_stop_signals(held.append):
        yield
    if not held:
        return
    (signum,) = held
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        raise Interrupted(signum)
