"""``phasesweep analyze``: per-run summaries, plateaus and scaling fits of a sweep.

The core, :func:`analyze_frames`, is pure: pandas frames of ``runs`` and
``trajectories`` in, Arrow tables of ``summaries``, ``plateaus`` and
``scaling_fits`` out. :func:`analyze` takes the thresholds from the sweep's stored
spec (``analysis:``; defaults if there is none) and replaces the sweep's partitions
of the three tables, so it can be rerun at any time (e.g. with other thresholds)
and gives the same rows.

:func:`analyze` streams: it reads the runs a batch at a time with their trajectories
(``storage._catalog.run_batch_reads``, as the catalog views show them; the worker
process that analyzes a batch reads its trajectories), writes each
batch's ``summaries`` and ``plateaus`` rows as they come, and keeps of every run only
the few numbers the scaling fits need, so its memory does not grow with the trajectories
of the sweep. Each run's numbers depend on its own rows only: the rows are those of
:func:`analyze_frames` of the whole sweep (in batch order).

The regime rule reads each run at its last logged point, or, with
``analysis.at_time``, at that common gradient-flow time (linear in log t between
the logged points around it; NULL for runs that stopped before it): the
``eval_*`` columns of ``summaries`` hold what it read.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from phasesweep.analysis import _series as ser
from phasesweep.analysis._escape import escape_times
from phasesweep.analysis._plateaus import plateau_frame
from phasesweep.analysis._regimes import ORDER_PARAMETERS, classify
from phasesweep.analysis._scaling import fit_scaling
from phasesweep.analysis.config import (
    REACH_RTOL,
    AnalysisConfig,
    StoredSweep,
    reached_time,
    stored_sweep,
)
from phasesweep.storage.schema import (
    COLUMNS,
    ESCAPE_COLUMNS,
    ESCAPE_EPS,
    FIT_GROUP_COLUMNS,
    RUNS,
    SUMMARIES,
    to_table,
)

log = logging.getLogger(__name__)

#: Runs :func:`analyze` reads and analyzes at once: its memory holds about this many runs'
#: trajectories (rows x ~12 columns x 8 bytes, with the pandas frames of the batch).
BATCH_RUNS = 2048

RUN_COLUMNS = [
    "run_id",
    "status",
    "init_scale",
    "width",
    "depth",
    "noise_sigma",
    "lr",
    "seed",
    "activation",
    "initial_train_loss",
    "final_train_loss",
]
#: ``summaries`` column -> the ``trajectories`` column whose last finite value it holds.
FINAL_COLUMNS = {c.name: c.final_of for c in COLUMNS["summaries"] if c.final_of}
#: The ``trajectories`` columns analyze reads, in the table's order.
TRAJECTORY_COLUMNS = [c.name for c in COLUMNS["trajectories"] if c.name in FINAL_COLUMNS.values()]


def fit_group_axes(runs: pd.DataFrame, spec: StoredSweep | None) -> list[str]:
    """Axes besides depth that split the scaling fits.

    With a spec: the grid axes among ``FIT_GROUP_COLUMNS``. Without: the columns of
    ``FIT_GROUP_COLUMNS`` except ``lr`` (which may be derived from the init scale) that
    take more than one value.
    """
    if spec is not None:
        axes = set(spec.grid_axes)
        return [a for a in FIT_GROUP_COLUMNS if a in axes]
    return [
        a for a in FIT_GROUP_COLUMNS if a != "lr" and a in runs and runs[a].nunique(dropna=True) > 1
    ]


def compute_summaries(
    runs: pd.DataFrame, s: ser.Series, cfg: AnalysisConfig
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summaries, plateaus) frames, one summaries row per row of ``runs``; ``s``: their
    trajectories (``TRAJECTORY_COLUMNS``; those missing are NULL), runs in the same order."""
    run_ids = runs["run_id"].to_numpy(dtype=object)
    status = runs["status"].to_numpy(dtype=object)
    for c in TRAJECTORY_COLUMNS:
        if c not in s.values:
            s.values[c] = np.full(len(s.time), np.nan)

    l0 = ser.first(s.select("train_loss"), "train_loss")
    l0 = np.where(np.isfinite(l0), l0, _col(runs, "initial_train_loss"))
    lend = ser.last_finite(s, "train_loss")
    lend = np.where(np.isfinite(lend), lend, _col(runs, "final_train_loss"))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(l0 > 0, lend / l0, np.nan)
    finals = {c: ser.last_finite(s, c) for c in TRAJECTORY_COLUMNS}
    at = evaluated(s, finals, cfg.at_time)
    with np.errstate(divide="ignore", invalid="ignore"):
        eval_ratio = np.where(l0 > 0, at["train_loss"] / l0, np.nan)
    if cfg.at_time is None:
        eval_ratio = ratio

    reg = classify(
        status,
        eval_ratio,
        at["kernel_distance"],
        at["param_rel_change"],
        lin_distance=at["lin_distance"],
        order_parameter=cfg.order_parameter,
        lazy_threshold=cfg.lazy_threshold,
        fallback_lazy_threshold=cfg.fallback_lazy_threshold,
        converged_loss_frac=cfg.converged_loss_frac,
    )

    extra = list(cfg.extra_escape_eps)
    eps_all = [cfg.escape_eps, *ESCAPE_EPS, *extra]
    esc = escape_times(s, eps_all, min_drop=cfg.escape_min_drop)
    no_escape = np.isin(status, ["diverged", "failed"])
    esc[no_escape] = np.nan

    plateaus, counts = plateau_frame(
        s,
        contrast=cfg.plateau_contrast,
        min_drop=cfg.plateau_min_drop,
        min_duration_ratio=cfg.plateau_min_duration_ratio,
        floor=cfg.plateau_loss_floor,
        skip=no_escape | (s.lengths == 0),
    )

    out = pd.DataFrame(
        {
            "run_id": run_ids,
            **{column: finals[of] for column, of in FINAL_COLUMNS.items()},
            "regime": reg.regime,
            "escape_time": esc[:, 0],
            "n_plateaus": pd.array(np.where(counts >= 0, counts, 0), dtype="Int64"),
            "order_parameter": reg.order_parameter,
            "order_value": reg.order_value,
            "lazy_threshold": reg.threshold,
            "initial_train_loss": l0,
            "final_train_loss": lend,
            "loss_ratio": ratio,
            "final_time": ser.last_time_finite(s, "train_loss"),
            "escape_eps": cfg.escape_eps,
            "eval_time": at["time"],
            "eval_loss_ratio": eval_ratio,
            "eval_param_rel_change": at["param_rel_change"],
            "eval_kernel_distance": at["kernel_distance"],
        }
    )
    out.loc[counts < 0, "n_plateaus"] = pd.NA
    for k, c in enumerate(ESCAPE_COLUMNS):
        out[c] = esc[:, 1 + k]
    nx = len(extra)
    out["extra_escape_eps"] = [list(extra)] * len(out)
    out["extra_escape_times"] = [_none_nan(row) for row in esc[:, len(eps_all) - nx :]]
    return out, plateaus


def evaluated(
    s: ser.Series, finals: dict[str, np.ndarray], at_time: float | None
) -> dict[str, np.ndarray]:
    """The values the regime rule reads, per run: at ``at_time`` (``analysis.at_time``:
    :func:`series.value_at`, NaN for a run that stopped before it), else the last finite
    ones (``finals``). ``time``: the time they belong to."""
    cols = ("train_loss", *ORDER_PARAMETERS)
    if at_time is None:
        out = {c: finals[c] for c in cols}
        out["time"] = ser.last_time_finite(s, "train_loss")
        return out
    out = {c: ser.value_at(s, c, at_time) for c in cols}
    out["time"] = np.where(np.isfinite(out["train_loss"]), at_time, np.nan)
    return out


def fit_mask(df: pd.DataFrame, cfg: AnalysisConfig) -> pd.Series:
    """Which runs' escape times enter the scaling fits (``df``: runs joined with summaries).

    Completed runs with an escape time, in ``cfg.fit_regimes``, with init_scale at most
    ``cfg.fit_init_scale_max``, and, if ``cfg.fit_require_plateau``, that left a plateau
    (``n_plateaus >= 1``): the saddle-escape laws concern runs that sat at a saddle.
    """
    keep = (df["status"] == "completed") & df["escape_time"].notna()
    keep &= df["regime"].isin(list(cfg.fit_regimes))
    if cfg.fit_require_plateau:
        keep &= df["n_plateaus"].fillna(0) >= 1
    if cfg.fit_init_scale_max is not None:
        keep &= df["init_scale"] <= cfg.fit_init_scale_max
    return keep.fillna(False).astype(bool)


#: The summaries columns the scaling fits read.
FIT_SUMMARY_COLUMNS = ["regime", "escape_time", "n_plateaus"]


def compute_fits(
    df: pd.DataFrame, cfg: AnalysisConfig, group_axes: Sequence[str] = ()
) -> pd.DataFrame:
    """Scaling fits of the escape times (see :mod:`analysis._scaling`).

    ``df``: runs (``status``, ``depth``, ``init_scale``, ``seed`` and ``group_axes``) with
    their summaries' :data:`FIT_SUMMARY_COLUMNS`. Every group (depth and the other grid
    axes) of completed runs gets its rows, with NULL slopes where too few escape times
    pass :func:`fit_mask`.
    """
    keep = fit_mask(df, cfg)
    df = df[df["status"] == "completed"].copy()
    df["escape_time"] = df["escape_time"].where(keep[df.index], np.nan)
    return fit_scaling(
        df,
        group_axes=group_axes,
        eps=cfg.escape_eps,
        min_decades=cfg.fit_min_decades,
        confidence=cfg.fit_confidence,
    )


def analyze_frames(
    runs: pd.DataFrame,
    traj: pd.DataFrame,
    cfg: AnalysisConfig | None = None,
    group_axes: Sequence[str] | None = None,
) -> dict[str, pa.Table]:
    """The three analysis tables (Arrow, with their schemas, no ``sweep`` column)."""
    cfg = cfg or AnalysisConfig()
    if group_axes is None:
        group_axes = fit_group_axes(runs, None)
    s = ser.from_frame(traj, TRAJECTORY_COLUMNS, run_ids=runs["run_id"].to_numpy(dtype=object))
    summaries, plateaus = compute_summaries(runs, s, cfg)
    fit_input = runs.merge(summaries[["run_id", *FIT_SUMMARY_COLUMNS]], on="run_id")
    fits = compute_fits(fit_input, cfg, group_axes)
    return {
        "summaries": to_table("summaries", summaries, len(summaries)),
        "plateaus": to_table("plateaus", plateaus, len(plateaus)),
        "scaling_fits": to_table("scaling_fits", fits, len(fits)),
    }


@dataclass(frozen=True)
class Reach:
    """How a sweep's completed runs reach ``analysis.at_time``, in numbers that add up over
    batches of runs (and that SQL aggregates give): ``completed`` runs, of which ``short``
    stop before it (their last finite loss comes earlier; a run without any finite loss is
    not short: its regime is NULL for that, at any time); ``short_end`` the latest end of
    those, ``first_end`` the earliest end of any (NaN: none finite)."""

    completed: int = 0
    short: int = 0
    short_end: float = float("nan")
    first_end: float = float("nan")

    @classmethod
    def of(cls, at_time: float, status: np.ndarray, final_time: np.ndarray) -> Reach:
        """Of runs given by ``status`` and ``final_time`` (``summaries.final_time``, NaN for
        a run without a finite loss)."""
        ends = np.asarray(final_time, dtype=np.float64)[np.asarray(status) == "completed"]
        short = ends < at_time * (1.0 - REACH_RTOL)  # NaN (no finite loss) is not
        finite = np.isfinite(ends)
        return cls(
            int(len(ends)),
            int(short.sum()),
            float(ends[short].max()) if short.any() else float("nan"),
            float(ends[finite].min()) if finite.any() else float("nan"),
        )

    @classmethod
    def of_counts(cls, counts: pd.DataFrame) -> Reach:
        """Of SQL counts by status: columns ``status``, ``runs``, ``short``, ``short_end``
        and ``first_end``, one row per status and whatever else they are grouped by."""
        done = counts[counts["status"] == "completed"]
        return cls(
            int(done["runs"].sum()),
            int(done["short"].sum()),
            float(done["short_end"].max()) if done["short_end"].notna().any() else float("nan"),
            float(done["first_end"].min()) if done["first_end"].notna().any() else float("nan"),
        )

    def __add__(self, other: Reach) -> Reach:
        return Reach(
            self.completed + other.completed,
            self.short + other.short,
            float(np.fmax(self.short_end, other.short_end)),
            float(np.fmin(self.first_end, other.first_end)),
        )

    def line(self, at_time: float | None) -> str | None:
        """One line saying how many completed runs stop before ``at_time`` (their regime
        is NULL) and what to do; None when every one reaches it (or no at_time)."""
        if at_time is None or not self.short:
            return None
        line = (
            f"analysis.at_time = {at_time:g} lies beyond the last gradient-flow time of "
            f"{self.short} of {self.completed} completed runs"
            + (
                f" (they end by t = {self.short_end:.6g})"
                if self.short_end == self.short_end
                else ""
            )
            + ": their regime is NULL"
        )
        if self.first_end == self.first_end:
            t = reached_time(self.first_end)
            line += (
                f"; every run with a finite loss reaches t = {t}: relaunch the sweep's spec with "
                f"--set analysis.at_time={t} (nothing is retrained) and analyze again"
            )
        return line


#: What :func:`analyze` keeps of every run for the scaling fits (with FIT_SUMMARY_COLUMNS).
_FIT_INPUT = ["run_id", "status", "depth", "init_scale", "seed", *FIT_GROUP_COLUMNS]
_FIT_SCHEMA = pa.schema(
    [RUNS.field(c) for c in _FIT_INPUT] + [SUMMARIES.field(c) for c in FIT_SUMMARY_COLUMNS]
)


class DamagedRunsError(RuntimeError):
    """``analyze`` met damaged store files of the sweep: it wrote the summaries of every
    other run and none of the runs whose rows it could not read completely. ``files``:
    the damaged files (relative to the store root); ``runs``: the runs left unanalyzed."""

    def __init__(self, sweep: str, files: Sequence[str], runs: int) -> None:
        self.files = list(files)
        self.runs = runs
        shown = ", ".join(self.files[:5]) + (
            f" and {len(self.files) - 5} more" if len(files) > 5 else ""
        )
        super().__init__(
            f"sweep {sweep}: {len(self.files)} damaged store file(s): {shown}; "
            f"{runs} run(s) whose trajectories it holds were not analyzed. Run "
            f"`phasesweep verify {sweep} --repair`, relaunch the sweep's spec (it trains "
            "them again), then analyze again"
        )


def analyze(
    store,
    sweep: str,
    *,
    batch_runs: int = BATCH_RUNS,
    workers: int | None = None,
    unanalyzed: bool = False,
) -> dict[str, int]:
    """Compute and store ``summaries``, ``plateaus`` and ``scaling_fits`` of ``sweep``.

    ``store`` is a ``storage.Store`` or a URI. Each table's partition for the sweep is
    replaced whole, once every run is analyzed (an error leaves the old ones). The runs
    are analyzed ``batch_runs`` at a time (see the module docstring), by ``workers``
    processes besides this one, which reads and writes (default :func:`default_workers`;
    a sweep of one batch is analyzed here). ``unanalyzed``: analyze only the runs without
    a current summary and keep the current rows (the scaling fits are computed anew from
    all of them). Returns the number of rows written per table.

    A run whose chunk attempt lost a ``trajectories`` file to damage gets no summary (it
    would be computed from part of its rows): the others are written, then
    :class:`DamagedRunsError` names the files.
    """
    from phasesweep.storage._catalog import run_batch_reads
    from phasesweep.storage._store import as_store

    store = as_store(store)
    spec = stored_sweep(store.read_spec(sweep), sweep)
    cfg = spec.analysis if spec is not None else AnalysisConfig()
    counts = {"summaries": 0, "plateaus": 0}
    kept: list[pa.Table] = []
    reach = Reach()
    damaged = [d.path for d in store.damaged_files(sweep) if _chunk_table_file(store, d.path)]
    skipped = [0]
    batches = _undamaged(
        run_batch_reads(
            store,
            sweep,
            [*RUN_COLUMNS, "finished_at"],
            ["step", "time", *TRAJECTORY_COLUMNS],
            batch_runs,
            unanalyzed=unanalyzed,
        ),
        [p.rsplit("/", 1)[-1] for p in damaged if "/trajectories/" in p],
        skipped,
    )
    with (
        store.analysis_writer(sweep, "summaries") as write_summaries,
        store.analysis_writer(sweep, "plateaus") as write_plateaus,
    ):
        kept_now = _current(store, sweep) if unanalyzed else iter(())
        parts = itertools.chain(
            ((False, *part) for part in kept_now),
            ((True, *part) for part in _summarized(batches, cfg, workers)),
        )
        for new, summaries, plateaus, fit_input in parts:
            log.debug(
                "sweep %s: %d %s summaries", sweep, summaries.num_rows, "new" if new else "kept"
            )
            write_summaries(summaries)
            write_plateaus(plateaus)
            if cfg.at_time is not None:
                status = fit_input["status"].to_numpy(zero_copy_only=False)
                ends = summaries["final_time"].to_numpy(zero_copy_only=False)
                reach += Reach.of(cfg.at_time, status, ends)
            counts["summaries"] += summaries.num_rows
            counts["plateaus"] += plateaus.num_rows
            kept.append(fit_input)
        # in run_id order, as analyze_frames fits them (the slopes' round-off depends on it)
        every = pa.concat_tables(kept) if kept else None
        if every is None:
            every = pd.DataFrame(columns=[*_FIT_INPUT, *FIT_SUMMARY_COLUMNS])
        else:
            order = pc.sort_indices(every, [("run_id", "ascending")])
            every = every.take(order).drop_columns(["run_id"]).to_pandas()
        fits = compute_fits(every, cfg, fit_group_axes(every, spec))
    store.write_analysis(sweep, "scaling_fits", to_table("scaling_fits", fits, len(fits)))
    warning = reach.line(cfg.at_time)
    if warning:
        log.warning("sweep %s: %s", sweep, warning)
    if damaged:
        raise DamagedRunsError(sweep, [store.relative(p) for p in damaged], skipped[0])
    return {**counts, "scaling_fits": len(fits)}


def _chunk_table_file(store, path: str) -> bool:
    """Whether ``path`` is a file of a table that training writes (what analyze reads)."""
    return any(path.startswith(store.table_dir(t) + "/") for t in ("runs", "trajectories"))


def _undamaged(batches, damaged_names: Sequence[str], skipped: list[int]):
    """The ``(runs, read)`` batches without the runs of an attempt that lost a
    ``trajectories`` file (named ``…-{attempt}.parquet``) to damage; ``skipped[0]``
    counts those left out."""
    for runs, read in batches:
        if damaged_names:
            attempts = set(runs["attempt"].to_pylist())
            bad = [a for a in attempts if any(n.endswith(f"-{a}.parquet") for n in damaged_names)]
            if bad:
                keep = pc.invert(pc.is_in(runs["attempt"], value_set=pa.array(bad, pa.string())))
                skipped[0] += runs.num_rows - pc.sum(keep.cast(pa.int64())).as_py()
                runs = runs.filter(keep)
                read = dataclasses.replace(
                    read, parts=[p for p in read.parts if p.attempt not in bad]
                )
        if runs.num_rows:
            yield runs, read


def _current(store, sweep: str):
    """The sweep's current ``summaries`` and ``plateaus`` rows (as the catalog views show
    them) with what the scaling fits keep of their runs, as ``_summarized`` gives them, a
    batch of rows at a time (DuckDB streams them: memory holds one batch)."""
    from phasesweep.storage._catalog import catalog_connection, snapshot

    con = catalog_connection(store, snapshot(store, sweep, ("summaries", "plateaus")))
    no_plateaus = to_table("plateaus", {}, 0)
    try:
        fit = ", ".join(f'r."{c}" AS "fit:{c}"' for c in _FIT_INPUT if c != "run_id")
        rows = con.sql(
            f"SELECT s.* EXCLUDE (sweep), {fit} FROM summaries AS s "
            "JOIN runs AS r ON r.sweep = s.sweep AND r.run_id = s.run_id WHERE s.sweep = ?",
            params=[sweep],
        ).to_arrow_reader(BATCH_RUNS)
        for batch in rows:
            table = pa.Table.from_batches([batch])
            fit_input = {c: table[f"fit:{c}"] for c in _FIT_INPUT if c != "run_id"}
            fit_input.update({c: table[c] for c in ["run_id", *FIT_SUMMARY_COLUMNS]})
            yield (
                to_table("summaries", table.select(SUMMARIES.names)),
                no_plateaus,
                pa.table({c: fit_input[c] for c in _FIT_SCHEMA.names}).cast(_FIT_SCHEMA),
            )
        plateaus = con.sql(
            "SELECT * EXCLUDE (sweep) FROM plateaus WHERE sweep = ?", params=[sweep]
        ).to_arrow_reader(BATCH_RUNS)
        for batch in plateaus:
            yield (
                to_table("summaries", {}, 0),
                to_table("plateaus", pa.Table.from_batches([batch])),
                _FIT_SCHEMA.empty_table(),
            )
    finally:
        con.close()


def default_workers() -> int:
    """Processes :func:`analyze` spreads its batches over: two where the machine has two
    cores or more (each holds about one batch: more would spend memory), else none."""
    return 2 if (os.cpu_count() or 1) >= 2 else 0


def _summarized(batches, cfg: AnalysisConfig, workers: int | None):
    """:func:`_summarize` of every ``(runs, read)`` batch (``read``: the ``ChunkRead`` of its
    trajectories), in their order: here, or by ``workers`` worker processes
    (:class:`analysis._workers.Workers`), which read the trajectories themselves."""
    from phasesweep.analysis._workers import Workers

    workers = default_workers() if workers is None else workers
    batches = iter(batches)
    first = list(itertools.islice(batches, 2))
    calls = ((runs, read, cfg) for runs, read in itertools.chain(first, batches))
    if workers < 1 or len(first) < 2:
        yield from (_summarize(*call) for call in calls)
        return
    with Workers(workers) as pool:
        yield from pool.map(_summarize, calls)


def _summarize(
    runs: pa.Table, read: Callable[[], pa.Table], cfg: AnalysisConfig
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """One batch: its ``summaries`` and ``plateaus`` rows, and what the scaling fits keep
    of its runs (``_FIT_INPUT`` and ``FIT_SUMMARY_COLUMNS``); ``read()`` gives its
    trajectories."""
    frame = runs.select(RUN_COLUMNS).to_pandas()
    s = ser.from_arrow(read(), TRAJECTORY_COLUMNS, frame["run_id"].to_numpy(object))
    summaries, plateaus = compute_summaries(frame, s, cfg)
    fit_input = frame[_FIT_INPUT].join(summaries[FIT_SUMMARY_COLUMNS])
    table = to_table("summaries", summaries, len(summaries))
    # what the rows were computed from (the catalog shows them while it is current)
    for column, source in (("source_attempt", "attempt"), ("source_finished_at", "finished_at")):
        i = table.schema.get_field_index(column)
        table = table.set_column(
            i, table.schema.field(i), runs[source].cast(table.schema.field(i).type)
        )
    return (
        table,
        to_table("plateaus", plateaus, len(plateaus)),
        pa.Table.from_pandas(fit_input, schema=_FIT_SCHEMA, preserve_index=False),
    )


def _col(df: pd.DataFrame, name: str) -> np.ndarray:
    if name not in df:
        return np.full(len(df), np.nan)
    return df[name].to_numpy(dtype=np.float64, na_value=np.nan)


def _none_nan(values) -> list:
    return [None if not np.isfinite(v) else float(v) for v in values]
