"""Chunks: points trained together as one vectorized ensemble (one Ray trial), and the
packing of a list of points into chunks (:func:`make_chunks`; a grid is planned without
a list, see :mod:`pipeline.run._plan`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import numpy as np
from phasesweep.pipeline.grid._cost import chunk_members
from phasesweep.pipeline.grid._groups import PART_TAG_LEN, group_tag, shape_key
from phasesweep.pipeline.grid._members import Members, Point
from phasesweep.pipeline.spec import SweepSpec


class Chunk:
    """Points trained together as one ensemble: ``chunk_id`` and its members, given as
    :class:`~pipeline.grid._members.Members` (column-wise, what the trainer reads) or as
    a sequence of points; either form is made from the other when first asked for."""

    def __init__(self, chunk_id: str, points: Sequence[Point] | Members) -> None:
        self.chunk_id = chunk_id
        self._members = points if isinstance(points, Members) else None
        self._points = None if isinstance(points, Members) else tuple(points)

    @property
    def members(self) -> Members:
        """The members column-wise."""
        if self._members is None:
            self._members = Members.from_points(self.points)
        return self._members

    @property
    def points(self) -> tuple[Point, ...]:
        """One :class:`~pipeline.grid._members.Point` per member, in member order."""
        if self._points is None:
            self._points = self.members.points()
        return self._points

    def __len__(self) -> int:
        return len(self._points) if self._points is not None else len(self.members)

    def __repr__(self) -> str:
        return f"Chunk({self.chunk_id!r}, {len(self)} members)"


def chunk_bounds(members: int, parts: int) -> list[int]:
    """Bounds of ``parts`` chunks of equal size (±1) over ``members`` members: chunk i
    holds members ``[b[i], b[i + 1])``."""
    return np.linspace(0, members, parts + 1).round().astype(int).tolist()


def chunk_parts(members: int, size: int, share: int) -> int:
    """Chunks of a group of ``members`` at most ``size`` each, and at least ``share``
    (the group's part of the grid's least number of chunks) where it has that many."""
    return min(max(-(-members // size), share), members)


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
