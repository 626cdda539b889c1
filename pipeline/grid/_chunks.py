"""Chunks: points trained together as one vectorized ensemble (one Ray trial), and the
packing of a list of points into chunks (:func:`make_chunks`; a grid is planned without
a list, see :mod:`pipeline.run._plan`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from phasesweep.pipeline.grid._cost import chunk_members
from phasesweep.pipeline.grid._grid import Point
from phasesweep.pipeline.grid._groups import PART_TAG_LEN, group_tag, shape_key
from phasesweep.pipeline.spec import SweepSpec


@dataclass(frozen=True)
class Chunk:
    """Points trained together as one ensemble. ``chunk_id`` hashes the member run ids."""

    chunk_id: str
    points: tuple[Point, ...]


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
