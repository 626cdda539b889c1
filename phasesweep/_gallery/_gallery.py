"""The gallery's use case: run the sweep a result needs (skipping what the store holds),
analyze it, read its numbers with the result's SQL, check them, draw the figure and record
the checks in the store's ``gallery_checks`` table (what ``phasesweep report`` shows).

``phasesweep gallery`` and :func:`phasesweep._gallery` are thin layers over
:func:`reproduce`, :func:`evaluate` and :func:`listing`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from phasesweep._config import SpecError
from phasesweep._gallery._result import Result
from phasesweep._gallery.results import (
    balance,
    biasfree_plateau,
    biasfree_time,
    depth_region,
    escape_rank,
    escape_time,
    lazy_phase,
    lazy_training,
    ntk_gram,
    relu_transversal,
    slow_time,
    transversal,
)

if TYPE_CHECKING:
    import pandas as pd
    from phasesweep.storage import Store

    from phasesweep._gallery._fit import Check

#: Every result, by name, in the order ``--list`` shows them (cheapest first).
RESULTS: dict[str, Result] = {
    r.name: r
    for r in (
        lazy_training.RESULT,
        ntk_gram.RESULT,
        balance.RESULT,
        biasfree_time.RESULT,
        escape_time.RESULT,
        depth_region.RESULT,
        transversal.RESULT,
        biasfree_plateau.RESULT,
        lazy_phase.RESULT,
        relu_transversal.RESULT,
        escape_rank.RESULT,
        slow_time.RESULT,
    )
}


def select(names: Sequence[str]) -> list[Result]:
    """The results named (all of them for none), in the order given; an unknown name is a
    :class:`SpecError` naming it and the known ones."""
    for name in names:
        if name not in RESULTS:
            raise SpecError(
                "NAME",
                name,
                f"no such gallery result; known: {', '.join(RESULTS)}",
                what="argument",
            )
    return [RESULTS[n] for n in names] if names else list(RESULTS.values())


def points(result: Result, full: bool = False) -> int:
    """Grid points of the result's sweep at that size."""
    from phasesweep.pipeline.grid import grid_size
    from phasesweep.pipeline.run._launch import resolve_spec

    spec, _ = resolve_spec(result.spec_path, result.overrides(full))
    return grid_size(spec)


def listing(result: Result, full: bool = False) -> str:
    """The result's line of ``--list``: its name, the paper, what it reproduces, its size
    and its time on 2 CPU cores."""
    return (
        f"{result.name}  seed {result.seed}: {result.paper}; {result.reproduces}; "
        f"{points(result, full)} runs of sweeps/{result.sweep}.yaml, "
        f"~{result.size(full).minutes:g} min on 2 CPU cores"
    )


@dataclass
class Evaluation:
    """A result checked against a sweep of the store: the rows its SQL read, its checks,
    and the state of the sweep's runs it read (their count, any status, and their latest
    ``finished_at``: a new, extended or retrained run changes them)."""

    result: Result
    sweep: str
    frame: pd.DataFrame
    checks: list[Check]
    source_runs: int
    source_finished_at: datetime | None
    #: grid points of the sweep (its stored spec's; None without one) and how many of them
    #: were not done when it was read: failed after retries, or not yet trained
    grid_points: int | None = None
    missing_points: int = 0
    #: of the sweep's runs, those stored as failed after retries, and the last line of the
    #: latest one's error (None without one): what a reader needs to know why
    failed_points: int = 0
    failure: str | None = None

    @property
    def passed(self) -> bool:
        """Every check passed, on the whole grid: a result read from a sweep with points
        missing is not reproduced, whatever its checks say of the rest."""
        return not self.missing_points and bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def incomplete(self) -> str:
        """Why the checks read only part of the sweep's grid, and what trains the rest;
        "" when they read all of it."""
        if not self.missing_points:
            return ""
        retry = "running its sweep again trains them"
        for full in (False, True):
            if self.sweep == self.result.sweep_name(full):
                command = f"phasesweep gallery {self.result.name}{' --full' if full else ''}"
                retry = f"`{command}` trains them and checks again"
        return (
            f"Incomplete: {self.missing_points} of the sweep's {self.grid_points} grid points "
            f"are not done ({self._not_done}), so the checks read part of the grid; {retry}."
        )

    @property
    def _not_done(self) -> str:
        """How the missing points split into failed and untrained ones, with the latest
        failure's reason."""
        failed = min(self.failed_points, self.missing_points)
        if not failed:
            return "not yet trained"
        why = f"{failed} failed after retries"
        if self.failure:
            why += f", the latest with {self.failure!r}"
        untrained = self.missing_points - failed
        return why if not untrained else f"{why}; {untrained} not yet trained"

    @property
    def caption(self) -> str:
        return self.result.caption(self.checks, self.incomplete)


def evaluate(result: Result, store: Store, sweep: str | None = None) -> Evaluation:
    """Read ``result``'s numbers from ``sweep`` (default: its default-size sweep) with its
    SQL and check them, and count the sweep's grid points that are not done
    (``missing_points``). Nothing is written."""
    from phasesweep.pipeline.run._launch import stored_grid_size
    from phasesweep.storage import open_catalog

    sweep = sweep or result.sweep_name()
    con = open_catalog(store)
    try:
        frame = con.execute(result.query(sweep)).df()
        # done as `status` counts it: completed or diverged (a failed run is trained again)
        source_runs, source_finished_at, done, failed, error = con.execute(
            "SELECT count(*), max(finished_at), "
            "count(*) FILTER (WHERE status IS DISTINCT FROM 'failed'), "
            "count(*) FILTER (WHERE status = 'failed'), "
            "arg_max(error, finished_at) FILTER (WHERE status = 'failed') "
            "FROM runs WHERE sweep = ?",
            [sweep],
        ).fetchone()
    finally:
        con.close()
    if frame.empty:
        raise SpecError(
            "NAME",
            result.name,
            f"the store holds no completed runs of sweep {sweep}",
            what="argument",
        )
    checks = result.measure(frame)
    total = stored_grid_size(store, sweep)
    missing = 0 if total is None else max(total - done, 0)
    return Evaluation(
        result,
        sweep,
        frame,
        checks,
        source_runs,
        source_finished_at,
        total,
        missing,
        failed,
        _last_line(error),
    )


def _last_line(error: str | None, limit: int = 200) -> str | None:
    """The last non-blank line of a stored error (a traceback's tail: the exception), cut
    to ``limit`` characters."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return None
    return lines[-1] if len(lines[-1]) <= limit else lines[-1][: limit - 1] + "…"


def draw(evaluation: Evaluation, out: Path | str) -> list[Path]:
    """Write the evaluation's figure (``NAME.png``, ``NAME.svg``, caption included) and its
    SQL (``NAME.sql``) into ``out``; their paths."""
    from phasesweep.analysis._output import prepare_dir, write_file
    from phasesweep.analysis._style import save, theme

    from phasesweep._gallery._figure import with_caption

    result = evaluation.result
    with theme():
        fig = result.draw(evaluation.frame, evaluation.checks)
        fig.suptitle(f"{result.name}: {result.reproduces}", fontsize=10)
        with_caption(fig, evaluation.caption)
        paths = save(fig, out, result.name)
    sql = f"-- {result.name}: the numbers of the figure (sweep {evaluation.sweep})\n"
    paths.append(
        write_file(
            prepare_dir(out),
            f"{result.name}.sql",
            (sql + result.query(evaluation.sweep) + ";\n").encode(),
        )
    )
    return paths


def record(evaluation: Evaluation, store: Store, figure: Path | None = None) -> None:
    """Store the evaluation's checks in ``gallery_checks`` (the sweep's partition), in place
    of the result's earlier rows there; ``figure``: the PNG drawn of it (None: not drawn)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from phasesweep.storage.schema import to_table

    from phasesweep._gallery._fit import CONFIDENCE

    result, checks = evaluation.result, evaluation.checks
    rows = to_table(
        "gallery_checks",
        {
            "result": [result.name] * len(checks),
            "seed_text": [result.seed] * len(checks),
            "paper": [f"{result.paper}, {result.reproduces}"] * len(checks),
            "label": [c.label for c in checks],
            "estimate": [c.fit.estimate for c in checks],
            "ci_low": [c.fit.low for c in checks],
            "ci_high": [c.fit.high for c in checks],
            "confidence": [CONFIDENCE] * len(checks),
            "n_points": [c.fit.n for c in checks],
            "expected": [c.theory for c in checks],
            "tolerance": [c.tolerance for c in checks],
            "why_tolerance": [c.why_tolerance for c in checks],
            "bound": [c.bound for c in checks],
            "passed": [c.passed for c in checks],
            "figure": [None if figure is None else str(Path(figure).resolve())] * len(checks),
            "evaluated_at": [datetime.now(timezone.utc)] * len(checks),
            "source_runs": [evaluation.source_runs] * len(checks),
            "source_finished_at": [evaluation.source_finished_at] * len(checks),
            "source_missing_points": [evaluation.missing_points] * len(checks),
        },
        len(checks),
    )
    earlier = store.read_analysis(evaluation.sweep, "gallery_checks")
    others = to_table("gallery_checks", earlier.filter(pc.field("result") != result.name))
    store.write_analysis(evaluation.sweep, "gallery_checks", pa.concat_tables([others, rows]))


def reproduce(
    result: Result,
    store: Store,
    out: Path | str,
    *,
    full: bool = False,
    address: str | None = None,
    progress: bool = True,
) -> tuple[Evaluation, list[Path]]:
    """Train what the store lacks of the result's sweep, analyze it, check, draw and
    :func:`record` it. A launch that Ctrl-C or SIGTERM stopped raises
    :class:`~pipeline.run._signals.Interrupted`: nothing is checked or recorded of a
    sweep left partly trained."""
    from phasesweep.pipeline.run._launch import execute, plan_sweep

    from phasesweep import analysis

    planned = plan_sweep(result.spec_path, store, overrides=result.overrides(full), address=address)
    execute(planned, address=address, progress=progress).raise_if_interrupted()
    analysis.analyze(store, planned.spec.name)
    evaluation = evaluate(result, store, planned.spec.name)
    paths = draw(evaluation, out)
    record(evaluation, store, next(p for p in paths if p.suffix == ".png"))
    return evaluation, paths


def reproduce_all(
    names: Sequence[str],
    store: Store,
    out: Path | str | None,
    *,
    full: bool = False,
    address: str | None = None,
    progress: bool = True,
) -> list[tuple[Evaluation, list[Path]]]:
    """:func:`reproduce` of each result named (all for none; checked before any training),
    into ``out`` (default: ``STORE/figures/gallery``)."""
    from phasesweep.analysis._plotting import default_out_dir

    results = select(names)
    folder = Path(out) if out is not None else default_out_dir(store, "gallery")
    return [
        reproduce(r, store, folder, full=full, address=address, progress=progress) for r in results
    ]
