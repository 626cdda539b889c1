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
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from phasesweep.pipeline.spec import (
    SHORT_NAMES,
    ExecutionConfig,
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

T = TypeVar("T")


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
    """Set a dotted ``path`` (without its section) in the section dict ``cfg``; the dicts
    along the path are copied, so a shallow copy of a shared dict can be given."""
    *parents, last = path.split(".")
    node = cfg
    for part in parents:
        node[part] = node = dict(node.get(part) or {})
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
    model, its JSON and whether idx is the first combination, in grid order, that gives
    this JSON (a later one repeats a point: an axis listing a value twice). Cross-field
    rules only relate fields of one section, so validating each section's combinations
    covers every point at a fraction of the cost.

    Repeats are found when the options are built, so that any one combination can be
    looked up alone (a trial expands only its own chunk). Small sections
    (:data:`EAGER_COMBINATIONS`) are validated whole up front, so their errors come
    before any point. A large section whose axes set distinct fields to strictly
    monotone values (ranges, spaces, sorted lists) that validate unchanged cannot repeat
    (a value changed by validation is an error there): its values are checked one axis
    at a time (:data:`SAMPLED_VALUES` of a longer axis) and its combinations when they
    are looked up. Any other large section is validated whole once, keeping a 16-byte
    digest per distinct JSON until its repeats are known: time linear in its
    combinations. That is exact because the grid's iteration (last axis fastest) first
    reaches the combinations of one section in that section's own lexicographic order,
    so the first combination seen with a JSON is also the first in grid order.

    Pickles without its cache of validated combinations (a trial validates what it uses).
    """

    def __init__(self, spec: SweepSpec, section: str, axes: list[_Axis]) -> None:
        self.base: BaseModel = getattr(spec, section)
        self._raw = self.base.model_dump()
        self.axes = axes
        self.sizes = [len(a.values) for a in axes]
        self.count = math.prod(self.sizes)
        self.eager = self.count <= EAGER_COMBINATIONS
        self.track = self.eager or not _distinct_combinations(axes)
        self._known: dict[tuple[int, ...], tuple[BaseModel, str]] = {}
        #: flat indices (last axis fastest) of the combinations that repeat an earlier one
        self.repeats: frozenset[int] = frozenset()
        if self.track:
            first: dict[bytes, int] = {}
            repeats = []
            for flat, idx in enumerate(itertools.product(*map(range, self.sizes))):
                model, text = self._validate(idx)
                if self.eager:
                    self._known[idx] = (model, text)
                digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
                if first.setdefault(digest, flat) != flat:
                    repeats.append(flat)
            self.repeats = frozenset(repeats)
        else:
            for a in axes:
                for i in _sample(len(a.values)):
                    if not _valid_alone(self.base, a.path, a.values[i]):
                        self._validate(tuple(i if b is a else 0 for b in axes))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_known": {}}

    @property
    def distinct(self) -> int:
        """Distinct configs of this section (a large section that cannot repeat counts
        every combination)."""
        return self.count - len(self.repeats)

    def flat(self, idx: tuple[int, ...]) -> int:
        """The combination's position in the section's own order (last axis fastest)."""
        flat = 0
        for i, size in zip(idx, self.sizes):
            flat = flat * size + i
        return flat

    def get(self, idx: tuple[int, ...]) -> tuple[BaseModel, str, bool]:
        found = self._known.get(idx)
        if found is None:
            found = self._validate(idx)
            if len(self._known) >= LAZY_CACHE:  # bounded: drop the oldest half
                for key in list(self._known)[: LAZY_CACHE // 2]:
                    del self._known[key]
            self._known[idx] = found
        return (*found, not self.repeats or self.flat(idx) not in self.repeats)

    def _validate(self, idx: tuple[int, ...]) -> tuple[BaseModel, str]:
        raw = dict(self._raw)
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
        return model, _section_json(model)


#: Validated combinations of a large section kept for the next look-up (a few KB each).
LAZY_CACHE = 256

#: Values of a long axis of a large section checked alone when the grid is planned: the
#: ends and evenly spaced ones between (a range or a space of numbers within a field's
#: bounds at both ends is within them throughout). The others are checked when a trial
#: builds its points.
SAMPLED_VALUES = 64


def _sample(n: int) -> list[int]:
    """Indices of the values of an axis of n values that are checked up front."""
    if n <= EAGER_COMBINATIONS:
        return list(range(n))
    return sorted({round(i * (n - 1) / (SAMPLED_VALUES - 1)) for i in range(SAMPLED_VALUES)})


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


class Grid:
    """A sweep's grid as its axes: any point by its indices, no list of points.

    ``axes`` in spec order; a point is one value index per axis, and the grid's order is
    their product, last axis fastest. The axes over :data:`MEMBER_FIELDS` are *member*
    axes, the others *split* axes: the points that share their split-axis values (a
    *group*) share every tensor shape and code path and may train as one ensemble; a
    group's members are the product of the member axes, the seed axes outermost and the
    others in grid order: members that share a seed, and with it their data and initial
    draws, stay together in a chunk, which makes those once (the grid's order and its
    points are the same whatever the member order).

    Built from a validated spec: the grid's size is checked against
    ``execution.max_points`` before any value is computed, small sections are validated
    whole and the others value by value (see :class:`_SectionOptions`), so a bad axis is
    a :class:`SpecError` naming it before anything runs; a combination of a large
    section that only fails when put together fails where its point is built. Memory:
    the axes' values, the small sections' configs and the repeats; pickles small (a Ray
    trial receives it once).
    """

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec
        self.sweep = spec.name
        self.axes, by_section = _grid(spec, bounded=True)
        options = {
            s: _SectionOptions(spec, s, [self.axes[i] for i in by_section[s]]) for s in _SECTIONS
        }
        self._sections = [(s, options[s], tuple(by_section[s])) for s in _SECTIONS]
        member_paths = {f"{sec}.{name}" for sec, name in MEMBER_FIELDS}
        is_member = [".".join(a.path.split(".")[:2]) in member_paths for a in self.axes]
        #: positions (in ``axes``) of the split axes and of the member axes, the seed axes
        #: first (see :data:`SEED_PATHS`)
        self.split = tuple(i for i, m in enumerate(is_member) if not m)
        self.member = tuple(
            sorted(
                (i for i, m in enumerate(is_member) if m),
                key=lambda i: self.axes[i].path not in SEED_PATHS,
            )
        )
        self.split_sizes = tuple(len(self.axes[i].values) for i in self.split)
        self.member_sizes = tuple(len(self.axes[i].values) for i in self.member)
        #: points of one group (repeats included)
        self.members = math.prod(self.member_sizes)
        self._check_lr_corners()

    def _check_lr_corners(self) -> None:
        """Refuse the grid if a point's scaled learning rate (:func:`member_lr`) is not a
        finite number > 0, looking only at the corners of the axes it depends on: its
        log is multilinear in the logs of lr, init scale (and its floor) and width and in
        depth and the scaling powers, so its extremes, where it overflows or underflows,
        lie at corners. The first failing corner in grid order is named."""
        ends = []
        for a in self.axes:
            if a.path in _LR_PATHS or a.path.startswith("train.lr_scaling."):
                values = list(a.values) if not isinstance(a.values, range) else None
                ends.append(
                    sorted({0, len(a.values) - 1})
                    if values is None
                    else sorted({values.index(min(values)), values.index(max(values))})
                )
            else:
                ends.append([0])
        for idx in itertools.product(*ends):
            models = [opt.get(tuple(idx[i] for i in pos))[0] for _, opt, pos in self._sections]
            config = RunConfig.model_construct(**dict(zip(_SECTIONS, models)))
            _check_lr(config, {a.name: a.values[i] for a, i in zip(self.axes, idx)})

    def groups(self) -> Iterator[tuple[int, ...]]:
        """Every group (one value index per split axis) in grid order."""
        return itertools.product(*map(range, self.split_sizes))

    def point(self, idx: Sequence[int]) -> Point | None:
        """The point at value indices ``idx`` (one per axis), or None where it repeats an
        earlier point of the grid. A scaled learning rate (:func:`member_lr`) that is not
        a finite number > 0 is a :class:`SpecError`."""
        chosen = self._chosen(idx)
        if chosen is None:
            return None
        run_id = _run_id(self.sweep, [text for _, text, _ in chosen])
        config = RunConfig.model_construct(
            **{s: m for (s, _, _), (m, _, _) in zip(self._sections, chosen)}
        )
        coords = {a.name: a.values[i] for a, i in zip(self.axes, idx)}
        _check_lr(config, coords)
        return Point(run_id, config, coords)

    def run_id(self, idx: Sequence[int]) -> str | None:
        """The run id of the point at ``idx`` (None for a repeat), without its config."""
        chosen = self._chosen(idx)
        return None if chosen is None else _run_id(self.sweep, [t for _, t, _ in chosen])

    def _chosen(self, idx: Sequence[int]) -> list[tuple[BaseModel, str, bool]] | None:
        chosen = [opt.get(tuple(idx[i] for i in pos)) for _, opt, pos in self._sections]
        return chosen if all(first for _, _, first in chosen) else None

    def __iter__(self) -> Iterator[Point]:
        """Every point in grid order, repeats left out."""
        for idx in itertools.product(*(range(len(a.values)) for a in self.axes)):
            p = self.point(idx)
            if p is not None:
                yield p

    def group_members(
        self,
        group: Sequence[int],
        start: int = 0,
        stop: int | None = None,
        build: Callable[[Sequence[int]], T] | None = None,
    ) -> Iterator[tuple[int, T]]:
        """(offset from ``start``, ``build(idx)``) of the group's members ``[start, stop)``
        in member order: O(1) to reach ``start``, O(1) a member. ``build``: :meth:`point`
        (the default) or :meth:`run_id`; None for a repeat."""
        build = self.point if build is None else build
        stop = self.members if stop is None else stop
        if stop <= start:
            return
        idx = [0] * len(self.axes)
        for pos, i in zip(self.split, group):
            idx[pos] = i
        digits = list(np.unravel_index(start, self.member_sizes)) if self.member else []
        for offset in range(stop - start):
            for pos, d in zip(self.member, digits):
                idx[pos] = int(d)
            yield offset, build(idx)
            for k in range(len(digits) - 1, -1, -1):  # the next member: last axis fastest
                digits[k] += 1
                if digits[k] < self.member_sizes[k]:
                    break
                digits[k] = 0

    def group_config(self, group: Sequence[int]) -> RunConfig:
        """The config of the group's first member (repeat or not): its shapes, steps and
        code paths are the group's."""
        idx = [0] * len(self.axes)
        for pos, i in zip(self.split, group):
            idx[pos] = i
        models = [opt.get(tuple(idx[i] for i in pos))[0] for _, opt, pos in self._sections]
        return RunConfig.model_construct(**dict(zip(_SECTIONS, models)))


#: Member axes that pick a member's random draws (data, initial weights, minibatches):
#: outermost in a group's member order.
SEED_PATHS = ("train.seed", "data.seed")

#: The fields :func:`member_lr` reads besides ``train.lr_scaling.*``.
_LR_PATHS = {"train.lr", "model.init_scale", "model.width", "model.depth"}


def iter_points(spec: SweepSpec, skip: Container[str] = frozenset()) -> Iterator[Point]:
    """The grid points of ``spec`` one at a time, in grid order (last axis fastest).

    Raises :class:`SpecError` naming the offending axis and value: the grid's size
    (over ``execution.max_points``), the axes' forms and values at once (see
    :class:`Grid`); a combination of a large section that fails only as a whole when the
    iteration reaches it. Points that resolve to the same config (an axis listing a
    value twice) appear once; points whose run_id is in ``skip`` are left out. A point
    whose scaled learning rate (:func:`member_lr`) is not finite and > 0 is an error.
    Memory: see :class:`Grid`; no point is kept.
    """
    grid = Grid(spec)
    return (p for p in grid if p.run_id not in skip)


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


#: Members per chunk, and memory of a chunk in MiB, where the spec leaves
#: ``execution.max_chunk_size`` / ``execution.memory_budget_mb`` unset and the chunk
#: trains on the CPU. The trainer steps a chunk in cache-sized blocks of members
#: (:class:`pipeline.train._models.EnsembleStep`), so these bound memory, not speed.
CPU_CHUNK_MEMBERS = 1024
CPU_CHUNK_BUDGET_MB = 1024

#: Training work (FLOPs, :func:`flops_per_step` × steps, summed over members) that a CPU
#: chunk of briefly trained members holds at least: about a second of one core of the
#: project's machines (benchmarks/scale: 7 µs per step of a 135 kFLOP member). A trial
#: has fixed costs beside its training (Tune's scheduling of it, the claim, the done-check
#: and three store files, ~0.1 s), so a grid of 10⁶ points × 10 steps cut into chunks of
#: 1024 members spends more on trials than on training. Such chunks grow up to
#: :data:`CPU_CHUNK_MAX_MEMBERS`, still within the memory budget; at 10⁴ or more
#: member-steps of work each, chunks keep :data:`CPU_CHUNK_MEMBERS`.
CPU_CHUNK_WORK = 2e10
CPU_CHUNK_MAX_MEMBERS = 8192

#: Part of a GPU trial's device memory (the card's memory times ``--gpus-per-trial``) that
#: one chunk may fill where the spec leaves ``execution.memory_budget_mb`` unset: the
#: trainer runs the whole ensemble as one block where it fits half the free memory
#: (:data:`pipeline.train._models.DEVICE_MEMORY_FRACTION`), and the rest holds the CUDA
#: context, the allocator's slack and the metrics' temporaries.
DEVICE_CHUNK_FRACTION = 0.5


def chunk_members(
    config: RunConfig, execution: ExecutionConfig, device_memory: int | None = None
) -> int:
    """Most members of one chunk of points shaped like ``config``.

    On the CPU (``device_memory`` None): ``execution.max_chunk_size`` (default
    :data:`CPU_CHUNK_MEMBERS`, more for members that train briefly: see
    :data:`CPU_CHUNK_WORK`) and ``execution.memory_budget_mb`` (default
    :data:`CPU_CHUNK_BUDGET_MB`) over :func:`member_bytes`. On a GPU trial of
    ``device_memory`` bytes: as many members as :data:`DEVICE_CHUNK_FRACTION` of it holds
    at :func:`member_bytes` plus the metrics' working set (:func:`metrics_bytes`) each,
    unless the spec sets either limit (then it applies there too): on an 80 GB card
    about 10⁵ small members train as one ensemble.
    """
    cap, budget_mb = execution.max_chunk_size, execution.memory_budget_mb
    per = member_bytes(config)
    if device_memory is None:
        if cap is None:
            work = flops_per_step(config) * config.train.steps
            cap = min(max(int(CPU_CHUNK_WORK // work), CPU_CHUNK_MEMBERS), CPU_CHUNK_MAX_MEMBERS)
        budget = (CPU_CHUNK_BUDGET_MB if budget_mb is None else budget_mb) * 2**20
    else:
        per += metrics_bytes(config)
        budget = (
            int(DEVICE_CHUNK_FRACTION * device_memory) if budget_mb is None else budget_mb * 2**20
        )
    size = budget // per
    return max(1, size if cap is None else min(cap, size))


def metrics_bytes(config: RunConfig) -> int:
    """Rough working set of one member's metrics at a logged step in bytes: the probe
    activations and sensitivities (probe × Σ widths, twice), a few probe × probe kernels
    and three copies of θ (see :func:`pipeline.train._trainer.metrics_block`)."""
    m, d = config.model, config.data
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    n_params = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    probe = min(config.metrics.probe_size, d.n_test)
    itemsize = 8 if config.train.dtype == "float64" else 4
    return itemsize * (2 * probe * sum(dims[1:]) + 4 * probe * probe + 3 * n_params)


def chunk_bounds(members: int, parts: int) -> list[int]:
    """Bounds of ``parts`` chunks of equal size (±1) over ``members`` members: chunk i
    holds members ``[b[i], b[i + 1])``."""
    return np.linspace(0, members, parts + 1).round().astype(int).tolist()


def chunk_parts(members: int, size: int, share: int) -> int:
    """Chunks of a group of ``members`` at most ``size`` each, and at least ``share``
    (the group's part of the grid's least number of chunks) where it has that many."""
    return min(max(-(-members // size), share), members)


#: Hex digits of a chunk id that name its group (:func:`group_tag`).
GROUP_TAG_LEN = 8
#: Hex digits after the group tag: in a planned chunk (:mod:`pipeline.run._plan`) a layout tag
#: (8: the member axes and how many chunks the group is cut into) and the chunk's index in
#: its group (8); in a chunk of explicit points a hash of their run ids.
PART_TAG_LEN = 16
#: Hex digits of a planned chunk id up to its index: the chunks that share them cut one
#: group the same way, so none holds another's points.
LAYOUT_LEN = GROUP_TAG_LEN + 8


def group_tag(config: RunConfig) -> str:
    """The first :data:`GROUP_TAG_LEN` hex digits of every chunk id of points shaped like
    ``config`` (a hash of its :func:`shape_key`). A point's chunks, however a launch
    packs it, share this tag: its store files, claims and checkpoints are looked up by
    it (two shapes that share a tag only cost a few extra reads)."""
    return hashlib.sha256(shape_key(config).encode()).hexdigest()[:GROUP_TAG_LEN]


def tagged(chunk_id: str) -> bool:
    """Whether ``chunk_id`` has the form group tag + part tag (stores written before
    group tags have other chunk ids)."""
    return len(chunk_id) == GROUP_TAG_LEN + PART_TAG_LEN and all(
        c in "0123456789abcdef" for c in chunk_id
    )


def make_chunks(points: Sequence[Point], spec: SweepSpec, min_chunks: int = 1) -> list[Chunk]:
    """Pack points with equal :func:`shape_key` into chunks of at most
    :func:`chunk_members` members (``execution.max_chunk_size``,
    ``execution.memory_budget_mb``), for a list of points that is not a grid (``refine``
    adds points line by line; a grid is planned without a list, see :mod:`pipeline.run._plan`).

    The chunks of a group are of equal size (±1), so no trial is left with a
    straggler of a few members. ``min_chunks``: split the points into at least this
    many chunks where there are that many, e.g. the number of trials that run
    at once (CPUs / CPUs per trial), so that every core gets a chunk. A chunk id is
    the group's :func:`group_tag` and a hash of the member run ids.
    """
    groups: dict[str, list[Point]] = {}
    cache: dict[int, str] = {}
    for p in points:
        groups.setdefault(shape_key(p.config, cache), []).append(p)
    total = max(1, len(points))
    chunks: list[Chunk] = []
    for members in groups.values():
        first = members[0].config
        size = chunk_members(first, spec.execution)
        share = -(-min_chunks * len(members) // total)
        bounds = chunk_bounds(len(members), chunk_parts(len(members), size, share))
        tag = group_tag(first)
        for start, stop in zip(bounds[:-1], bounds[1:]):
            part = tuple(members[start:stop])
            chunks.append(Chunk(tag + _hash_ids(p.run_id for p in part), part))
    return chunks


def _hash_ids(ids: Iterable[str]) -> str:
    return hashlib.sha256(",".join(ids).encode()).hexdigest()[:PART_TAG_LEN]
