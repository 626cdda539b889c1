"""The "run a sweep" use case: plan (skip what the store holds, pack chunks), run, status.

The CLI (``phasesweep run`` / ``status``) and the Python API (``phasesweep.run``) are thin
layers over these functions; nothing here prints except the progress bar of
:func:`~phasesweep.pipeline.driver.run_chunks`.

Concurrency: the store is the single source of truth. A plan is a snapshot of what the
store held when it was made; points stored by someone else afterwards are skipped by the
trials themselves (each trial re-reads the store before training).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from phasesweep.pipeline.driver import SweepOutcome, flops_estimate, run_chunks, trial_slots
from phasesweep.pipeline.grid import Chunk, Point, grid_size, iter_points, make_chunks, member_bytes
from phasesweep.pipeline.spec import (
    SpecError,
    SweepSpec,
    apply_override,
    load_spec,
    parse_override,
    parse_yaml,
    validate_spec,
)
from phasesweep.storage.store import Store, as_store

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


@dataclass
class Plan:
    """What a launch would do: the grid's size, what the store already holds, the chunks
    to train. Only the points still to train are kept (a grid the store mostly holds
    costs memory for what is left, not for the whole grid)."""

    spec: SweepSpec
    raw: dict
    store: Store
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
) -> Plan:
    """Expand the spec, skip the points ``store`` holds and pack the rest into chunks.

    ``address`` is only used to count the cluster's CPUs (at least one chunk per
    concurrent trial, so no core idles on a small grid); None counts this machine's.
    Writes nothing. The grid is streamed: its size is checked against
    ``execution.max_points`` before it is expanded, and stored points are dropped
    before their configs are built.
    """
    spec, raw = resolve_spec(source, overrides)
    store = as_store(store)
    points = iter_points(spec, skip=store.done_run_ids(spec.name))
    todo = list(points)
    chunks = make_chunks(todo, spec, min_chunks=trial_slots(address, cpus_per_trial))
    return Plan(spec, raw, store, grid_size(spec), todo, chunks)


def run_sweep(
    source: SpecSource,
    store: Store | str | None = None,
    *,
    overrides: Sequence[str] = (),
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    max_retries: int = 2,
    progress: bool = True,
) -> SweepOutcome:
    """Train every point of the sweep that ``store`` does not hold yet, as Ray Tune trials.

    The same operation as ``phasesweep run``: same store, same resume semantics (a
    relaunch skips stored points and retries failed ones), same Ray default (an
    embedded local instance unless ``address`` names a cluster). Stores the spec
    first, then trains; returns counts of trained, diverged, skipped and failed points.
    """
    plan = plan_sweep(
        source, store, overrides=overrides, address=address, cpus_per_trial=cpus_per_trial
    )
    return execute(
        plan,
        address=address,
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        max_retries=max_retries,
        progress=progress,
    )


def execute(
    plan: Plan,
    *,
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    max_retries: int = 2,
    progress: bool = True,
) -> SweepOutcome:
    """Store the plan's spec and train its chunks (see :func:`run_sweep`)."""
    plan.store.write_spec(plan.spec.name, yaml.safe_dump(plan.raw, sort_keys=False))
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
    spec's axis sizes (:func:`~phasesweep.pipeline.grid.grid_size`): nothing is
    expanded, so a stored grid of any size answers in bounded memory and time.
    """
    from phasesweep.storage import run_query

    store = as_store(store)
    where = "" if sweep is None else "WHERE sweep = '" + sweep.replace("'", "''") + "'"
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
