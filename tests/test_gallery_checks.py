"""The gallery's checks in the store (``gallery_checks``) and in the HTML report: each check
stored with the state of the runs it read, replaced when its result is checked again, and
shown by ``phasesweep report`` as PASS, FAIL, INCOMPLETE (it read a sweep with grid points
not done) or, once the sweep's runs changed, STALE."""

from __future__ import annotations

import dataclasses
import re
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
import yaml
from calibration import synthetic_sweep
from phasesweep.analysis import report
from phasesweep.storage import Store, open_catalog

from phasesweep._gallery import Check, Fit, Result, Size, evaluate, record

SWEEP = "gal"
GRID = {"init_scale": [1e-2, 1e-1, 1.0], "width": [16], "depth": [2], "seed": [0]}
#: one check whose interval reaches the paper's value, one whose interval misses it
PASSING = Check("exponent in g", Fit(1.02, 0.97, 1.07, 0.0, 9), 1.0, 0.0, "exact")
FAILING = Check("exponent in m", Fit(-0.31, -0.35, -0.27, 0.0, 9), -0.5, 0.05, "finite width")


def _toy(name: str = "toy") -> Result:
    """A result over any sweep whose measure states two fixed checks (the pass rule itself
    is ``Check.passed``'s, tested in test_gallery.py)."""
    return Result(
        name=name,
        seed="003",
        paper="A. Author, B. Author (2019)",
        reproduces="eq. (7)",
        sweep="lazy_rich",
        conditions="none",
        sql="SELECT run_id FROM runs WHERE sweep = {sweep}",
        default=Size((), 0.1),
        full=Size((), 0.1),
        measure=lambda frame: [PASSING, FAILING],
        draw=lambda frame, checks: None,
    )


def _chunk(
    init_scales: list[float], name: str, finished: datetime, fail_first: bool = False
) -> dict[str, pa.Table]:
    """A chunk of :func:`calibration.synthetic_sweep` whose run ids start with ``name``
    (distinct from another chunk's) and whose runs finished at ``finished``, a second
    apart; ``fail_first``: its first run failed after retries."""
    tables = synthetic_sweep(
        init_scales, GRID["width"], GRID["depth"], GRID["seed"], steps=10**6, fail_first=fail_first
    )
    for key, table in tables.items():
        ids = pa.array([name + r for r in table["run_id"].to_pylist()], pa.string())
        tables[key] = table.set_column(table.schema.get_field_index("run_id"), "run_id", ids)
    runs = tables["runs"]
    times = pa.array(
        [finished + timedelta(seconds=i) for i in range(runs.num_rows)], runs["finished_at"].type
    )
    tables["runs"] = runs.set_column(
        runs.schema.get_field_index("finished_at"), "finished_at", times
    )
    return tables


@pytest.fixture
def store(tmp_path) -> Store:
    """A store holding the sweep ``SWEEP`` over ``GRID``, with its spec."""
    made = Store.open(str(tmp_path / "store"))
    made.write_chunk(
        SWEEP, "c0", _chunk(GRID["init_scale"], "a", datetime(2026, 1, 1, tzinfo=timezone.utc))
    )
    made.write_spec(SWEEP, yaml.safe_dump({"name": SWEEP, "grid": GRID}))
    return made


def _runs(store) -> tuple[int, object]:
    """(rows, latest finished_at) of the store's runs files, read without the catalog."""
    runs = ds.dataset(store.readable_files("runs"), format="parquet").to_table()
    return runs.num_rows, pc.max(runs["finished_at"]).as_py()


def test_record_stores_each_check_with_the_state_of_the_runs_it_read(store, tmp_path):
    evaluation = evaluate(_toy(), store, SWEEP)
    assert (evaluation.source_runs, evaluation.source_finished_at) == _runs(store)
    figure = tmp_path / "toy.png"
    figure.write_bytes(b"png")
    record(evaluation, store, figure)
    record(evaluation, store, figure)  # checked again: replaced, not duplicated
    record(evaluate(_toy("other"), store, SWEEP), store)
    con = open_catalog(store)
    rows = con.execute(
        "SELECT * FROM gallery_checks WHERE sweep = ? ORDER BY result, label", [SWEEP]
    ).df()
    con.close()
    assert list(rows.result) == ["other", "other", "toy", "toy"]
    toy = rows[rows.result == "toy"].set_index("label")
    for check in (PASSING, FAILING):
        row = toy.loc[check.label]
        assert (row.estimate, row.ci_low, row.ci_high, row.n_points) == (
            check.fit.estimate,
            check.fit.low,
            check.fit.high,
            check.fit.n,
        )
        assert (row.expected, row.tolerance, row.bound) == (check.theory, check.tolerance, "equal")
        assert bool(row.passed) == check.passed
        assert row.figure == str(figure.resolve()) and row.seed_text == "003"
        assert (row.source_runs, row.source_finished_at) == _runs(store)
    assert rows[rows.result == "other"].figure.isna().all()


class _Cells(HTMLParser):
    """The gallery table's rows (cell texts) and its links."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.hrefs: list[str] = []
        self.inside = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.inside = dict(attrs).get("id") == "gallery-checks"
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag == "td":
            self.rows[-1].append("")
        elif self.inside and tag == "a":
            self.hrefs.append(dict(attrs)["href"])

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.inside and self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def _gallery_table(page: Path) -> _Cells:
    cells = _Cells()
    cells.feed(page.read_text(encoding="utf-8"))
    cells.rows = [[cell.strip() for cell in row] for row in cells.rows]
    return cells


def test_the_report_shows_the_checks_pass_and_fail_then_stale(store, tmp_path):
    without = report(store, SWEEP, tmp_path / "without")
    assert "<h2>Gallery</h2>" not in without.read_text(encoding="utf-8")
    assert _gallery_table(without).rows == []

    figure = tmp_path / "gallery" / "toy.png"
    figure.parent.mkdir()
    figure.write_bytes(b"png")
    record(evaluate(_toy(), store, SWEEP), store, figure)
    page = report(store, SWEEP, tmp_path / "with")
    text = page.read_text(encoding="utf-8")
    assert "<h2>Gallery</h2>" in text and "1 of\n2 pass" in text
    table = _gallery_table(page)
    verdicts = {row[1]: row[5] for row in table.rows[1:]}
    assert verdicts == {PASSING.label: "PASS", FAILING.label: "FAIL"}
    measured = {row[1]: row[2] for row in table.rows[1:]}
    assert measured[FAILING.label] == "-0.31 [-0.35, -0.27] (95 %, n = 9)"
    assert {row[1]: row[3] for row in table.rows[1:]}[FAILING.label] == "-0.5 ± 0.05"
    # each row links the figure, relative to the page's folder
    assert len(table.hrefs) == 2
    assert all((page.parent / unquote(h)).resolve() == figure.resolve() for h in table.hrefs)

    # a run added to the sweep: the checks no longer describe its runs
    store.write_chunk(SWEEP, "c1", _chunk([3e-2], "b", datetime(2026, 1, 2, tzinfo=timezone.utc)))
    stale = report(store, SWEEP, tmp_path / "stale")
    rows = _gallery_table(stale).rows[1:]
    assert [row[5] for row in rows] == ["STALE", "STALE"]
    assert re.search(r"2 are stale .*phasesweep gallery toy", stale.read_text(), re.S)


@pytest.mark.parametrize("missing", [None, "gone.png"])
def test_a_check_without_a_drawn_figure_says_so(store, tmp_path, missing):
    from phasesweep.analysis._report._gallery_checks import gallery_rows

    record(evaluate(_toy(), store, SWEEP), store, None if missing is None else tmp_path / missing)
    con = open_catalog(store)
    rows = gallery_rows(con, SWEEP, tmp_path)
    con.close()
    expected = "not drawn" if missing is None else "gone.png (not found)"
    assert [(r["figure"], r["href"]) for r in rows] == [(expected, None)] * 2


def test_a_result_read_from_a_sweep_with_points_not_done_is_incomplete(tmp_path):
    """Of a grid of 5 points, 3 are stored done, 1 failed after retries and 1 was never
    trained: the evaluation does not pass though its checks are stamped as they are, the
    caption and the report say INCOMPLETE with the command that trains the rest, and once
    both are trained and the result checked again it is complete."""
    from phasesweep._gallery import RESULTS

    store = Store.open(str(tmp_path / "store"))
    grid = {**GRID, "init_scale": [1e-2, 3e-2, 1e-1, 3e-1, 1.0]}
    store.write_spec(SWEEP, yaml.safe_dump({"name": SWEEP, "grid": grid}))
    store.write_chunk(
        SWEEP, "c0", _chunk(GRID["init_scale"], "a", datetime(2026, 1, 1, tzinfo=timezone.utc))
    )
    later = datetime(2026, 1, 2, tzinfo=timezone.utc)
    store.write_chunk(SWEEP, "c1", _chunk([3e-2], "b", later, fail_first=True))

    only_passing = dataclasses.replace(_toy(), measure=lambda frame: [PASSING])
    evaluation = evaluate(only_passing, store, SWEEP)
    assert (evaluation.grid_points, evaluation.missing_points) == (5, 2)
    assert [c.passed for c in evaluation.checks] == [True] and not evaluation.passed
    assert evaluation.caption.startswith("INCOMPLETE — seed 003")
    assert (evaluation.failed_points, evaluation.failure) == (1, "synthetic failure")
    assert (
        "2 of the sweep's 5 grid points are not done (1 failed after retries, the latest with "
        "'synthetic failure'; 1 not yet trained)" in evaluation.caption
    )
    assert "running its sweep again trains them" in evaluation.caption  # not a gallery sweep
    record(evaluation, store)
    page = report(store, SWEEP, tmp_path / "incomplete")
    assert [row[5] for row in _gallery_table(page).rows[1:]] == ["INCOMPLETE"]
    assert re.search(
        r"0 of\s+1 pass; 1 are incomplete .*: <code>phasesweep gallery toy</code> trains",
        page.read_text(encoding="utf-8"),
        re.S,
    )

    # a gallery sweep's caption names the command that trains what is missing
    gallery = RESULTS["lazy_training"]
    for full, command in ((False, "phasesweep gallery lazy_training`"), (True, "--full`")):
        named = dataclasses.replace(evaluation, result=gallery, sweep=gallery.sweep_name(full))
        assert command in named.caption and not named.passed

    # the failed run trained again and the missing one trained: complete, and passes
    store.write_chunk(SWEEP, "c2", _chunk([3e-2], "b", later + timedelta(days=1)))
    store.write_chunk(SWEEP, "c3", _chunk([3e-1], "c", later + timedelta(days=1)))
    assert [row[5] for row in _gallery_table(report(store, SWEEP, tmp_path / "s")).rows[1:]] == [
        "STALE"
    ]
    again = evaluate(only_passing, store, SWEEP)
    assert (again.grid_points, again.missing_points) == (5, 0) and again.passed
    assert again.caption.startswith("PASS") and "Incomplete" not in again.caption
    record(again, store)
    con = open_catalog(store)
    stored = con.execute("SELECT source_missing_points FROM gallery_checks").fetchall()
    con.close()
    assert stored == [(0,)]
    assert [row[5] for row in _gallery_table(report(store, SWEEP, tmp_path / "c")).rows[1:]] == [
        "PASS"
    ]


def _failed_with(chunk: dict[str, pa.Table], error: str) -> dict[str, pa.Table]:
    """``chunk`` with its failed runs' stored error replaced by ``error``."""
    runs = chunk["runs"]
    failed = pc.equal(runs["status"], "failed")
    errors = pc.if_else(failed, pa.scalar(error), runs["error"])
    return {**chunk, "runs": runs.set_column(runs.schema.get_field_index("error"), "error", errors)}


def test_an_incomplete_caption_says_how_many_failed_and_the_latest_failures_reason(tmp_path):
    """Two points of a 3-point grid failed after retries, a day apart, each with a
    traceback stored as its error: the caption counts both as failed (none untrained) and
    quotes the last line of the later one's traceback, cut to 200 characters."""
    store = Store.open(str(tmp_path / "store"))
    grid = {**GRID, "init_scale": [1e-2, 3e-2, 1e-1]}
    store.write_spec(SWEEP, yaml.safe_dump({"name": SWEEP, "grid": grid}))
    first = datetime(2026, 1, 1, tzinfo=timezone.utc)
    store.write_chunk(SWEEP, "c0", _chunk([1e-2], "a", first))
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\n{}\n\n'
    earlier = _failed_with(_chunk([3e-2], "b", first, True), traceback.format("OSError: disk"))
    later = _chunk([1e-1], "c", first + timedelta(days=1), True)
    reason = "torch.OutOfMemoryError: " + "x" * 300
    store.write_chunk(SWEEP, "c1", earlier)
    store.write_chunk(SWEEP, "c2", _failed_with(later, traceback.format(reason)))

    evaluation = evaluate(dataclasses.replace(_toy(), measure=lambda f: [PASSING]), store, SWEEP)
    assert (evaluation.missing_points, evaluation.failed_points) == (2, 2)
    assert evaluation.failure == reason[:199] + "…"
    assert (
        f"2 of the sweep's 3 grid points are not done (2 failed after retries, the latest "
        f"with {evaluation.failure!r}), so the checks read part of the grid"
    ) in evaluation.caption
    assert not evaluation.passed


@pytest.mark.parametrize(
    "sweep,command",
    [
        ("gallery_toy", "phasesweep gallery toy</code>"),
        ("gallery_toy_full", "phasesweep gallery toy --full</code>"),
        ("mine", "phasesweep gallery toy</code>"),
    ],
)
def test_the_reports_command_checks_a_full_sweep_again_at_its_size(sweep, command):
    """An INCOMPLETE or STALE result of a ``--full`` sweep is checked again with ``--full``
    (without it the gallery would train and check the default-size sweep instead)."""
    from phasesweep.analysis._report._gallery_checks import gallery_section

    from phasesweep._gallery import RESULTS

    assert RESULTS["lazy_training"].sweep_name(full=True) == "gallery_lazy_training_full"
    row = {"result": "toy", "paper": "", "label": "a", "measured": "", "expected": "", "why": ""}
    rows = [{**row, "verdict": v, "figure": "", "href": None} for v in ("INCOMPLETE", "STALE")]
    assert command in gallery_section(rows, sweep)
    assert "checks again" not in gallery_section([{**rows[0], "verdict": "PASS"}], sweep)
