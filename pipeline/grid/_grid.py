"""The grid: the Cartesian product of a spec's axes, in the order the spec lists them
(the last axis varies fastest), any point by its indices (:class:`Grid`) and all of them
(:func:`iter_points`, :func:`expand`).

Every point gets ``run_id`` = a hash of the sweep name and its resolved
:class:`~pipeline.spec.RunConfig` (:mod:`pipeline.grid._run_ids`), so the same point is
the same run on every machine and every relaunch. The points that share every tensor
shape and code path form a group (:mod:`pipeline.grid._groups`): its members may differ
only in the fields of :data:`~pipeline.grid._groups.MEMBER_FIELDS`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Container, Iterator, Sequence
from typing import TypeVar

import numpy as np
from phasesweep.pipeline._axes import axis_path, axis_size, axis_values
from phasesweep.pipeline.grid._groups import MEMBER_FIELDS
from phasesweep.pipeline.grid._lr import LR_PATHS, check_lr
from phasesweep.pipeline.grid._members import Members, Point, object_array
from phasesweep.pipeline.grid._run_ids import SECTIONS, run_id_from_json, run_ids_from_json
from phasesweep.pipeline.grid._section_options import (
    Axis,
    SectionOptions,
    distinct_configs,
)
from phasesweep.pipeline.spec import RunConfig, SpecError, SweepSpec
from pydantic import BaseModel

T = TypeVar("T")


def _grid(spec: SweepSpec, bounded: bool) -> tuple[list[Axis], dict[str, list[int]]]:
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
        Axis(axis, path, axis_values(axis, v)) for (axis, v), path in zip(spec.grid.items(), paths)
    ]
    by_section = {s: [i for i, a in enumerate(axes) if a.path.split(".")[0] == s] for s in SECTIONS}
    return axes, by_section


def grid_size(spec: SweepSpec) -> int:
    """Number of points of the grid, without expanding it (memory and time bounded).

    The product over sections of their distinct configs, as :func:`iter_points` yields
    them: exact for sections of at most
    :data:`~pipeline.grid._section_options.EAGER_COMBINATIONS` combinations and for
    larger ones whose values cannot repeat (ranges, spaces, sorted lists); the product
    of the axis sizes for a large section whose values may repeat. Not bounded by
    ``execution.max_points``: it also sizes stored grids.
    """
    return math.prod(
        distinct_configs(spec, s, [a for a in spec.grid if axis_path(a).split(".")[0] == s])
        for s in SECTIONS
    )


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
    whole and the others value by value (see :class:`SectionOptions`), so a bad axis is
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
            s: SectionOptions(spec, s, [self.axes[i] for i in by_section[s]]) for s in SECTIONS
        }
        self._sections = [(s, options[s], tuple(by_section[s])) for s in SECTIONS]
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
        #: groups of the grid, as many as :meth:`groups` lists (repeats included)
        self.n_groups = math.prod(self.split_sizes)
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
            if a.path in LR_PATHS or a.path.startswith("train.lr_scaling."):
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
            config = RunConfig.model_construct(**dict(zip(SECTIONS, models)))
            check_lr(config, {a.name: a.values[i] for a, i in zip(self.axes, idx)})

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
        run_id = run_id_from_json(self.sweep, [text for _, text, _ in chosen])
        config = RunConfig.model_construct(
            **{s: m for (s, _, _), (m, _, _) in zip(self._sections, chosen)}
        )
        coords = {a.name: a.values[i] for a, i in zip(self.axes, idx)}
        check_lr(config, coords)
        return Point(run_id, config, coords)

    def run_id(self, idx: Sequence[int]) -> str | None:
        """The run id of the point at ``idx`` (None for a repeat), without its config."""
        chosen = self._chosen(idx)
        return None if chosen is None else run_id_from_json(self.sweep, [t for _, t, _ in chosen])

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

    def group_columns(
        self, group: Sequence[int], start: int, stop: int
    ) -> tuple[np.ndarray, Members]:
        """The group's members ``[start, stop)`` column-wise: (their offsets from ``start``,
        repeats left out; their :class:`~pipeline.grid._members.Members`), the same points
        as :meth:`group_members` with no Python object per member but its run id. Each
        section's distinct combinations are looked up once; a scaled learning rate
        (:func:`member_lr`) that is not a finite number > 0 is a :class:`SpecError`
        naming the first such point."""
        offsets = np.arange(max(stop - start, 0), dtype=np.int64)
        idx: list[np.ndarray | int] = [0] * len(self.axes)
        for pos, i in zip(self.split, group):
            idx[pos] = i
        if self.member:
            for pos, d in zip(self.member, np.unravel_index(offsets + start, self.member_sizes)):
                idx[pos] = d
        keep = np.ones(len(offsets), dtype=bool)
        models, jsons, index = {}, {}, {}
        for s, opt, pos in self._sections:
            flat: np.ndarray | int = 0
            for p, size in zip(pos, opt.sizes):
                flat = flat * size + idx[p]
            combos, inverse = np.unique(np.broadcast_to(flat, keep.shape), return_inverse=True)
            chosen = [opt.get(tuple(map(int, np.unravel_index(c, opt.sizes)))) for c in combos]
            models[s] = [m for m, _, _ in chosen]
            jsons[s] = [t for _, t, _ in chosen]
            index[s] = inverse.reshape(-1)
            keep &= np.array([first for _, _, first in chosen], dtype=bool)[index[s]]
        kept = np.flatnonzero(keep)
        index = {s: i[kept] for s, i in index.items()}
        ids = run_ids_from_json(
            self.sweep, [jsons[s] for s in SECTIONS], [index[s] for s in SECTIONS]
        )
        coords = {
            a.name: object_array(a.values)[np.broadcast_to(i, keep.shape)[kept]]
            for a, i in zip(self.axes, idx)
        }
        members = Members(ids, models, jsons, index, coords)
        lrs = members.learning_rates()
        bad = np.flatnonzero(~(np.isfinite(lrs) & (lrs > 0)))
        if len(bad):
            e = int(bad[0])
            check_lr(members.config(e), {k: v[e] for k, v in coords.items()})
        return offsets[kept], members

    def group_config(self, group: Sequence[int]) -> RunConfig:
        """The config of the group's first member (repeat or not): its shapes, steps and
        code paths are the group's."""
        idx = [0] * len(self.axes)
        for pos, i in zip(self.split, group):
            idx[pos] = i
        models = [opt.get(tuple(idx[i] for i in pos))[0] for _, opt, pos in self._sections]
        return RunConfig.model_construct(**dict(zip(SECTIONS, models)))


#: Member axes that pick a member's random draws (data, initial weights, minibatches):
#: outermost in a group's member order.
SEED_PATHS = ("train.seed", "data.seed")


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
