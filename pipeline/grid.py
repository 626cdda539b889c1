"""Grid expansion, deterministic run ids, and packing points into chunks.

The grid is the Cartesian product of its axes, in the order the spec lists
them (the last axis varies fastest). Every point gets ``run_id`` = a hash of the
sweep name and its resolved :class:`~pipeline.spec.RunConfig`, so the same
point is the same run on every machine and every relaunch.

Points that share every tensor shape and code path are packed into chunks that
train as one vectorized ensemble; members of a chunk may differ only in the
fields of :data:`MEMBER_FIELDS`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from phasesweep.pipeline.spec import SHORT_NAMES, RunConfig, SpecError, SweepSpec
from pydantic import BaseModel, ValidationError

#: Fields that may differ between members of one chunk (one vectorized ensemble).
MEMBER_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "init_scale"),
    ("model", "layer_scales"),
    ("model", "leaky_slope"),
    ("train", "lr"),
    ("train", "seed"),
    ("data", "seed"),
    ("data", "noise_sigma"),
    ("data", "label_noise"),
    ("data", "delta"),
)

_RUN_SECTIONS = set(RunConfig.model_fields)


@dataclass(frozen=True)
class Point:
    """One grid point: its id, resolved config, and its coordinates on the grid axes."""

    run_id: str
    config: RunConfig
    coords: dict[str, Any]


@dataclass(frozen=True)
class Chunk:
    """Points trained together as one ensemble. ``chunk_id`` hashes the member run ids."""

    chunk_id: str
    points: tuple[Point, ...]


def axis_path(axis: str) -> str:
    """The dotted path of a grid axis (short names resolved)."""
    path = SHORT_NAMES.get(axis, axis)
    section = path.split(".", 1)[0]
    if "." not in path or section not in _RUN_SECTIONS:
        raise SpecError(
            f"grid.{axis}",
            axis,
            f"unknown axis: use a short name ({', '.join(SHORT_NAMES)}) or a dotted path "
            f"into {', '.join(sorted(_RUN_SECTIONS))}",
        )
    return path


def axis_values(axis: str, spec_value: Any) -> list[Any]:
    """Values of one axis: a non-empty list, ``{logspace: [a, b, n]}`` (10**a .. 10**b),
    ``{linspace: [a, b, n]}`` or ``{range: [start, stop]}`` / ``[start, stop, step]``."""
    key = f"grid.{axis}"
    if isinstance(spec_value, list):
        if not spec_value:
            raise SpecError(key, spec_value, "empty grid axis")
        return list(spec_value)
    if isinstance(spec_value, dict) and len(spec_value) == 1:
        ((kind, args),) = spec_value.items()
        if kind in ("logspace", "linspace"):
            ok = (
                isinstance(args, list)
                and len(args) == 3
                and all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
                and isinstance(args[2], int)
            )
            if not ok:
                raise SpecError(key, spec_value, f"{kind} takes [start, stop, count]")
            if args[2] < 1:
                raise SpecError(key, spec_value, "empty grid axis")
            fn = np.logspace if kind == "logspace" else np.linspace
            return [float(v) for v in fn(args[0], args[1], args[2])]
        if kind == "range":
            if not (
                isinstance(args, list)
                and 2 <= len(args) <= 3
                and all(isinstance(a, int) and not isinstance(a, bool) for a in args)
            ):
                raise SpecError(
                    key, spec_value, "range takes [start, stop] or [start, stop, step] (ints)"
                )
            values = list(range(*args))
            if not values:
                raise SpecError(key, spec_value, "empty grid axis")
            return values
    raise SpecError(
        key,
        spec_value,
        "expected a list of values, {logspace: [a, b, n]}, {linspace: [a, b, n]} "
        "or {range: [start, stop]}",
    )


def _set_path(cfg: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted ``path`` (without its section) in the section dict ``cfg``."""
    *parents, last = path.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _section_json(section: BaseModel) -> str:
    return section.model_dump_json()


def run_id_of(sweep: str, config: RunConfig) -> str:
    """Deterministic id: sha256 of the sweep name and the canonical JSON of each section."""
    return _run_id(sweep, [_section_json(getattr(config, s)) for s in _SECTIONS])


def _run_id(sweep: str, section_jsons: Sequence[str]) -> str:
    payload = "\n".join([sweep, *section_jsons])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


_SECTIONS: tuple[str, ...] = tuple(RunConfig.model_fields)


def _section_options(
    spec: SweepSpec, section: str, axes: list[tuple[str, str, list[Any]]]
) -> dict[tuple[int, ...], tuple[BaseModel, str]]:
    """Every combination of one section's axes, validated once: value indices → (model, JSON).

    Cross-field rules only relate fields of one section, so validating each
    section's combinations covers every point at a fraction of the cost.
    """
    base = getattr(spec, section)
    cls = type(base)
    options: dict[tuple[int, ...], tuple[BaseModel, str]] = {}
    for idx in itertools.product(*(range(len(values)) for _, _, values in axes)):
        raw = base.model_dump()
        for (_, path, values), i in zip(axes, idx):
            _set_path(raw, path.split(".", 1)[1], values[i])
        try:
            model = cls.model_validate(raw)
        except ValidationError as e:
            bad = [
                (a, values[i])
                for (a, path, values), i in zip(axes, idx)
                if not _valid_alone(base, path, values[i])
            ]
            if bad:
                raise SpecError(f"grid.{bad[0][0]}", bad[0][1], str(e.errors()[0]["msg"])) from None
            combo = {a: values[i] for (a, _, values), i in zip(axes, idx)}
            raise SpecError(
                "grid", combo, f"this combination is invalid: {e.errors()[0]['msg']}"
            ) from None
        options[idx] = (model, _section_json(model))
    return options


def _valid_alone(base: BaseModel, path: str, value: Any) -> bool:
    raw = base.model_dump()
    _set_path(raw, path.split(".", 1)[1], value)
    try:
        type(base).model_validate(raw)
    except ValidationError:
        return False
    return True


def expand(spec: SweepSpec) -> list[Point]:
    """All grid points of ``spec`` in grid order (last axis fastest), validated.

    Raises :class:`SpecError` naming the offending axis and value. Points that
    resolve to the same config (an axis listing a value twice) appear once.
    """
    axes = [(axis, axis_path(axis), axis_values(axis, v)) for axis, v in spec.grid.items()]
    by_section = {
        s: [i for i, (_, path, _) in enumerate(axes) if path.split(".")[0] == s] for s in _SECTIONS
    }
    options = {
        s: _section_options(spec, s, [axes[i] for i in idx]) for s, idx in by_section.items()
    }
    names = [a for a, _, _ in axes]
    points: list[Point] = []
    seen: set[str] = set()
    for combo in itertools.product(*(range(len(values)) for _, _, values in axes)):
        chosen = [options[s][tuple(combo[i] for i in by_section[s])] for s in _SECTIONS]
        run_id = _run_id(spec.name, [j for _, j in chosen])
        if run_id in seen:
            continue
        seen.add(run_id)
        config = RunConfig.model_construct(**{s: m for s, (m, _) in zip(_SECTIONS, chosen)})
        coords = {name: axes[i][2][c] for i, (name, c) in enumerate(zip(names, combo))}
        points.append(Point(run_id, config, coords))
    return points


def _section_key(section: BaseModel, name: str) -> str:
    d = section.model_dump(mode="json")
    for sec, field in MEMBER_FIELDS:
        if sec == name:
            d.pop(field, None)
    return json.dumps(d, sort_keys=True)


def shape_key(config: RunConfig, cache: dict[int, str] | None = None) -> str:
    """Everything but :data:`MEMBER_FIELDS`: points with equal keys can share a chunk.

    ``cache`` maps ``id(section)`` to its key; points from one :func:`expand`
    share section objects, so a cache kept over one call makes this cheap. Only
    valid while those objects are alive (ids are reused after collection).
    """
    parts = []
    for s in _SECTIONS:
        section = getattr(config, s)
        if cache is None:
            parts.append(_section_key(section, s))
        else:
            key = cache.get(id(section))
            if key is None:
                key = cache[id(section)] = _section_key(section, s)
            parts.append(key)
    return "|".join(parts)


def member_bytes(config: RunConfig) -> int:
    """Rough memory of one ensemble member in bytes: data, parameters with their
    gradient, initial copy and update, and the activations of forward and backward."""
    m, d = config.model, config.data
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    n_params = sum(a * b + (b if m.bias else 0) for a, b in zip(dims[:-1], dims[1:]))
    n_rows = d.n_train + d.n_test + config.metrics.probe_size
    activations = n_rows * sum(dims) * 3
    data = n_rows * (d.input_dim + d.output_dim)
    itemsize = 8 if config.train.dtype == "float64" else 4
    return itemsize * (4 * n_params + activations + data)


def flops_per_step(config: RunConfig) -> float:
    """Training FLOPs of one member per step: forward 2, backward 4 per weight per sample."""
    m, d, t = config.model, config.data, config.train
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    batch = t.batch_size if t.optimizer == "sgd" else d.n_train
    return 6.0 * batch * sum(a * b for a, b in zip(dims[:-1], dims[1:]))


def make_chunks(points: Sequence[Point], spec: SweepSpec, min_chunks: int = 1) -> list[Chunk]:
    """Pack points with equal :func:`shape_key` into chunks of at most
    ``execution.max_chunk_size`` members and at most ``execution.memory_budget_mb``.

    The chunks of a group are of equal size (±1), so no trial is left with a
    straggler of a few members. ``min_chunks``: split the grid into at least this
    many chunks where it has that many points, e.g. the number of trials that run
    at once (CPUs / CPUs per trial), so that every core gets a chunk. Cache
    efficiency does not depend on the chunk size: the trainer steps a chunk in
    cache-sized blocks of members (:class:`pipeline.models.EnsembleStep`).
    """
    groups: dict[str, list[Point]] = {}
    cache: dict[int, str] = {}
    for p in points:
        groups.setdefault(shape_key(p.config, cache), []).append(p)
    budget = spec.execution.memory_budget_mb * 2**20
    # chunks per group so that the whole grid has at least min_chunks, in proportion to size
    total = max(1, len(points))
    chunks: list[Chunk] = []
    for members in groups.values():
        size = max(1, min(spec.execution.max_chunk_size, budget // member_bytes(members[0].config)))
        n_chunks = max(-(-len(members) // size), -(-min_chunks * len(members) // total))
        n_chunks = min(n_chunks, len(members))
        bounds = np.linspace(0, len(members), n_chunks + 1).round().astype(int)
        for start, stop in zip(bounds[:-1], bounds[1:]):
            part = tuple(members[start:stop])
            chunks.append(Chunk(_hash_ids(p.run_id for p in part), part))
    return chunks


def _hash_ids(ids: Iterable[str]) -> str:
    return hashlib.sha256(",".join(ids).encode()).hexdigest()[:12]
