"""Work spread over worker processes that are fresh interpreters: ``Workers(n).map(f, items)``.

Each worker is ``python -m phasesweep.analysis._workers``: it reads pickled calls
``(f, item)`` from its standard input and writes each pickled result (or the exception
it raised) to its standard output, in order. A fresh interpreter, not
``multiprocessing``: a fork of a process that holds DuckDB's and Arrow's threads can
deadlock, and multiprocessing's ``spawn`` runs the caller's main script again in every
worker (a script without ``if __name__ == "__main__"`` would start its work anew there).
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

_LENGTH = struct.Struct("<Q")


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    (n,) = _LENGTH.unpack(head)
    return pickle.loads(stream.read(n))


class WorkerError(RuntimeError):
    """A worker process died (its exit code is in the message)."""


class Workers:
    """``n`` worker processes; :meth:`map` spreads calls over them. A context manager:
    leaving it ends the workers (at once after an error)."""

    def __init__(self, n: int):
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-m", "phasesweep.analysis._workers"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            for _ in range(n)
        ]

    def map(self, f: Callable[..., Any], items: Iterable[tuple]) -> Iterator[Any]:
        """``f(*item)`` of every item, in order; item ``i`` goes to worker ``i mod n``,
        which holds at most one at a time (so ``n`` are computed while the next one is
        taken from ``items``). An exception raised by ``f`` is raised here."""
        pending: deque[subprocess.Popen] = deque()
        for i, item in enumerate(items):
            proc = self.procs[i % len(self.procs)]
            if len(pending) == len(self.procs):
                yield self._result(pending.popleft())
            _send(proc.stdin, (f, item))
            pending.append(proc)
        while pending:
            yield self._result(pending.popleft())

    def _result(self, proc: subprocess.Popen) -> Any:
        try:
            ok, value = _receive(proc.stdout)
        except EOFError:
            raise WorkerError(f"a worker process died (exit code {proc.wait()})") from None
        if not ok:
            raise value
        return value

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind, *exc) -> None:
        for proc in self.procs:
            if kind is not None:
                proc.kill()
            else:
                proc.stdin.close()
        for proc in self.procs:
            proc.wait()
            proc.stdout.close()
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()


def _serve() -> None:
    """The worker's loop (see the module docstring)."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the work prints goes to stderr, not into the results
    stdin = sys.stdin.buffer
    while True:
        try:
            f, item = _receive(stdin)
        except EOFError:
            return
        try:
            result = (True, f(*item))
        except Exception as e:  # sent back, raised in the caller
            result = (False, e)
        _send(out, result)


if __name__ == "__main__":
    _serve()
