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
from pydantic import ValidationError

from pipeline.spec import SHORT_NAMES, RunConfig, SpecError, SweepSpec, raise_from_validation

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
    section, *rest = path.split(".")
    node = cfg[section]
    for part in rest[:-1]:
        node = node.setdefault(part, {})
    node[rest[-1]] = value


def run_id_of(sweep: str, config: RunConfig) -> str:
    """Deterministic id: sha256 of the sweep name and the canonical JSON of the config."""
    payload = json.dumps(
        {"sweep": sweep, "config": config.model_dump(mode="json")},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def expand(spec: SweepSpec) -> list[Point]:
    """All grid points of ``spec``, each validated; raises :class:`SpecError` naming the axis."""
    axes = {axis: (axis_path(axis), axis_values(axis, v)) for axis, v in spec.grid.items()}
    base = spec.base().model_dump()
    names = list(axes)
    points: list[Point] = []
    seen: set[str] = set()
    for combo in itertools.product(*(axes[a][1] for a in names)):
        raw = json.loads(json.dumps(base))
        for axis, value in zip(names, combo):
            _set_path(raw, axes[axis][0], value)
        try:
            config = RunConfig.model_validate(raw)
        except ValidationError as e:
            bad = next(
                (a for a, v in zip(names, combo) if _invalid_alone(base, axes[a][0], v)), None
            )
            if bad is not None:
                raise SpecError(
                    f"grid.{bad}", dict(zip(names, combo))[bad], str(e.errors()[0]["msg"])
                ) from None
            raise_from_validation(e, raw)
        run_id = run_id_of(spec.name, config)
        if run_id in seen:  # e.g. a grid axis listing the same value twice
            continue
        seen.add(run_id)
        points.append(Point(run_id, config, dict(zip(names, combo))))
    return points


def _invalid_alone(base: dict[str, Any], path: str, value: Any) -> bool:
    raw = json.loads(json.dumps(base))
    _set_path(raw, path, value)
    try:
        RunConfig.model_validate(raw)
    except ValidationError:
        return True
    return False


def shape_key(config: RunConfig) -> str:
    """Everything but :data:`MEMBER_FIELDS`: points with equal keys can share a chunk."""
    d = config.model_dump(mode="json")
    for section, field in MEMBER_FIELDS:
        d[section].pop(field, None)
    return json.dumps(d, sort_keys=True)


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


def make_chunks(points: Sequence[Point], spec: SweepSpec) -> list[Chunk]:
    """Pack points with equal :func:`shape_key` into chunks of at most
    ``execution.max_chunk_size`` members and at most ``execution.memory_budget_mb``."""
    groups: dict[str, list[Point]] = {}
    for p in points:
        groups.setdefault(shape_key(p.config), []).append(p)
    budget = spec.execution.memory_budget_mb * 2**20
    chunks: list[Chunk] = []
    for members in groups.values():
        size = max(1, min(spec.execution.max_chunk_size, budget // member_bytes(members[0].config)))
        for start in range(0, len(members), size):
            part = tuple(members[start : start + size])
            chunks.append(Chunk(_hash_ids(p.run_id for p in part), part))
    return chunks


def _hash_ids(ids: Iterable[str]) -> str:
    return hashlib.sha256(",".join(ids).encode()).hexdigest()[:12]
