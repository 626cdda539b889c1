"""``phasesweep refine``: where a metric crosses a level along one axis, for every line.

A sweep's grid places most runs deep inside a phase. ``refine`` takes a stored sweep
(the *parent*), and for every value of its other grid axes (a *line*, e.g. one width
and depth) bisects the searched axis (default ``init_scale``) between the parent's grid
points where the seed-mean of the metric's final value crosses the level
(:mod:`pipeline.refine._levelset`). Every proposed point trains with all of the parent's seeds
(replicates near the boundary give its seed spread), and a whole batch of proposals —
every line's next point — trains as one vectorized ensemble per tensor shape.

Storage, all in the parent's store:

- the new runs are the sweep ``<parent>__refine_<metric>`` (:func:`child_name`), same
  tables, queryable like any other; its stored spec is the parent's with ``parent`` set
  and a grid holding every trained point. A refined point is a grid point of that sweep
  with a deterministic ``run_id``, and the store's done run_ids are the truth of what
  is trained;
- the Optuna study (one per metric, level and axis) is an append-only journal,
  ``refine/sweep=<child>/journal.log`` (:mod:`pipeline.refine._study`);
- the ``boundaries`` table (partition: the child sweep) is rewritten after every batch
  from the store and the journal.

Resume and concurrency: trials record their owner process, and asking is locked
(:mod:`pipeline.refine._study`), so two refines of one sweep never propose the same
point; a trial whose owner died on this host (killed refine) is adopted by the next
refine, which trains what the store lacks of it and tells it. An owner on another host
is taken to be alive, so a refine that died there leaves its points pending until it is
resumed on that host.
Refines of one metric at different levels (or axes) share the child sweep, so they
reuse each other's runs; their ``boundaries`` rows share its partition, rewritten
whole: two of them at the same time may drop each other's rows (a rerun restores them).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pyarrow as pa
import yaml
from optuna.trial import TrialState
from phasesweep.pipeline._axes import axis_path
from phasesweep.pipeline.grid import Point, expand, make_chunks
from phasesweep.pipeline.refine._levelset import (
    LINE,
    LevelSetSampler,
    LineState,
    X,
    coord,
    crossing,
)
from phasesweep.pipeline.refine._study import open_study, owner_alive, owner_id
from phasesweep.pipeline.spec import SHORT_NAMES, SpecError, parse_yaml, validate_spec
from phasesweep.storage import Store, open_catalog, schema

#: grid axes whose values are replicates of one point, not lines.
REPLICATE_AXES = ("train.seed", "data.seed")
#: runs columns that are axes, not metrics.
_NOT_METRICS = {"init_scale", "noise_sigma", "lr", "leaky_slope", "lr_effective"}


def metric_columns() -> dict[str, str]:
    """Metric name -> table it is read from: float columns of ``trajectories`` (final
    finite logged value) and of ``runs``."""
    out = {
        f.name: "runs"
        for f in schema.RUNS
        if pa.types.is_floating(f.type) and f.name not in _NOT_METRICS
    }
    out.update(
        {
            f.name: "trajectories"
            for f in schema.TRAJECTORIES
            if pa.types.is_floating(f.type) and f.name != "time"
        }
    )
    return out


def child_name(parent: str, metric: str) -> str:
    """The sweep that holds a refinement's runs."""
    return f"{parent}__refine_{metric}"


def final_values(store: Store, sweeps: Sequence[str], metric: str) -> dict[str, float]:
    """run_id -> final value of ``metric`` for the completed runs of ``sweeps``.

    Trajectory metrics: the value at the last logged step where it is finite. Diverged
    and failed runs have no value (they are left out, not averaged in).
    """
    table = metric_columns()[metric]  # a known column name: safe to put into SQL
    con = open_catalog(store)
    try:
        if table == "runs":
            sql = f"SELECT run_id, {metric} FROM runs WHERE sweep IN ? AND status = 'completed'"
        else:
            sql = (
                f"SELECT t.run_id, arg_max(t.{metric}, t.step) FILTER (WHERE isfinite(t.{metric})) "
                "FROM trajectories AS t JOIN runs AS r USING (sweep, run_id) "
                "WHERE t.sweep IN ? AND r.status = 'completed' GROUP BY t.run_id"
            )
        rows = con.execute(sql, [list(sweeps)]).fetchall()
    finally:
        con.close()
    return {r: float(v) for r, v in rows if v is not None and math.isfinite(v)}


@dataclass
class Refinement:
    """A validated refinement: the parent's grid split into lines, the child, the study.

    ``points[line][x]`` are the parent's points of a line at axis value ``x`` (one per
    seed); ``line_coords[line]`` the line's grid coordinates (grid keys as the parent
    spells them).
    """

    store: Store
    parent: str
    child: str
    metric: str
    level: float
    axis_key: str  # the parent's grid key of the axis
    log: bool
    tol: float
    budget: int | None
    per_line: int
    parent_raw: dict[str, Any]
    replicate_keys: list[str]
    seeds: list[dict[str, Any]]  # replicate coordinates, one dict per seed
    line_coords: dict[str, dict[str, Any]]
    points: dict[str, dict[float, list[Point]]]
    axis_values: list[float]
    study_name: str = ""
    values: dict[str, float] = field(default_factory=dict)

    @property
    def lines(self) -> list[str]:
        return list(self.line_coords)

    def child_points(self, line: str, x: float) -> list[Point]:
        """The child sweep's points at axis value ``x`` on ``line``: one per seed."""
        raw = copy.deepcopy(self.parent_raw)
        raw["name"], raw["parent"] = self.child, self.parent
        grid = {k: [v] for k, v in self.line_coords[line].items()}
        grid[self.axis_key] = [float(x)]
        for k in self.replicate_keys:
            grid[k] = sorted({s[k] for s in self.seeds})
        raw["grid"] = grid
        return expand(validate_spec(raw))

    def sampler(self) -> LevelSetSampler:
        """The study's sampler, seeded with the parent's seed means."""
        seeded = {
            line: [(self.u(x), m) for x, m in self.means(self.points[line]).items()]
            for line in self.lines
        }
        seeded = {k: [(u, m) for u, m in v if math.isfinite(m)] for k, v in seeded.items()}
        return LevelSetSampler(
            self.lines,
            seeded,
            self.level,
            self.tol,
            low=min(self.axis_values),
            high=max(self.axis_values),
            log=self.log,
            per_line=self.per_line,
        )

    def means(self, by_x: dict[float, list[Point]]) -> dict[float, float]:
        """Seed-mean of the metric at every x (NaN where no seed has a value)."""
        out = {}
        for x, pts in by_x.items():
            vals = [self.values[p.run_id] for p in pts if p.run_id in self.values]
            out[x] = float(np.mean(vals)) if vals else math.nan
        return out

    def u(self, x: float) -> float:
        """The search coordinate of an axis value (log10 on a log axis)."""
        return coord(x, self.log)

    def study(self) -> contextlib.AbstractContextManager[tuple[optuna.Study, Any, Any]]:
        """:func:`~pipeline.refine._study.open_study` of this refinement's study."""
        return open_study(self.store, self.child, self.study_name, self.sampler())


def plan_refinement(
    store: Store,
    sweep: str,
    metric: str,
    level: float,
    *,
    axis: str = "init_scale",
    budget: int | None = None,
    tol: float | None = None,
    per_line: int = 1,
) -> Refinement:
    """Validate a refinement against the stored parent; raises :class:`SpecError`
    naming the argument. Reads only."""
    if budget is not None and budget < 1:
        raise SpecError("--budget", budget, "must be >= 1", what="argument")
    if per_line < 1:
        raise SpecError("--per-line", per_line, "must be >= 1", what="argument")
    if not math.isfinite(level):
        raise SpecError("--level", level, "must be a finite number", what="argument")
    if sweep not in store.sweeps():
        raise SpecError("SWEEP", sweep, f"no such sweep in the store {store.uri}", what="argument")
    text = store.read_spec(sweep)
    if text is None:
        raise SpecError("SWEEP", sweep, "the store holds no spec of this sweep", what="argument")
    raw = parse_yaml(text)
    spec = validate_spec(raw)
    metrics = metric_columns()
    if metric not in metrics:
        raise SpecError(
            "--metric", metric, f"unknown metric; known: {', '.join(sorted(metrics))}", "argument"
        )
    paths = {axis_path(k): k for k in spec.grid}
    try:
        path = axis_path(axis)
    except SpecError:
        path = axis
    if path not in paths:
        raise SpecError(
            "--axis",
            axis,
            f"not an axis of sweep {sweep}; its axes: {', '.join(spec.grid)}",
            what="argument",
        )
    if path in REPLICATE_AXES:
        raise SpecError("--axis", axis, "seeds are replicates, not an axis to search", "argument")
    axis_key = paths[path]
    points = expand(spec)
    xs = sorted({p.coords[axis_key] for p in points})
    if len(xs) < 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in xs):
        raise SpecError(
            "--axis", axis, f"needs two or more numeric values, the grid has {xs[:5]}", "argument"
        )
    replicate_keys = [k for k in spec.grid if axis_path(k) in REPLICATE_AXES]
    line_keys = [k for k in spec.grid if k != axis_key and k not in replicate_keys]
    lines: dict[str, dict[str, Any]] = {}
    by_line: dict[str, dict[float, list[Point]]] = {}
    seeds: dict[str, dict[str, Any]] = {}
    for p in points:
        coords = {k: p.coords[k] for k in line_keys}
        key = json.dumps(coords, sort_keys=False, default=str)
        lines.setdefault(key, coords)
        by_line.setdefault(key, {}).setdefault(float(p.coords[axis_key]), []).append(p)
        seed = {k: p.coords[k] for k in replicate_keys}
        seeds.setdefault(json.dumps(seed, default=str), seed)
    log = all(v > 0 for v in xs)
    us = [coord(v, log) for v in xs]
    if tol is None:
        tol = min(b - a for a, b in zip(us, us[1:])) / 16
    elif not tol > 0:
        raise SpecError("--tol", tol, "must be > 0", what="argument")
    result = Refinement(
        store=store,
        parent=sweep,
        child=child_name(sweep, metric),
        metric=metric,
        level=float(level),
        axis_key=axis_key,
        log=log,
        tol=float(tol),
        budget=budget,
        per_line=per_line,
        parent_raw=raw,
        replicate_keys=replicate_keys,
        seeds=list(seeds.values()),
        line_coords=lines,
        points=by_line,
        axis_values=[float(v) for v in xs],
    )
    if budget is not None and budget < len(result.seeds):
        raise SpecError(
            "--budget",
            budget,
            f"a refined point trains all {len(result.seeds)} seeds: give at least that",
            what="argument",
        )
    # a non-integer axis value must validate (width, depth, ... cannot be bisected)
    try:
        line = result.lines[0]
        result.child_points(line, (xs[0] + xs[1]) / 2 if not log else math.sqrt(xs[0] * xs[1]))
    except SpecError as e:
        raise SpecError(
            "--axis", axis, f"cannot take values between grid points: {e.reason}", "argument"
        ) from None
    result.values = final_values(store, [sweep], metric)
    observed = list(result.values.values())
    if not observed:
        raise SpecError(
            "--metric", metric, f"sweep {sweep} has no finite final value of it", "argument"
        )
    lo, hi = min(observed), max(observed)
    if not lo <= level <= hi:
        raise SpecError(
            "--level",
            level,
            f"outside the observed range [{lo:.6g}, {hi:.6g}] of {metric}",
            "argument",
        )
    result.study_name = f"{metric}|{float(level)!r}|{path}"
    return result


# ----------------------------------------------------------------------------- the loop


@dataclass
class RefineOutcome:
    """What a refine did: runs trained and failed, batches, and the boundaries rows."""

    child: str
    trained: int = 0
    failed: int = 0
    batches: int = 0
    boundaries: pd.DataFrame | None = None


def _runs_used(study: optuna.Study, n_seeds: int) -> int:
    live = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.FAIL]
    return len(live) * n_seeds


def _claim(p: Refinement, study: optuna.Study, me: str) -> list[int]:
    """Under the lock: adopt trials of dead owners, then ask this batch. Trial numbers."""
    sampler: LevelSetSampler = study.sampler
    mine = []
    storage = study._storage  # optuna has no public setter for it
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if owner_alive(t.user_attrs.get("owner")):
            continue
        if LINE in t.params:
            storage.set_trial_user_attr(t._trial_id, "owner", me)
            mine.append(t.number)
        else:  # its owner died before the sampler gave it a point
            study.tell(t.number, state=TrialState.FAIL)
    while p.budget is None or _runs_used(study, len(p.seeds)) + len(p.seeds) <= p.budget:
        if sampler.next_params(study) is None:
            break
        trial = study.ask(sampler.search_space)
        trial.set_user_attr("owner", me)
        mine.append(trial.number)
    return mine


def _store_child_spec(p: Refinement, points: Sequence[Point]) -> None:
    """Store the child's spec: the parent's, ``parent`` set, grid = every axis value of
    the child's points (the stored one's merged in), so it holds every trained point."""
    raw = copy.deepcopy(p.parent_raw)
    raw["name"], raw["parent"] = p.child, p.parent
    raw["description"] = f"refinement of {p.parent}: {p.metric} = {p.level:g} along {p.axis_key}"
    old = p.store.read_spec(p.child)
    grid: dict[str, set] = {}
    if old is not None:
        for k, v in (parse_yaml(old).get("grid") or {}).items():
            grid.setdefault(k, set()).update(v if isinstance(v, list) else [])
    for pt in points:
        for k, v in pt.coords.items():
            grid.setdefault(k, set()).add(v)
    raw["grid"] = {k: sorted(v) for k, v in grid.items()}
    p.store.write_spec(p.child, yaml.safe_dump(raw, sort_keys=False))


def _train(
    p: Refinement, points: Sequence[Point], address: str | None, use_ray: bool
) -> tuple[int, int]:
    """Train the points the store lacks as one ensemble chunk per tensor shape; returns
    (points trained, points failed). A batch on Ray that Ctrl-C or SIGTERM stopped raises
    :class:`~pipeline.run._signals.Interrupted` once its trials have checkpointed."""
    from phasesweep.pipeline.run._driver import run_chunks
    from phasesweep.pipeline.run._trial import train_and_store

    done = p.store.done_run_ids(p.child)
    todo = [pt for pt in points if pt.run_id not in done]
    if not todo:
        return 0, 0
    spec = validate_spec({**p.parent_raw, "name": p.child})
    chunks = make_chunks(todo, spec, min_chunks=1)
    if use_ray:
        out = run_chunks(
            p.store, p.child, chunks, total=len(todo), skipped=0, address=address,
            progress=False, commit_every=spec.execution.commit_every_seconds,
        )  # fmt: skip
        out.raise_if_interrupted()  # the batch's trials checkpointed: the refine ends here
        return len(todo), len(out.failed)
    for c in chunks:
        train_and_store(p.store.uri, p.child, c, "cpu")
    return len(todo), 0


def refine(
    store: Store | str | None,
    sweep: str,
    metric: str,
    level: float,
    *,
    axis: str = "init_scale",
    budget: int | None = None,
    tol: float | None = None,
    per_line: int = 1,
    address: str | None = None,
    use_ray: bool = True,
    poll_seconds: float = 2.0,
    log=None,
) -> RefineOutcome:
    """Refine where ``metric`` crosses ``level`` along ``axis`` (see the module docstring).

    Batches go on until every bracketed line's bracket is at most ``tol`` wide (in
    log10 units on a log axis; default: the parent's finest spacing / 16), or the
    study has used ``budget`` runs (over all resumes). ``use_ray``: train batches as
    Ray Tune trials (``address`` as for ``run``), else in this process. Bad arguments
    raise :class:`SpecError` before anything is written. Returns the outcome, whose
    ``boundaries`` are the rows stored in the ``boundaries`` table.

    A batch with failed runs ends the refine (as ``run``: what is done stays done); an
    exception or interrupt while training fails the batch's trials. Either way the next
    refine proposes those points again and trains only what the store lacks.
    """
    store = store if isinstance(store, Store) else Store.open(store)
    p = plan_refinement(
        store, sweep, metric, level, axis=axis, budget=budget, tol=tol, per_line=per_line
    )
    log = log or (lambda msg: print(msg, file=sys.stderr))
    p.values.update(final_values(store, [p.child], metric))  # a resumed refinement's runs
    outcome = RefineOutcome(child=p.child)
    me = owner_id()
    with p.study() as (study, lock, sync):
        while True:
            with lock():
                mine = _claim(p, study, me)
            sync()
            if not mine:
                running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if any(owner_alive(t.user_attrs.get("owner")) for t in running):
                    # another refine trains points this one may need: wait for them
                    time.sleep(poll_seconds)
                    continue
                break
            trials = {t.number: t for t in study.get_trials(deepcopy=False)}
            batch = {n: p.child_points(trials[n].params[LINE], trials[n].params[X]) for n in mine}
            points = [pt for pts in batch.values() for pt in pts]
            _store_child_spec(p, points)
            log(
                f"refine {p.child}: batch {outcome.batches + 1}: {len(mine)} points, "
                f"{len(points)} runs"
            )
            try:
                trained, failed = _train(p, points, address, use_ray)
            except BaseException:  # e.g. Ctrl-C: the next refine proposes these again
                for n in mine:
                    study.tell(n, state=TrialState.FAIL)
                raise
            outcome.trained += trained
            outcome.failed += failed
            outcome.batches += 1
            p.values.update(final_values(store, [p.child], metric))
            done = store.done_run_ids(p.child)
            for n, pts in batch.items():
                vals = [p.values[pt.run_id] for pt in pts if pt.run_id in p.values]
                if any(pt.run_id not in done for pt in pts):
                    study.tell(n, state=TrialState.FAIL)  # proposed again by the next refine
                elif vals:
                    study.tell(n, float(np.mean(vals)))
                else:  # every seed diverged: trained, but no value
                    study.tell(n, state=TrialState.PRUNED)
            sync()
            outcome.boundaries = write_boundaries(p, study)
            if failed:  # as `run`: stop, keep what is done, a relaunch retries the rest
                break
        # once more when nothing is left: another refine may have finished points since
        outcome.boundaries = write_boundaries(p, study)
    return outcome


# ----------------------------------------------------------------------------- table


def boundary_rows(p: Refinement, study: optuna.Study | None = None) -> pd.DataFrame:
    """One ``boundaries`` row per line, from the parent's stored runs and the points of
    the study's finished trials (none without a study: the parent's grid alone)."""
    by_line = {k: {x: list(v) for x, v in d.items()} for k, d in p.points.items()}
    refined = {k: 0 for k in p.lines}
    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    trials = [] if study is None else study.get_trials(deepcopy=False, states=finished)
    if study is not None:  # after the trials: a finished trial's runs are in the store
        p.values.update(final_values(p.store, [p.child], p.metric))
    for t in trials:
        pts = p.child_points(t.params[LINE], t.params[X])
        by_line[t.params[LINE]].setdefault(float(t.params[X]), []).extend(pts)
        refined[t.params[LINE]] += sum(pt.run_id in p.values for pt in pts)
    u = p.u
    rows = []
    for line, by_x in by_line.items():
        means = p.means(by_x)
        state = LineState(known=[(u(x), m) for x, m in means.items() if math.isfinite(m)])
        b = state.bracket(p.level)
        row = {
            "parent": p.parent,
            "metric": p.metric,
            "level": p.level,
            "axis": p.axis_key,
            "axis_scale": "log" if p.log else "linear",
            "line": line,
            "bracketed": b is not None,
            "side": state.side(p.level),
            "converged": state.converged(p.level, p.tol),
            "tol": p.tol,
            "axis_low": min(p.axis_values),
            "axis_high": max(p.axis_values),
            "n_runs": sum(pt.run_id in p.values for pts in by_x.values() for pt in pts),
            "n_refine_runs": refined[line],
            "seed_boundaries": None,
        }
        for col in schema.LINE_COLUMNS:
            key = next((k for k in p.line_coords[line] if axis_path(k) == SHORT_NAMES[col]), None)
            row[col] = p.line_coords[line][key] if key else None
        if b is not None:
            x_of = {u(x): x for x in by_x}
            lo, hi = x_of[b[0]], x_of[b[1]]
            row.update(bracket_low=lo, bracket_high=hi)
            row["boundary"] = _back(p, crossing(b[0], means[lo], b[1], means[hi], p.level))
            seeds = _seed_crossings(p, by_x)
            row["seed_boundaries"] = [_back(p, c) for c in seeds]
            row["seed_spread"] = float(np.std(seeds, ddof=1)) if len(seeds) >= 2 else None
        rows.append(row)
    return pd.DataFrame(rows)


def _back(p: Refinement, u: float) -> float:
    return 10.0**u if p.log else u


def _seed_crossings(p: Refinement, by_x: dict[float, list[Point]]) -> list[float]:
    """Each seed's own crossing (u): the first sign change of its values on the line,
    interpolated; seeds without one are left out."""
    states: dict[str, LineState] = {}
    for x, pts in by_x.items():
        for pt in pts:
            if pt.run_id in p.values:
                seed = json.dumps({k: pt.coords[k] for k in p.replicate_keys}, default=str)
                states.setdefault(seed, LineState()).known.append((p.u(x), p.values[pt.run_id]))
    out = []
    for s in sorted(states):
        b = states[s].bracket(p.level)
        if b is not None:
            v = dict(states[s].known)
            out.append(crossing(b[0], v[b[0]], b[1], v[b[1]], p.level))
    return out


def write_boundaries(p: Refinement, study: optuna.Study) -> pd.DataFrame:
    """Rewrite the child's ``boundaries`` partition with this study's rows (rows of the
    child's other studies, other levels or axes, are kept)."""
    rows = boundary_rows(p, study)
    table = schema.to_table("boundaries", rows, len(rows))
    prev = p.store.read_analysis(p.child, "boundaries")
    if prev.num_rows:
        prev_df = prev.to_pandas()
        same = (
            (prev_df["metric"] == p.metric)
            & (prev_df["level"] == p.level)
            & (prev_df["axis"] == p.axis_key)
        )
        keep = prev.filter(pa.array(~same.to_numpy()))
        table = pa.concat_tables([schema.to_table("boundaries", keep), table])
    p.store.write_analysis(p.child, "boundaries", table)
    return rows
