"""The "run a sweep" use case: plan (skip what the store holds, pack chunks), run, status.

The CLI (``phasesweep run`` / ``status``) and the Python API (``phasesweep.run``) are thin
layers over these functions; nothing here prints except the progress bar of
:func:`~phasesweep.pipeline._driver.run_chunks`.

Concurrency: the store is the single source of truth. A plan is a snapshot of what the
store held when it was made; trials claim their points in the store before training
(:mod:`phasesweep.storage._claims`) and re-read it, so points stored or being trained by
another launch are skipped or waited for, never trained twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from phasesweep.pipeline._driver import SweepOutcome, flops_estimate, run_chunks
from phasesweep.pipeline._grid import (
    Chunk,
    Point,
    axis_path,
    axis_values,
    grid_size,
    iter_points,
    make_chunks,
    member_bytes,
)
from phasesweep.pipeline._ray import connect, trial_slots
from phasesweep.pipeline.spec import (
    SpecError,
    SweepSpec,
    apply_override,
    load_spec,
    parse_override,
    parse_yaml,
    validate_spec,
)
from phasesweep.storage._catalog import sql_string
from phasesweep.storage._store import Store, as_store

#: What a spec can be given as: a YAML file, a raw dict (as in YAML), or a validated spec.
SpecSource = str | Path | Mapping[str, Any] | SweepSpec


def resolve_spec(source: SpecSource, overrides: Sequence[str] = ()) -> tuple[SweepSpec, dict]:
    """Validate ``source`` after applying ``overrides`` (``KEY=VALUE`` as ``--set``).

    Returns the spec and its raw dict (what the store keeps as the sweep's spec).
    Raises :class:`SpecError` (exit 2 in the CLI) naming the key and value.
    """
    if isinstance(source, str | Path):
        return load_spec(source, list(overrides))
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


def _grid_values(spec: SweepSpec) -> dict[str, list[Any]]:
    """Each grid axis as its dotted path → its values (``{range: …}`` etc. expanded)."""
    return {axis_path(a): axis_values(a, v) for a, v in spec.grid.items()}


def relaunch_diff(old: SweepSpec, new: SweepSpec) -> tuple[list[str], list[str], bool]:
    """What a relaunch changes against the stored spec of the same sweep name.

    Returns ``(base, grid, extends)``: lines ``key: old → new`` for the base config
    (everything but the grid and :data:`RELAUNCH_FREE`), the same for grid axes, and
    whether the new grid only adds values to the old axes (so every stored point is
    still a point of the new grid).
    """
    skip = {"grid", *RELAUNCH_FREE}
    a, b = (
        _flat({k: v for k, v in s.model_dump(mode="json").items() if k not in skip})
        for s in (old, new)
    )
    base = [
        f"{k}: {_show(a.get(k, '(absent)'))} → {_show(b.get(k, '(absent)'))}"
        for k in sorted(set(a) | set(b))
        if a.get(k, _ABSENT) != b.get(k, _ABSENT)
    ]
    ga, gb = _grid_values(old), _grid_values(new)
    grid = [
        f"grid.{k}: {_show(ga.get(k, '(absent)'))} → {_show(gb.get(k, '(absent)'))}"
        for k in sorted(set(ga) | set(gb))
        if ga.get(k) != gb.get(k)
    ]
    extends = set(ga) == set(gb) and all(all(v in gb[k] for v in ga[k]) for k in ga)
    return base, grid, extends


_ABSENT = object()


def _show(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) and value == "(absent)" else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def check_relaunch(store: Store, spec: SweepSpec, extend: bool) -> None:
    """Refuse (:class:`SpecError`) a launch whose spec differs from the one the store
    holds for the same sweep name, listing what changed; with ``extend``, a grid that
    only adds values to the stored axes (same base config) is accepted."""
    old = stored_spec(store, spec.name)
    if old is None:
        return
    base, grid, extends = relaunch_diff(old, spec)
    if not base and not grid:
        return
    if extend and not base and extends:
        return
    if base:
        hint = "the base config of a stored sweep cannot change: use a new sweep name"
    elif extend:
        hint = "--extend only adds values to the stored grid axes"
    else:
        hint = "pass --extend to add these grid points to the sweep, or use a new sweep name"
    changes = "; ".join(base + grid)
    raise SpecError(
        "name",
        spec.name,
        f"differs from the spec stored for this sweep ({changes}); {hint}",
        what="relaunch",
    )


@dataclass
class Plan:
    """What a launch would do: the grid's size, what the store already holds, the chunks
    to train. Only the points still to train are kept (a grid the store mostly holds
    costs memory for what is left, not for the whole grid)."""

    spec: SweepSpec
    raw: dict
    store: Store
    #: the spec file's leading comment block (kept with the stored spec: the report shows it)
    header: str
    total: int  # points of the grid (see grid.grid_size)
    todo: list[Point]
    chunks: list[Chunk]

    @property
    def skipped(self) -> int:
        """Points of the grid the store already holds."""
        return self.total - len(self.todo)

    @property
    def peak_bytes(self) -> int:
        """Estimated memory of the largest chunk (bytes)."""
        return max(
            (len(c.points) * member_bytes(c.points[0].config) for c in self.chunks), default=0
        )

    @property
    def flops(self) -> float:
        """Training FLOPs of the points still to train (forward + backward, all steps)."""
        return flops_estimate(self.todo)


def plan_sweep(
    source: SpecSource,
    store: Store | str | None = None,
    *,
    overrides: Sequence[str] = (),
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    extend: bool = False,
) -> Plan:
    """Expand the spec, skip the points ``store`` holds and pack the rest into chunks.

    ``address`` is only used to count the cluster's CPUs (at least one chunk per
    concurrent trial, so no core idles on a small grid); None counts this machine's.
    Writes nothing. The grid's size is checked against ``execution.max_points`` before
    it is expanded. A spec that differs from the one stored for the same sweep name is
    refused (:func:`check_relaunch`; ``extend`` lets the grid grow).
    """
    spec, raw = resolve_spec(source, overrides)
    store = as_store(store)
    check_relaunch(store, spec, extend)
    spec.check_at_time()
    total = grid_size(spec)
    done = store.done_run_ids(spec.name)
    # Chunks of the whole grid, less their stored points: a relaunch packs the same
    # chunks (same ids), so it finds the checkpoints of a killed launch's chunks.
    chunks = [
        Chunk(c.chunk_id, left)
        for c in make_chunks(
            list(iter_points(spec)), spec, min_chunks=trial_slots(address, cpus_per_trial)
        )
        if (left := tuple(p for p in c.points if p.run_id not in done))
    ]
    todo = [p for c in chunks for p in c.points]
    return Plan(spec, raw, store, _header(source), total, todo, chunks)


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
    if plan.chunks:
        connect(address)
    plan.store.write_spec(plan.spec.name, plan.header + yaml.safe_dump(plan.raw, sort_keys=False))
    return run_chunks(
        plan.store,
        plan.spec.name,
        plan.chunks,
        total=plan.total,
        skipped=plan.skipped,
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

    @property
    def done(self) -> int:
        """Runs that count as done (completed or diverged; failed ones are retried)."""
        return sum(n for _, status, n in self.counts if status != "failed")


def sweep_status(store: Store | str | None = None, sweep: str | None = None) -> Status:
    """Counts of stored runs by sweep and status; with ``sweep``, also its grid size.

    The counts come from the store (one grouped query), the grid size from the stored
    spec's axis sizes (:func:`~phasesweep.pipeline._grid.grid_size`): nothing is
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
    total = None
    if sweep is not None:
        spec = stored_spec(store, sweep)
        total = None if spec is None else grid_size(spec)
    return Status([tuple(r) for r in rows], total)
