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

import functools
import hashlib
import itertools
import json
import math
from collections.abc import Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from phasesweep.pipeline.spec import (
    SHORT_NAMES,
    RunConfig,
    SpecError,
    SweepSpec,
    did_you_mean,
    excerpt,
)
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
    if path not in _FIELD_PATHS:
        raise SpecError(
            f"grid.{axis}",
            axis,
            "unknown axis"
            + did_you_mean(axis, [*SHORT_NAMES, *_FIELD_PATHS])
            + f": use a short name ({', '.join(SHORT_NAMES)}) or a dotted path "
            f"into {', '.join(sorted(_RUN_SECTIONS))}",
        )
    return path


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of the fields below ``model``'s sections (nested sections and their
    fields included): what a grid axis may name."""
    paths = []
    for name, field in model.model_fields.items():
        if prefix:
            paths.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            paths += _field_paths(field.annotation, f"{prefix}{name}.")
    return paths


_FIELD_PATHS = _field_paths(RunConfig)

_AXIS_FORMS = (
    "expected a list of values, {logspace: [a, b, n]}, {linspace: [a, b, n]} "
    "or {range: [start, stop]}"
)


def axis_size(axis: str, spec_value: Any) -> int:
    """Number of values of one axis, from its spec alone (nothing is materialized).

    The forms are those of :func:`axis_values`; a malformed or empty axis, or a
    range with step 0, is a :class:`SpecError` naming ``grid.AXIS``.
    """
    key = f"grid.{axis}"
    if isinstance(spec_value, list):
        n = len(spec_value)
    elif isinstance(spec_value, dict) and len(spec_value) == 1:
        ((kind, args),) = spec_value.items()
        if kind in ("logspace", "linspace"):
            if not (
                isinstance(args, list)
                and len(args) == 3
                and all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
                and isinstance(args[2], int)
            ):
                raise SpecError(key, spec_value, f"{kind} takes [start, stop, count]")
            n = args[2]
        elif kind == "range":
            if not (
                isinstance(args, list)
                and 2 <= len(args) <= 3
                and all(isinstance(a, int) and not isinstance(a, bool) for a in args)
            ):
                raise SpecError(
                    key, spec_value, "range takes [start, stop] or [start, stop, step] (ints)"
                )
            start, stop, step = (*args, 1)[:3]
            if step == 0:
                raise SpecError(key, spec_value, "range step must not be 0")
            n = max(0, -((start - stop) // step))  # len(range(...)), also beyond sys.maxsize
        else:
            raise SpecError(key, spec_value, _AXIS_FORMS)
    else:
        raise SpecError(key, spec_value, _AXIS_FORMS)
    if n < 1:
        raise SpecError(key, spec_value, "empty grid axis")
    return n


def axis_values(axis: str, spec_value: Any) -> Sequence[Any]:
    """Values of one axis: a non-empty list, ``{logspace: [a, b, n]}`` (10**a .. 10**b),
    ``{linspace: [a, b, n]}`` or ``{range: [start, stop]}`` / ``[start, stop, step]``.

    A range stays a ``range`` (no list of its values is built); the spaced forms must
    stay finite (``{logspace: [0, 400, 3]}`` overflows to inf and is an error).
    """
    axis_size(axis, spec_value)  # checks the form
    if isinstance(spec_value, list):
        return list(spec_value)
    ((kind, args),) = spec_value.items()
    if kind == "range":
        return range(*args)
    fn = np.logspace if kind == "logspace" else np.linspace
    with np.errstate(over="ignore", invalid="ignore"):
        values = fn(args[0], args[1], args[2])
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)][0]
        raise SpecError(f"grid.{axis}", spec_value, f"{kind} reaches {bad}, not a finite number")
    return values.tolist()


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

#: Sections with at most this many combinations of their axes are validated up front,
#: each combination once; larger ones as the iteration reaches them (memory bounded).
EAGER_COMBINATIONS = 4096


@dataclass(frozen=True)
class _Axis:
    name: str
    path: str  # dotted path into RunConfig
    values: Sequence[Any]


class _SectionOptions:
    """The validated configs of one RunConfig section over the combinations of its axes.

    ``get(idx)`` (idx: one value index per axis of the section) returns the section
    model, its JSON and whether idx is the first combination, in grid order, that
    gives this JSON (a later one repeats a point: an axis listing a value twice).
    Cross-field rules only relate fields of one section, so validating each section's
    combinations covers every point at a fraction of the cost.

    Small sections (:data:`EAGER_COMBINATIONS`) are validated up front, so their errors
    come before any point. Larger ones are validated when the iteration reaches a
    combination and only the last one is kept. Repeats are recognised by a 16-byte
    digest per distinct JSON; that is exact because the grid's iteration (last axis
    fastest) first reaches the combinations of one section in that section's own
    lexicographic order, so the first combination seen with a JSON is also the first
    in grid order. A large section needs no digests when its axes set distinct fields
    to strictly monotone values (ranges, spaces, sorted lists) that validate unchanged:
    then every combination is a different config (a value changed by validation is
    an error there).
    """

    def __init__(self, spec: SweepSpec, section: str, axes: list[_Axis]) -> None:
        self.base: BaseModel = getattr(spec, section)
        self.axes = axes
        self.sizes = [len(a.values) for a in axes]
        self.count = math.prod(self.sizes)
        self.eager = self.count <= EAGER_COMBINATIONS
        self.track = self.eager or not _distinct_combinations(axes)
        self._first: dict[bytes, int] = {}  # JSON digest -> flat index of its first combination
        self._known: dict[tuple[int, ...], tuple[BaseModel, str, bool]] = {}
        if self.eager:
            for idx in itertools.product(*map(range, self.sizes)):
                self._known[idx] = self._validate(idx)

    @property
    def distinct(self) -> int:
        """Distinct configs of this section (a large one counts every combination)."""
        return sum(first for _, _, first in self._known.values()) if self.eager else self.count

    def get(self, idx: tuple[int, ...]) -> tuple[BaseModel, str, bool]:
        found = self._known.get(idx)
        if found is None:
            found = self._validate(idx)
            self._known = {idx: found}  # large sections: only the last combination
        return found

    def _validate(self, idx: tuple[int, ...]) -> tuple[BaseModel, str, bool]:
        raw = self.base.model_dump()
        for a, i in zip(self.axes, idx):
            _set_path(raw, a.path.split(".", 1)[1], a.values[i])
        try:
            model = type(self.base).model_validate(raw)
        except ValidationError as e:
            bad = [
                (a.name, a.values[i])
                for a, i in zip(self.axes, idx)
                if not _valid_alone(self.base, a.path, a.values[i])
            ]
            if bad:
                raise SpecError(f"grid.{bad[0][0]}", bad[0][1], str(e.errors()[0]["msg"])) from None
            combo = {a.name: a.values[i] for a, i in zip(self.axes, idx)}
            raise SpecError(
                "grid", combo, f"this combination is invalid: {e.errors()[0]['msg']}"
            ) from None
        text = _section_json(model)
        if not self.track:
            for a, i in zip(self.axes, idx):
                got = functools.reduce(getattr, a.path.split(".")[1:], model)
                if got != a.values[i]:
                    raise SpecError(
                        f"grid.{a.name}",
                        a.values[i],
                        f"becomes {excerpt(got)} when validated; a grid section over "
                        f"{EAGER_COMBINATIONS} combinations takes values as they validate",
                    )
            return model, text, True
        flat = 0
        for i, size in zip(idx, self.sizes):
            flat = flat * size + i
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        return model, text, self._first.setdefault(digest, flat) == flat


def _distinct_combinations(axes: list[_Axis]) -> bool:
    """Whether the axes set distinct fields (none inside another) to strictly monotone
    values, so that different combinations are different configs if validation
    leaves the values unchanged. O(1) memory."""
    paths = sorted(a.path + "." for a in axes)
    if any(b.startswith(a) for a, b in itertools.pairwise(paths)):
        return False
    for a in axes:
        if isinstance(a.values, range):
            continue
        try:
            up = all(x < y for x, y in itertools.pairwise(a.values))
            if not (up or all(x > y for x, y in itertools.pairwise(a.values))):
                return False
        except TypeError:  # values that do not compare (mixed types, lists of lists)
            return False
    return True


def _valid_alone(base: BaseModel, path: str, value: Any) -> bool:
    raw = base.model_dump()
    _set_path(raw, path.split(".", 1)[1], value)
    try:
        type(base).model_validate(raw)
    except ValidationError:
        return False
    return True


def _grid(spec: SweepSpec, bounded: bool) -> tuple[list[_Axis], dict[str, list[int]]]:
    """The axes (values materialized, ranges lazy) and each section's axis positions.

    ``bounded``: first check that the product of the axis sizes is at most
    ``execution.max_points``, before any value is computed.
    """
    paths = [axis_path(axis) for axis in spec.grid]
    if bounded:
        total = math.prod(axis_size(axis, v) for axis, v in spec.grid.items())
        limit = spec.execution.max_points
        if total > limit:
            raise SpecError(
                "grid",
                spec.grid,
                f"{total} points exceed execution.max_points = {limit} "
                "(raise it for a larger grid)",
            )
    axes = [
        _Axis(axis, path, axis_values(axis, v)) for (axis, v), path in zip(spec.grid.items(), paths)
    ]
    by_section = {
        s: [i for i, a in enumerate(axes) if a.path.split(".")[0] == s] for s in _SECTIONS
    }
    return axes, by_section


def grid_size(spec: SweepSpec) -> int:
    """Number of points of the grid, without expanding it (memory and time bounded).

    The product over sections of their distinct configs, as :func:`iter_points` yields
    them: exact for sections of at most :data:`EAGER_COMBINATIONS` combinations and for
    larger ones whose values cannot repeat (ranges, spaces, sorted lists); the product
    of the axis sizes for a large section whose values may repeat. Not bounded by
    ``execution.max_points``: it also sizes stored grids.
    """
    total = 1
    for section in _SECTIONS:
        names = [a for a in spec.grid if axis_path(a).split(".")[0] == section]
        count = math.prod(axis_size(a, spec.grid[a]) for a in names)
        if count <= EAGER_COMBINATIONS:  # values of large axes are never computed here
            axes = [_Axis(a, axis_path(a), axis_values(a, spec.grid[a])) for a in names]
            count = _SectionOptions(spec, section, axes).distinct
        total *= count
    return total


def iter_points(spec: SweepSpec, skip: Container[str] = frozenset()) -> Iterator[Point]:
    """The grid points of ``spec`` one at a time, in grid order (last axis fastest).

    Raises :class:`SpecError` naming the offending axis and value: the grid's size
    (over ``execution.max_points``), the axes' forms and the small sections' values
    at once; a bad value of a large section when the iteration reaches it. Points that
    resolve to the same config (an axis listing a value twice) appear once; points
    whose run_id is in ``skip`` are left out before their config is built. A point
    whose scaled learning rate (:func:`member_lr`) is not finite and > 0 is an error. Memory:
    the axes, the small sections' configs and a digest per config of the large ones;
    no point is kept.
    """
    axes, by_section = _grid(spec, bounded=True)
    options = {s: _SectionOptions(spec, s, [axes[i] for i in by_section[s]]) for s in _SECTIONS}
    sections = [(s, options[s], by_section[s]) for s in _SECTIONS]

    def points() -> Iterator[Point]:
        for combo in itertools.product(*(range(len(a.values)) for a in axes)):
            chosen = [opt.get(tuple(combo[i] for i in pos)) for _, opt, pos in sections]
            if not all(first for _, _, first in chosen):
                continue
            run_id = _run_id(spec.name, [text for _, text, _ in chosen])
            if run_id in skip:
                continue
            config = RunConfig.model_construct(
                **{s: m for (s, _, _), (m, _, _) in zip(sections, chosen)}
            )
            coords = {a.name: a.values[c] for a, c in zip(axes, combo)}
            _check_lr(config, coords)
            yield Point(run_id, config, coords)

    return points()


def expand(spec: SweepSpec) -> list[Point]:
    """All grid points of ``spec`` in grid order (last axis fastest), validated.

    Raises :class:`SpecError` naming the offending axis and value. Points that
    resolve to the same config (an axis listing a value twice) appear once. A list
    of :func:`iter_points`; large grids are better streamed from there.
    """
    return list(iter_points(spec))


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


def member_lr(config: RunConfig) -> float:
    """Base learning rate after the spec's scaling rule (``train.lr_scaling``).

    Raises ``OverflowError`` where the power overflows a float (see :func:`iter_points`,
    which refuses such points before they are trained).
    """
    s = config.train.lr_scaling
    return (
        config.train.lr
        * max(config.model.init_scale, s.init_scale_floor)
        ** (s.init_scale_power + s.init_scale_depth_power * (config.model.depth - 1))
        * config.model.width**s.width_power
    )


def _check_lr(config: RunConfig, coords: dict[str, Any]) -> None:
    """Refuse a point whose scaled learning rate is not a finite number > 0."""
    try:
        lr = member_lr(config)
    except OverflowError:
        lr = math.inf
    if not (math.isfinite(lr) and lr > 0):
        raise SpecError(
            "grid" if coords else "train.lr_scaling",
            coords or config.train.lr_scaling.model_dump(),
            f"the scaled learning rate (train.lr_scaling) of this point is {lr}, "
            "not a finite number > 0",
        )


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


def step_rows(config: RunConfig) -> int:
    """Samples one training step sees: the minibatch for SGD, the training set for GD."""
    t = config.train
    return t.batch_size if t.optimizer == "sgd" else config.data.n_train


def flops_per_step(config: RunConfig) -> float:
    """Training FLOPs of one member per step (see :func:`step_flops`)."""
    m, d = config.model, config.data
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    return step_flops(dims, step_rows(config))


def step_flops(dims: Sequence[int], rows: int) -> float:
    """FLOPs of one training step of one member: forward 2, backward 4 per weight per row.

    ``dims``: layer widths from input to output; ``rows``: the samples the step sees
    (the minibatch for SGD, the training set for GD)."""
    return 6.0 * rows * sum(a * b for a, b in zip(dims[:-1], dims[1:]))


def make_chunks(points: Sequence[Point], spec: SweepSpec, min_chunks: int = 1) -> list[Chunk]:
    """Pack points with equal :func:`shape_key` into chunks of at most
    ``execution.max_chunk_size`` members and at most ``execution.memory_budget_mb``.

    The chunks of a group are of equal size (±1), so no trial is left with a
    straggler of a few members. ``min_chunks``: split the grid into at least this
    many chunks where it has that many points, e.g. the number of trials that run
    at once (CPUs / CPUs per trial), so that every core gets a chunk. Cache
    efficiency does not depend on the chunk size: the trainer steps a chunk in
    cache-sized blocks of members (:class:`pipeline._models.EnsembleStep`).
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
