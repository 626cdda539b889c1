"""The launch's progress: points done, member-steps trained, their rate and the ETA.

Where it goes decides how it looks: a bar redrawn in place on a terminal, a widget in a
Jupyter notebook (ipywidgets), and anywhere else (a log file, a pipe, CI) a plain line
every :func:`line_every` seconds and one at the end, never a carriage return.

The rate is that of the member-steps seen trained: from the trials' progress reports,
each chunk's first report its baseline, so the start-up of Ray and of each trial and
work resumed from a checkpoint do not count. The rate and the ETA (member-steps left /
rate) show once reports have come for :data:`RATE_AFTER` seconds; before, "?".
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

#: Seconds of progress reports before a rate (and an ETA) is shown.
RATE_AFTER = 4.0
#: Default seconds between plain progress lines (off a terminal).
LINE_EVERY = 30.0
#: Environment variable that sets the seconds between plain progress lines.
LINE_EVERY_ENV = "PHASESWEEP_PROGRESS_EVERY"

_UNIT = " member-steps"
_STATE = "{desc} {percentage:3.0f}%"
_COUNT = "{n_fmt}/{total_fmt} member-steps"
#: Layouts (tqdm ``bar_format``) of a terminal's bar, a notebook's (tqdm.notebook splits
#: it at ``{bar}``) and a line, each ending in :func:`_times`. A terminal's bar fills the
#: terminal's width; on a narrow one the count loses its unit (the rate keeps it) and then
#: the description its end (see :func:`_fit`), so that the time left and the rate, at the
#: end of the line, are never cut off.
_BAR = f"{_STATE}|{{bar}}| {_COUNT} "
_NARROW_BAR = f"{_STATE}|{{bar}}| {{n_fmt}}/{{total_fmt}} "
_WIDGET = f"{_STATE}|{{bar}}| {_COUNT} "
_LINE = f"{_STATE} {_COUNT} "
#: Columns of the narrowest bar drawn beside a whole description.
_MIN_BAR = 10


def _times(rate: float | None) -> str:
    """Elapsed, ETA and rate; "?" for the last two without a rate (tqdm's own would be
    member-steps / elapsed, start-up included)."""
    return "[{elapsed}<{remaining}, {rate_fmt}]" if rate else f"[{{elapsed}}<?, ?{_UNIT}/s]"


def line_every() -> float:
    """Seconds between plain progress lines: ``$PHASESWEEP_PROGRESS_EVERY`` if it is a
    number > 0, else :data:`LINE_EVERY`."""
    try:
        every = float(os.environ.get(LINE_EVERY_ENV, ""))
    except ValueError:
        return LINE_EVERY
    return every if math.isfinite(every) and every > 0 else LINE_EVERY


class Progress:
    """The progress of a launch: member-steps trained (rate and ETA from those), points
    done, on a bar, a notebook widget or plain lines (see the module docstring).

    Trials report the member-steps of their chunk every
    :data:`~phasesweep.pipeline.run._trial.PROGRESS_EVERY` seconds, so it moves during a
    chunk, not only at its end. ``sizes[i]``: chunk i's (members, steps per member).
    ``stream``: where the bar or the lines go (default ``sys.stderr``); ``clock``: seconds
    (default ``time.monotonic``).
    """

    def __init__(
        self,
        sweep: str,
        sizes: Sequence[tuple[int, int]],
        done: int,
        total: int,
        enabled: bool,
        *,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.point_steps = [steps for _, steps in sizes]
        self.work = sum(members * steps for members, steps in sizes)
        self.live: dict[int, int] = {}  # chunk -> member-steps of its running trial
        self.credited = [0] * len(sizes)  # chunk -> its points known to be done
        self.other = 0  # points done otherwise (failed after retries)
        self.skipped, self.total, self.sweep = done, total, sweep
        self.text = ""
        self.trained = 0  # member-steps seen trained since each chunk's first report
        self.first: float | None = None  # when the first report came
        self.clock = clock
        self.started = self.last_line = clock()
        self.stream = sys.stderr if stream is None else stream
        self.every = line_every()
        self.rate_after = RATE_AFTER  # seconds of reports before a rate shows (0 at the end)
        self.bar = _bar(self, enabled)
        self.lines = enabled and self.bar is None
        self.note("")

    def __getstate__(self) -> dict:
        """A copy that shows nothing (Tune pickles its callbacks, and this with them; a
        bar, a widget or a stream need not pickle)."""
        return {**self.__dict__, "bar": None, "lines": False, "stream": None}

    def rate(self) -> float | None:
        """Member-steps per second trained, once reports have come for
        :data:`RATE_AFTER` seconds (at the end: for any time); else None."""
        if self.first is None or self.trained == 0:
            return None
        seconds = self.clock() - self.first
        return self.trained / seconds if seconds >= self.rate_after and seconds > 0 else None

    @property
    def n(self) -> int:
        """Member-steps done: of the points stored, and of the running trials."""
        stored = sum(c * s for c, s in zip(self.credited, self.point_steps))
        return stored + sum(self.live.values())

    def running(self, chunk: int, member_steps: int) -> None:
        """A trial's progress report: member-steps of ``chunk`` trained so far."""
        if self.first is None:
            self.first = self.clock()
        # a chunk's first report is its baseline; a retried trial starts lower again
        self.trained += max(0, member_steps - self.live.get(chunk, member_steps))
        self.live[chunk] = member_steps
        self._show()

    def finished(self, chunk: int, done: int) -> None:
        """A trial ended with ``done`` points of ``chunk`` stored (by it or others)."""
        self.live.pop(chunk, None)
        self.credited[chunk] = max(self.credited[chunk], done)
        self._show()

    def points(self, n: int) -> None:
        """``n`` points ended otherwise (failed after retries)."""
        self.other += n
        self._show()

    def note(self, text: str) -> None:
        """Show points done (and ``text``) beside the progress; a new text at once."""
        news = bool(text) and text != self.text
        self.text = text
        self._show(now=news)

    def describe(self) -> str:
        """``SWEEP: DONE/TOTAL points`` (and the note)."""
        done = self.skipped + sum(self.credited) + self.other
        note = f" ({self.text})" if self.text else ""
        return f"{self.sweep}: {done}/{self.total} points{note}"

    def line(self, layout: str | None = None) -> str:
        """The progress as one line of text (``layout``: a tqdm ``bar_format``)."""
        from tqdm import tqdm

        rate = self.rate()
        return tqdm.format_meter(
            self.n, self.work, self.clock() - self.started, prefix=self.describe(),
            unit=_UNIT, unit_scale=True, rate=rate, bar_format=layout or _LINE + _times(rate),
        )  # fmt: skip

    def _show(self, now: bool = False) -> None:
        """Redraw the bar (at most every half second unless ``now``), or write a line if
        :func:`line_every` seconds have passed since the last (or ``now``)."""
        if self.bar is not None:
            self.bar.set_description_str(self.describe(), refresh=now)
            self.bar.update(self.n - self.bar.n)
        elif self.lines and (now or self.clock() - self.last_line >= self.every):
            self._write_line(self.line())

    def _write_line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
        self.last_line = self.clock()

    def close(self) -> None:
        """End the bar, or write the last line: the member-steps done, in what time, and
        the rate if one was measured."""
        self.rate_after = 0.0
        if self.bar is not None:
            self.bar.refresh()
            self.bar.close()
        elif self.lines:
            rate = ", {rate_fmt}" if self.rate() is not None else ""
            self._write_line(self.line(f"{_STATE} {_COUNT} in {{elapsed}}{rate}"))


def _notebook() -> bool:
    """Whether this runs in a Jupyter kernel that can show a widget (ipywidgets installed);
    the test of ``tqdm.autonotebook``, without its warning when ipywidgets is missing."""
    if "ipykernel.zmqshell" not in sys.modules:
        return False
    if any(k == "QT_API" or k.startswith("SPYDER") for k in os.environ):
        return False  # qtconsole, Spyder: text consoles
    import tqdm.notebook

    # None where ipywidgets is missing; set in a try block that pyright cannot follow
    return getattr(tqdm.notebook, "IProgress", None) is not None


def _bar(progress: Progress, enabled: bool):  # noqa: ANN202
    """A tqdm bar showing ``progress`` (its rate and ETA from :meth:`Progress.rate`):
    a widget in a notebook, a text bar on a terminal; None elsewhere or when disabled."""
    if not enabled:
        return None
    if _notebook():
        from tqdm.notebook import tqdm as base

        layout = _WIDGET
    elif getattr(progress.stream, "isatty", lambda: False)():
        from tqdm import tqdm as base

        layout = _BAR
    else:
        return None

    class Bar(base):
        @property
        def format_dict(self) -> dict:
            rate = progress.rate()
            shown = {**super().format_dict, "rate": rate, "bar_format": layout + _times(rate)}
            if layout is _BAR:
                shown = _fit(self.format_meter, shown, _times(rate), _columns(progress.stream))
            return shown

    return Bar(
        total=progress.work, unit=_UNIT, unit_scale=True, file=progress.stream,
        mininterval=0.5, desc=progress.describe(),
    )  # fmt: skip


def _columns(stream: TextIO) -> int:
    """The width of the terminal ``stream`` writes to, looked up at each redraw (a window
    can be resized); ``$COLUMNS`` or 80 where the stream has no terminal size."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return shutil.get_terminal_size().columns


def _fit(meter: Callable[..., str], shown: dict, times: str, columns: int) -> dict:
    """``shown`` (a tqdm ``format_dict`` with a :data:`_BAR` layout) fitted to ``columns``:
    the whole description and a bar of at least :data:`_MIN_BAR` columns if they fit, else
    the count without its unit, and then the description cut (…) to leave a bar of 1.
    tqdm sizes the bar to what is left and cuts what passes the width from the end: the
    time left and the rate, which must stay. ``meter``: the bar's ``format_meter``."""
    desc = shown["prefix"]
    for layout in (_BAR, _NARROW_BAR):
        bar_format = layout + times
        rest = meter(
            **{**shown, "prefix": "", "ncols": None, "bar_format": bar_format.replace("{bar}", "")}
        )
        room = columns - len(rest)  # for the description and the bar
        if room - len(desc) >= _MIN_BAR:
            break
    if room - len(desc) < 1:
        desc = desc[: max(0, room - 2)] + "…" if room > 2 else ""
    return {**shown, "prefix": desc, "ncols": columns, "bar_format": bar_format}
