"""The validated configs of one section of :class:`~pipeline.spec.RunConfig` over the
combinations of its grid axes (:class:`SectionOptions`), and how many distinct ones there
are (:func:`distinct_configs`).

Cross-field rules only relate fields of one section, so validating each section's
combinations, not each point, covers every point at a fraction of the cost.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from phasesweep.pipeline._axes import axis_path, axis_size, axis_values
from phasesweep.pipeline.grid._run_ids import section_json
from phasesweep.pipeline.spec import SpecError, SweepSpec, excerpt
from pydantic import BaseModel, ValidationError


def _set_path(cfg: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted ``path`` (without its section) in the section dict ``cfg``; the dicts
    along the path are copied, so a shallow copy of a shared dict can be given."""
    *parents, last = path.split(".")
    node = cfg
    for part in parents:
        node[part] = node = dict(node.get(part) or {})
    node[last] = value


#: Sections with at most this many combinations of their axes are validated up front,
#: each combination once; larger ones as the iteration reaches them (memory bounded).
EAGER_COMBINATIONS = 4096


@dataclass(frozen=True)
class Axis:
    """One grid axis: its name in the spec, the field it sets and its values."""

    name: str
    path: str  # dotted path into RunConfig
    values: Sequence[Any]


class SectionOptions:
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

    def __init__(self, spec: SweepSpec, section: str, axes: list[Axis]) -> None:
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
        return model, section_json(model)


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


def _distinct_combinations(axes: list[Axis]) -> bool:
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


def distinct_configs(spec: SweepSpec, section: str, names: Sequence[str]) -> int:
    """Distinct configs of ``section`` over the grid axes ``names`` (see
    :attr:`SectionOptions.distinct`): exact for a section of at most
    :data:`EAGER_COMBINATIONS` combinations, else the product of its axis sizes (their
    values are never computed here)."""
    count = math.prod(axis_size(a, spec.grid[a]) for a in names)
    if count <= EAGER_COMBINATIONS:
        axes = [Axis(a, axis_path(a), axis_values(a, spec.grid[a])) for a in names]
        count = SectionOptions(spec, section, axes).distinct
    return count
