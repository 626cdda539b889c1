"""The launch's progress display: plain lines off a terminal, a bar on one, a widget in a
notebook; an ETA from the member-steps actually trained (start-up excluded)."""

from __future__ import annotations

import io
import pickle
import re

import pytest
from phasesweep.pipeline.run._progress import LINE_EVERY_ENV, RATE_AFTER, Progress


class Clock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(progress: Progress, stream: io.StringIO) -> list[str]:
    text = stream.getvalue()
    assert "\r" not in text and (not text or text.endswith("\n"))
    return text.splitlines()


def test_off_a_terminal_a_plain_line_every_few_seconds_and_one_at_the_end(monkeypatch):
    monkeypatch.setenv(LINE_EVERY_ENV, "10")
    clock, out = Clock(), io.StringIO()
    bar = Progress("s", [(2, 1000)], done=0, total=2, enabled=True, stream=out, clock=clock)
    for t in range(1, 26):  # a report every second
        clock.now = t
        bar.running(0, 80 * t)
    assert len(_lines(bar, out)) == 2  # at 10 s and 20 s
    clock.now = 26
    bar.finished(0, 2)
    bar.close()
    *_, last = _lines(bar, out)
    assert last.startswith("s: 2/2 points 100% 2.00k/2.00k member-steps in 00:26, ")
    trained = 80 * 25 - 80  # reported after the first report (1 s): at 80 per second
    assert last.endswith(f" {trained / (26 - 1):.1f} member-steps/s")


def test_the_eta_comes_from_member_steps_trained_after_start_up():
    """Start-up (10 s without a report) and each chunk's first report (work whose time is
    not known) are left out: the rate is 100 member-steps over the 5 s of reports."""
    clock, out = Clock(), io.StringIO()
    bar = Progress("s", [(2, 100), (2, 100)], done=0, total=4, enabled=False, clock=clock)
    bar.lines, bar.stream = True, out  # lines, shown on demand
    assert bar.rate() is None
    for t, chunk, steps in ((10, 0, 32), (12, 0, 72), (14, 0, 112), (14, 1, 32), (15, 1, 52)):
        clock.now = t
        bar.running(chunk, steps)
        if t - 10 < RATE_AFTER:
            assert bar.rate() is None and "<?, ? member-steps/s]" in bar.line()
    rate = (72 - 32 + 112 - 72 + 52 - 32) / (15 - 10)
    assert bar.rate() == pytest.approx(rate) == 20.0
    eta = (400 - (112 + 52)) / rate  # 11.8 s; n / elapsed would say 21.6 s
    assert bar.line().endswith(
        f"164/400 member-steps [00:15<00:{int(eta):02d}, 20.0 member-steps/s]"
    )


def test_a_retried_trial_does_not_count_its_steps_twice_or_negative():
    clock = Clock()
    bar = Progress("s", [(1, 1000)], done=0, total=1, enabled=False, clock=clock)
    for value in (16, 80, 16, 48):  # the trial dies after 80 and its retry starts over
        bar.running(0, value)
    assert bar.trained == (80 - 16) + (48 - 16)
    assert bar.n == 48


def test_on_a_terminal_a_bar_redrawn_in_place(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # a StringIO has no terminal size
    out = Terminal()
    bar = Progress("s", [(3, 100)], done=1, total=4, enabled=True, stream=out)
    for k in range(0, 301, 100):
        bar.running(0, k)
        bar.bar.refresh()
    bar.finished(0, 3)
    bar.close()
    frames = out.getvalue().split("\r")
    assert len(frames) > 3 and "|" in frames[-1]
    assert frames[-1].startswith("s: 4/4 points 100%|") and "300/300 member-steps" in frames[-1]


@pytest.mark.parametrize("columns", [80, 60, 200])
def test_on_a_terminal_the_bar_fits_its_width_with_the_time_left_and_the_rate(monkeypatch, columns):
    """The bar takes what the terminal's width leaves; a long description (a note) and,
    on a narrow terminal, the count's unit give way, never the time left and the rate."""
    monkeypatch.setenv("COLUMNS", str(columns))  # a StringIO has no terminal size
    clock, out = Clock(), Terminal()
    bar = Progress("quickstart", [(3000, 60000)], 0, 3000, enabled=True, stream=out, clock=clock)
    bar.note("waiting for points in progress by another launch")
    for t in range(1, 12):
        clock.now = t
        bar.running(0, 52_300 * t)
        bar.bar.refresh()
    *_, frame = out.getvalue().split("\r")
    frame = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", frame).rstrip()  # tqdm's cursor moves
    assert len(frame) <= columns, frame
    times = re.search(r" \[\d\d:\d\d<(\d\d:\d\d:\d\d|\d\d:\d\d), 52\.3k member-steps/s\]$", frame)
    assert times, frame  # the rate: 52.3k member-steps over each second of reports
    assert re.search(r"%\|[^|]+\| 575k/180M( member-steps)? \[", frame), frame
    points = "quickstart: 0/3000 points"
    assert frame.startswith(points if columns >= 80 else "quick…"), frame
    assert (" member-steps [" in frame) == (columns > 80)  # 80: the count loses its unit
    assert ("another launch)" in frame) == (columns == 200)  # else the note is cut: …
    bar.close()


def test_disabled_writes_nothing_and_a_pickled_copy_shows_nothing():
    quiet, out = io.StringIO(), Terminal()
    off = Progress("s", [(3, 100)], done=0, total=3, enabled=False, stream=quiet)
    off.running(0, 50)
    off.close()
    assert quiet.getvalue() == ""
    on = Progress("s", [(3, 100)], done=0, total=3, enabled=True, stream=out)
    copy = pickle.loads(pickle.dumps(on))  # Tune pickles its callbacks, and this with them
    assert copy.bar is None and copy.stream is None and not copy.lines
    copy.running(0, 50)
    copy.close()
    on.close()


@pytest.mark.process
def test_a_notebook_shows_a_widget_bar_without_warnings(tmp_path):
    """``phasesweep.run`` in a Jupyter kernel: a tqdm.notebook widget (ipywidgets), whose
    last state shows every point done, and no TqdmWarning in the cell's output."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from conftest import TINY_SPEC

    source = (
        "import phasesweep, ray\n"
        f"spec = {TINY_SPEC!r}\n"
        "outcome = phasesweep.run(spec, 'store', overrides=['train.steps=2000'])\n"
        "ray.shutdown()\n"
        "print('trained', outcome.trained)\n"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    outputs = nb.cells[0].outputs
    text = "".join(o.get("text", "") for o in outputs)
    assert "trained 6" in text and "Warning" not in text and "IProgress" not in text, text
    views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(views) == 1
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    shown = [m["state"].get("value") for m in states.values()]
    assert any(isinstance(v, str) and "tiny:\u20076/6\u2007points" in v for v in shown), shown
