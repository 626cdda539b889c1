"""A chunk's members column-wise (:class:`Members`): per config section, its distinct
configs and which one each member has; the run ids; the grid coordinates per axis.

The members of a chunk share every field but :data:`~pipeline.grid._groups.MEMBER_FIELDS`,
so a section takes few distinct values over a chunk (a 10⁶-point grid of 50 init scales ×
20,000 seeds: 50 ``model`` sections, 20,000 ``train`` sections, one ``data``); a
per-member field is a gather from them, with no Python object per member. A
:class:`~pipeline.grid._grid.Point` per member is made only where one is asked for
(:meth:`Members.points`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

import numpy as np
from phasesweep.pipeline.grid._lr import lr_factors
from phasesweep.pipeline.grid._run_ids import SECTIONS, section_json
from phasesweep.pipeline.spec import RunConfig
from pydantic import BaseModel

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class Point:
    """One grid point: its id, resolved config, and its coordinates on the grid axes."""

    run_id: str
    config: RunConfig
    coords: dict[str, Any]


def _factors(model: Any, train: Any) -> tuple[float, float]:
    """:func:`~pipeline.grid._lr.lr_factors`, with an overflowing power as inf (a rate
    the grid refuses, see :func:`~pipeline.grid._lr.check_lr`)."""
    try:
        return lr_factors(model, train)
    except OverflowError:
        return math.inf, math.inf


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` as they are (lists stay single elements)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


class Members:
    """The members of a chunk, column-wise.

    ``models[s]``: the distinct configs of section ``s`` (one of :data:`SECTIONS`) and
    ``jsons[s]`` their :func:`~pipeline.grid._run_ids.section_json`; ``index[s]`` (E,)
    int64: which one each member has. ``run_ids``: (E,) in member order; ``coords``: axis
    name → (E,) object array of the member's value on that grid axis (empty for members
    not made from a grid).
    """

    def __init__(
        self,
        run_ids: Sequence[str],
        models: Mapping[str, Sequence[BaseModel]],
        jsons: Mapping[str, Sequence[str]],
        index: Mapping[str, np.ndarray],
        coords: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.run_ids = list(run_ids)
        self.models = {s: tuple(models[s]) for s in SECTIONS}
        self.jsons = {s: tuple(jsons[s]) for s in SECTIONS}
        self.index = {s: np.asarray(index[s], dtype=np.int64) for s in SECTIONS}
        self.coords = dict(coords or {})
        self._lrs: np.ndarray | None = None

    @classmethod
    def from_points(cls, points: Sequence[Point]) -> Members:
        """The columns of a list of :class:`~pipeline.grid._grid.Point` (sections told apart
        by object identity first, then by JSON: a section object shared by many points is
        dumped once)."""
        models: dict[str, list[BaseModel]] = {s: [] for s in SECTIONS}
        jsons: dict[str, list[str]] = {s: [] for s in SECTIONS}
        index = {s: np.empty(len(points), dtype=np.int64) for s in SECTIONS}
        for s in SECTIONS:
            by_id: dict[int, int] = {}
            by_json: dict[str, int] = {}
            column = index[s]
            for e, p in enumerate(points):
                model = getattr(p.config, s)
                slot = by_id.get(id(model))  # the points hold their sections: ids stay unique
                if slot is None:
                    text = section_json(model)
                    slot = by_json.get(text)
                    if slot is None:
                        slot = by_json[text] = len(models[s])
                        models[s].append(model)
                        jsons[s].append(text)
                    by_id[id(model)] = slot
                column[e] = slot
        names = {k for p in points for k in p.coords}
        coords = {k: object_array([p.coords.get(k) for p in points]) for k in sorted(names)}
        return cls([p.run_id for p in points], models, jsons, index, coords)

    def __len__(self) -> int:
        return len(self.run_ids)

    def take(self, positions: np.ndarray) -> Members:
        """The members at ``positions`` (an int array, or a boolean mask of length E)."""
        positions = np.flatnonzero(positions) if positions.dtype == bool else positions
        ids = [self.run_ids[i] for i in positions.tolist()]
        return Members(
            ids,
            self.models,
            self.jsons,
            {s: i[positions] for s, i in self.index.items()},
            {k: v[positions] for k, v in self.coords.items()},
        )

    def column(self, section: str, name: str) -> np.ndarray:
        """Field ``name`` of ``section`` per member (E,): numbers as a numeric array, other
        values (None, lists, strings) as objects."""
        values = [getattr(m, name) for m in self.models[section]]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return np.asarray(values)[self.index[section]]
        return object_array(values)[self.index[section]]

    def first(self) -> RunConfig:
        """The first member's config: its shapes, steps and code paths are the chunk's."""
        return self.config(0)

    def config(self, e: int) -> RunConfig:
        """Member ``e``'s resolved config (made on each call)."""
        return RunConfig.model_construct(
            **{s: self.models[s][int(self.index[s][e])] for s in SECTIONS}
        )

    def configs(self) -> Sequence[RunConfig]:
        """Every member's config, each made when it is read (one object per member: for
        what needs them one by one)."""
        return _Configs(self)

    def learning_rates(self) -> np.ndarray:
        """The scaled learning rate of every member (E,) float64, made once:
        :func:`~pipeline.grid._lr.member_lr` bit for bit (``lr · scale · width``, in that
        order), its factors made once per distinct (model section, ``train.lr_scaling``)."""
        if self._lrs is None:
            trains = self.models["train"]
            scaling: dict[str, int] = {}
            rule = np.array(
                [scaling.setdefault(t.lr_scaling.model_dump_json(), len(scaling)) for t in trains]
            )
            first_train = {r: i for i, r in reversed(list(enumerate(rule.tolist())))}
            key = self.index["model"] * len(scaling) + rule[self.index["train"]]
            pairs, inverse = np.unique(key, return_inverse=True)
            models = self.models["model"]
            factors = np.array(
                [
                    _factors(models[m], trains[first_train[r]])
                    for m, r in zip(*(pairs // len(scaling), pairs % len(scaling)))
                ],
                dtype=np.float64,
            ).reshape(-1, 2)[inverse.reshape(-1)]
            base = np.array([t.lr for t in trains], dtype=np.float64)[self.index["train"]]
            self._lrs = base * factors[:, 0] * factors[:, 1]
        return self._lrs

    def config_jsons(self) -> pa.Array:
        """``config.model_dump_json()`` of every member (E,) as an Arrow string array,
        joined from the sections' JSON without a Python string per member: a section that
        all members share enters the join as one literal, the others as a gather of their
        distinct JSON. (pyarrow is imported here: the spec's modules load this package and
        no heavy library.)"""
        import pyarrow as pa
        import pyarrow.compute as pc

        parts: list[pa.Array | str] = []
        literal = ""
        for k, s in enumerate(SECTIONS):
            literal += ("{" if k == 0 else ",") + f'"{s}":'
            if len(self.jsons[s]) == 1:
                literal += self.jsons[s][0]
                continue
            parts += [literal, pa.array(self.jsons[s], pa.string()).take(pa.array(self.index[s]))]
            literal = ""
        if not parts:  # every section shared
            return pa.repeat(pa.scalar(literal + "}", pa.string()), len(self))
        return pc.binary_join_element_wise(*parts, literal + "}", "")

    def points(self) -> tuple[Point, ...]:
        """One :class:`Point` per member (a Python object each)."""
        coords = [dict(zip(self.coords, row)) for row in zip(*self.coords.values())]
        if not coords:
            coords = [{} for _ in range(len(self))]
        configs = [self.config(e) for e in range(len(self))]
        return tuple(Point(r, c, x) for r, c, x in zip(self.run_ids, configs, coords))


class _Configs(Sequence[RunConfig]):
    """The members' configs as a sequence, each made when it is read."""

    def __init__(self, members: Members) -> None:
        self._members = members

    def __len__(self) -> int:
        return len(self._members)

    @overload
    def __getitem__(self, e: int) -> RunConfig: ...
    @overload
    def __getitem__(self, e: slice) -> Sequence[RunConfig]: ...
    def __getitem__(self, e: int | slice) -> RunConfig | Sequence[RunConfig]:
        if isinstance(e, slice):
            return [self[i] for i in range(*e.indices(len(self)))]
        if not -len(self) <= e < len(self):
            raise IndexError(e)
        return self._members.config(e % len(self))
