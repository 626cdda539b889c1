"""The "run a sweep" use case: plan (skip what the store holds, pack chunks), run, status.

The CLI (``phasesweep run`` / ``status``) and the Python API (``phasesweep.run``) are thin
layers over these functions; nothing here prints except the progress bar of
:func:`~phasesweep.pipeline.run._driver.run_chunks`.

Concurrency: the store is the single source of truth. A plan is a snapshot of what the
store held when it was made; trials claim their points in the store before training
(:mod:`phasesweep.storage._claims`) and re-read it, so points stored or being trained by
another launch are skipped or waited for, never trained twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from phasesweep.pipeline._axes import axis_path, axis_values
from phasesweep.pipeline.grid import (
    Chunk,
    Grid,
    Point,
    check_at_time,
    flops_per_step,
    grid_size,
    member_bytes,
)
from phasesweep.pipeline.run._driver import SweepOutcome, run_chunks
from phasesweep.pipeline.run._plan import ChunkTask, expand_task, plan_chunks, plan_stored
from phasesweep.pipeline.run._ray import connect
from phasesweep.pipeline.run._resources import trial_resources
from phasesweep.pipeline.spec import (
    RunConfig,
    SpecError,
    SweepSpec,
    apply_override,
    excerpt,
    load_spec_and_raw,
    parse_override,
    parse_yaml,
    validate_spec,
)
from phasesweep.storage._catalog import UNANALYZED, sql_string
from phasesweep.storage._store import Store, as_store

#: What a spec can be given as: a YAML file, a raw dict (as in YAML), or a validated spec.
SpecSource = str | Path | Mapping[str, Any] | SweepSpec


def resolve_spec(source: SpecSource, overrides: Sequence[str] = ()) -> tuple[SweepSpec, dict]:
    """Validate ``source`` after applying ``overrides`` (``KEY=VALUE`` as ``--set``).

    Returns the spec and its raw dict (what the store keeps as the sweep's spec).
    Raises :class:`SpecError` (exit 2 in the CLI) naming the key and value.
    """
    if isinstance(source, str | Path):
        return load_spec_and_raw(source, list(overrides))
    if isinstance(source, SweepSpec):
        raw = source.model_dump(mode="json", exclude_none=True)
    elif isinstance(source, Mapping):
        raw = parse_yaml(yaml.safe_dump(dict(source)))  # a deep copy in YAML's own types
    else:
        raise SpecError("spec", type(source).__name__, "expected a path, a dict or a SweepSpec")
    for text in overrides:
        apply_override(raw, *parse_override(text))
    return validate_spec(raw), raw


def stored_spec(store: Store | str | None, sweep: str) -> SweepSpec | None:
    """The validated spec the store holds for ``sweep`` (None when it holds none)."""
    text = as_store(store).read_spec(sweep)
    return None if text is None else validate_spec(parse_yaml(text))


def stored_grid_size(store: Store | str | None, sweep: str) -> int | None:
    """Grid points of the spec the store holds for ``sweep`` (None when it holds none),
    from its axis sizes (:func:`~phasesweep.pipeline.grid._grid.grid_size`): nothing is
    expanded."""
    spec = stored_spec(store, sweep)
    return None if spec is None else grid_size(spec)


#: Spec sections that say how a sweep runs or is read, not what it trains: a relaunch may
#: change them (e.g. ``analysis.at_time``; ``analyze`` reads the stored spec's).
RELAUNCH_FREE = ("execution", "analysis", "plots")


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (lists are leaves)."""
    if not isinstance(node, Mapping):
        return {prefix.rstrip("."): node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def _at(node: Any, path: str) -> Any:
    """The value at a dotted ``path`` of nested mappings."""
    for key in path.split("."):
        node = node[key]
    return node


def _axes(spec: SweepSpec, paths: Sequence[str]) -> dict[str, list[Any]]:
    """The values each of ``paths`` takes on the spec's grid: a grid axis's values, or the
    base config's value for a path the grid does not sweep (``{range: …}`` etc. expanded)."""
    gridded = {axis_path(a): list(axis_values(a, v)) for a, v in spec.grid.items()}
    base = spec.base().model_dump(mode="json")
    return {p: gridded[p] if p in gridded else [_at(base, p)] for p in paths}


def _missing(values: Sequence[Any], among: Sequence[Any]) -> list[Any]:
    """The items of ``values`` that ``among`` lacks (by ``==``, as ``1 == 1.0``)."""
    try:
        pool: Any = set(among)
    except TypeError:  # unhashable axis values (lists, dicts): compare one by one
        pool = among
    return [v for v in values if v not in pool]


@dataclass(frozen=True)
class RelaunchDiff:
    """How a relaunch's spec differs from the stored spec of the same sweep name.

    ``base`` and ``grid``: lines ``key: old → new`` for the base config (everything but
    the grid and :data:`RELAUNCH_FREE`) and for the grid axes. ``added`` and
    ``dropped``: per axis (dotted path), the values the new grid has and the old one
    lacks, and the reverse; an axis that one spec does not sweep takes its base value
    there. Without base changes, every point of the new grid is a point of the stored
    grid iff nothing is ``added``, and the reverse iff nothing is ``dropped``.
    """

    base: list[str]
    grid: list[str]
    added: dict[str, list[Any]]
    dropped: dict[str, list[Any]]


def relaunch_diff(old: SweepSpec, new: SweepSpec) -> RelaunchDiff:
    """What a relaunch changes against the stored spec of the same sweep name."""
    skip = {"grid", *RELAUNCH_FREE}
    a, b = (
        _flat({k: v for k, v in s.model_dump(mode="json").items() if k not in skip})
        for s in (old, new)
    )
    base = [
        f"{k}: {_show(a.get(k, _ABSENT))} → {_show(b.get(k, _ABSENT))}"
        for k in sorted(set(a) | set(b))
        if a.get(k, _ABSENT) != b.get(k, _ABSENT)
    ]
    ga = {axis_path(k): list(axis_values(k, v)) for k, v in old.grid.items()}
    gb = {axis_path(k): list(axis_values(k, v)) for k, v in new.grid.items()}
    # an axis is named as the user wrote it (``grid.seed``, not ``grid.train.seed``)
    written = {axis_path(k): k for spec in (old, new) for k in spec.grid}
    grid = [
        f"grid.{written[k]}: {_show(ga.get(k, _ABSENT))} → {_show(gb.get(k, _ABSENT))}"
        for k in sorted(set(ga) | set(gb))
        if ga.get(k) != gb.get(k)
    ]
    paths = sorted(set(ga) | set(gb))
    va, vb = _axes(old, paths), _axes(new, paths)
    added = {p: extra for p in paths if (extra := _missing(vb[p], va[p]))}
    dropped = {p: extra for p in paths if (extra := _missing(va[p], vb[p]))}
    return RelaunchDiff(base, grid, added, dropped)


_ABSENT = object()


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else excerpt(value)


def check_relaunch(store: Store, spec: SweepSpec, raw: dict, extend: bool) -> dict:
    """Check a launch against the spec the store holds for the same sweep name, and
    return the raw spec to store for the sweep (``raw`` when the store holds none).

    Accepted: the same base config (:data:`RELAUNCH_FREE` sections may change) with a
    grid that is part of the stored one (a subset relaunch: the stored grid is kept
    whole), or, with ``extend``, one that adds values to its axes (the stored grid
    becomes the one that covers both: each axis takes the values of both, so it holds
    every stored point). Anything else is refused (:class:`SpecError`) with what
    changed and a command that works instead: ``--extend``, or a new sweep name.
    """
    text = store.read_spec(spec.name)
    if text is None:
        return raw
    old_raw = parse_yaml(text)
    old = validate_spec(old_raw)
    diff = relaunch_diff(old, spec)
    if diff.base or (diff.added and not extend):
        raise SpecError(
            "name", spec.name, _refusal(store, spec.name, diff, extend), what="relaunch"
        )
    grid = _covering_grid(old, old_raw.get("grid") or {}, raw.get("grid") or {}, diff)
    return {**raw, "grid": grid}


def _refusal(store: Store, name: str, diff: RelaunchDiff, extend: bool) -> str:
    """The reason of a refused relaunch: the fix first (the message may be cut), then
    what changed."""
    fresh = _free_name(store, name)
    renamed = f"--set name={fresh} (in Python: overrides=['name={fresh}'])"
    if diff.base:
        fix = f"a stored sweep keeps its base config: run this as a new sweep with {renamed}"
        changes = diff.base + diff.grid
    else:
        fix = (
            "the grid adds points to the stored sweep: pass --extend (in Python: "
            f"extend=True) to train them as part of it, or {renamed}"
        )
        changes = diff.grid
    return f"differs from the spec stored for this sweep; {fix}; changed: {'; '.join(changes)}"


def _free_name(store: Store, name: str) -> str:
    """``NAME_2``, ``NAME_3``, …: the first that the store does not hold."""
    taken = set(store.sweeps())
    return next(f"{name}_{i}" for i in range(2, len(taken) + 3) if f"{name}_{i}" not in taken)


def _covering_grid(old: SweepSpec, old_grid: dict, new_grid: dict, diff: RelaunchDiff) -> dict:
    """The stored grid after an accepted relaunch (raw forms and keys as written).

    Nothing added: the stored grid (it holds the new one). Nothing dropped: the new grid
    (it holds the stored one). Else each axis that gains values lists the stored grid's
    values, then the added ones.
    """
    if not diff.added:
        return old_grid
    if not diff.dropped:
        return new_grid
    spelled = {axis_path(k): k for k in new_grid} | {axis_path(k): k for k in old_grid}
    grid = dict(old_grid)
    for path, values in diff.added.items():
        grid[spelled[path]] = _axes(old, [path])[path] + values
    return grid


@dataclass
class Plan:
    """What a launch would do: the grid's size, what the store already holds, the chunks
    to train. Chunks are descriptors (:class:`~pipeline.run._plan.ChunkTask`, a few integers
    each): a plan costs memory for its chunks, not for its points, and ``todo`` and
    ``chunks`` expand them on request (O(points): for small grids and inspection)."""

    spec: SweepSpec
    raw: dict
    store: Store
    #: the spec file's leading comment block (kept with the stored spec: the report shows it)
    header: str
    total: int  # points of the grid (see grid.grid_size)
    grid: Grid
    #: the chunks with points to train, as descriptors
    tasks: list[ChunkTask]
    #: points of the grid the store held when the plan was made
    skipped: int
    #: when the plan read the store (epoch seconds; see :func:`pipeline.run._trial.stored_reads`)
    planned_at: float
    #: the device memory one trial plans for (bytes): None for CPU trials
    device_memory: int | None = None

    @property
    def chunks(self) -> list[Chunk]:
        """The chunks with their points (expanded from ``tasks``)."""
        return [expand_task(self.grid, t) for t in self.tasks]

    @property
    def todo(self) -> list[Point]:
        """The points still to train, in chunk order. Points the store held under chunks
        of another layout are left out where the plan found them (see
        :func:`~pipeline.run._plan.plan_stored`); otherwise read here."""
        chunks = self.chunks
        if sum(len(c.points) for c in chunks) + self.skipped == self.total:
            return [p for c in chunks for p in c.points]
        done = self.store.done_run_ids(self.spec.name)
        return [p for c in chunks for p in c.points if p.run_id not in done]

    @property
    def to_train(self) -> int:
        """Points still to train: the grid's points less those the store holds."""
        return self.total - self.skipped

    def group_config(self, task: ChunkTask) -> RunConfig:
        """The config of a chunk's group (its shapes, steps and code paths)."""
        return self.grid.group_config(task.group)

    @property
    def peak_bytes(self) -> int:
        """Estimated memory of the largest chunk (bytes)."""
        sized = {t.group: member_bytes(self.group_config(t)) for t in self.tasks}
        return max((t.size * sized[t.group] for t in self.tasks), default=0)

    @property
    def flops(self) -> float:
        """Training FLOPs of the points still to train (forward + backward, all steps)."""
        per = {t.group: flops_per_step(self.group_config(t)) for t in self.tasks}
        return float(sum((t.size - t.stored_count) * per[t.group] * t.steps for t in self.tasks))


def plan_sweep(
    source: SpecSource,
    store: Store | str | None = None,
    *,
    overrides: Sequence[str] = (),
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    device_memory: float | None = None,
    extend: bool = False,
) -> Plan:
    """Plan the spec's grid into chunks and skip what ``store`` holds.

    ``address`` is only used to count the cluster's trial slots (at least one chunk per
    concurrent trial, so no core idles on a small grid); None counts this machine's.
    With ``gpus_per_trial`` the chunks are sized for a GPU trial (see
    :func:`~pipeline.grid._cost.chunk_members`): ``gpus_per_trial`` times one GPU's memory,
    ``device_memory`` GiB where given (see :func:`pipeline.run._resources.trial_resources`).
    Writes nothing. The grid's size is checked against ``execution.max_points`` before
    anything else. A spec that differs from the one stored for the same sweep name is
    refused (:func:`check_relaunch`; ``extend`` lets the grid grow).
    """
    spec, raw = resolve_spec(source, overrides)
    store = as_store(store)
    raw = check_relaunch(store, spec, raw, extend)
    check_at_time(spec)
    grid = Grid(spec)
    total = grid_size(spec)
    slots, memory = trial_resources(address, cpus_per_trial, gpus_per_trial, device_memory)
    planned_at = time.time()
    tasks = plan_chunks(grid, min_chunks=slots, device_memory=memory)
    tasks, skipped = plan_stored(grid, tasks, store)
    return Plan(spec, raw, store, _header(source), total, grid, tasks, skipped, planned_at, memory)


def _header(source: SpecSource) -> str:
    """The leading ``#`` comment lines of a spec file (with their newlines), or ""."""
    if not isinstance(source, str | Path):
        return ""
    lines = []
    with open(source, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.lstrip().startswith("#"):
                break
            lines.append(line if line.endswith("\n") else line + "\n")
    return "".join(lines)


def execute(
    plan: Plan,
    *,
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    max_retries: int = 2,
    progress: bool = True,
) -> SweepOutcome:
    """Connect to Ray, store the plan's spec and train its chunks (``phasesweep.run``).

    Nothing is written when the connection fails (:class:`SpecError` on ``--address``).
    """
    if plan.tasks:
        connect(address)
    plan.store.write_spec(plan.spec.name, plan.header + yaml.safe_dump(plan.raw, sort_keys=False))
    return run_chunks(
        plan.store,
        plan.spec.name,
        plan.tasks,
        total=plan.total,
        skipped=plan.skipped,
        grid=plan.grid,
        planned_at=plan.planned_at,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        max_retries=max_retries,
        progress=progress,
        commit_every=plan.spec.execution.commit_every_seconds,
    )


@dataclass
class Status:
    """Stored runs of a sweep (or of all sweeps) by status; ``total`` from the stored spec."""

    counts: list[tuple[str, str, int]]  # (sweep, status, runs)
    total: int | None  # points of the sweep's grid; None for all sweeps or without a spec
    #: sweep -> its runs without a current summary (new, trained again or never analyzed:
    #: figures cannot show them until ``analyze``, which plot and report run first); sweeps
    #: with none are left out
    unanalyzed: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        """Runs that count as done (completed or diverged; failed ones are retried)."""
        return sum(n for _, status, n in self.counts if status != "failed")


def sweep_status(store: Store | str | None = None, sweep: str | None = None) -> Status:
    """Counts of stored runs by sweep and status; with ``sweep``, also its grid size.

    The counts come from the store (one grouped query), the grid size from the stored
    spec's axis sizes (:func:`~phasesweep.pipeline.grid._grid.grid_size`): nothing is
    expanded, so a stored grid of any size answers in bounded memory and time.
    """
    from phasesweep.storage import run_query

    store = as_store(store)
    where = "" if sweep is None else f"WHERE sweep = {sql_string(sweep)}"
    _, rows = run_query(
        store,
        f"SELECT sweep, status, count(*) AS runs FROM runs {where} "
        "GROUP BY sweep, status ORDER BY sweep, status",
    )
    _, unanalyzed = run_query(  # the runs the summaries view has no current row of
        store,
        f"SELECT sweep, count(*) FROM runs AS r {where or 'WHERE true'} AND {UNANALYZED} "
        "GROUP BY sweep ORDER BY sweep",
    )
    total = None if sweep is None else stored_grid_size(store, sweep)
    return Status([tuple(r) for r in rows], total, dict(unanalyzed))
