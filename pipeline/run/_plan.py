"""The plan of a sweep: spec → chunks, each a descriptor of a few integers.

No list of points is made here. A :class:`~pipeline.grid._grid.Grid` is the spec's axes; a
chunk is a :class:`ChunkTask`: which group it trains (one value index per split axis:
the points of a group share every shape and code path) and which range of the group's
members. A trial expands its own task into points
(:func:`expand_task`); the driver holds the tasks, O(chunks) in memory and time, so a
10⁷-point grid plans in seconds.

Chunk ids: a group tag (a hash of the group's shapes, :func:`pipeline.grid._groups.group_tag`),
a layout tag (a hash of the member axes and of how many chunks the group is cut into,
:func:`layout_tag`) and the chunk's index in its group. So the same chunk of the same
grid has the same id on every relaunch (and its checkpoint is found), a chunk is found
in the store by its id alone, and the chunks of one layout of a group partition it: a
point is stored under its own chunk's id or under one of another layout (an extended
grid, another chunk size or number of trials), which a trial tells from the id's first
:data:`pipeline.grid._groups.LAYOUT_LEN` digits. :func:`plan_stored` reads which chunks the
store already holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
from phasesweep.pipeline.grid import (
    GROUP_TAG_LEN,
    LAYOUT_LEN,
    Chunk,
    Grid,
    chunk_bounds,
    chunk_members,
    chunk_parts,
    group_tag,
    shape_key,
)
from phasesweep.storage import Store


@dataclass(frozen=True)
class ChunkTask:
    """One chunk of a grid, as a trial receives it: members ``[start, stop)`` of ``group``
    (in the group's member order, see :class:`~pipeline.grid._grid.Grid`).

    ``steps``: training steps per member; ``stored``: a bitmask over the range (bit i of
    byte i // 8, little bit first) of the members the store held when the plan was made,
    where the plan looked them up (empty where it knew of none).
    """

    chunk_id: str
    group: tuple[int, ...]
    start: int
    stop: int
    steps: int
    stored: bytes = b""

    @property
    def size(self) -> int:
        """Members of the chunk's range (a repeat of an earlier point included)."""
        return self.stop - self.start

    @property
    def stored_count(self) -> int:
        """Members the plan found stored (bits of ``stored``)."""
        return sum(bin(b).count("1") for b in self.stored)


def member_digest(grid: Grid) -> str:
    """A hash of the grid's member axes (paths and values as the spec gives them): the
    layout tags of two grids agree only where their groups have the same members."""
    axes = [[grid.axes[i].path, grid.spec.grid[grid.axes[i].name]] for i in grid.member]
    return hashlib.sha256(json.dumps(axes, sort_keys=True, default=str).encode()).hexdigest()


def layout_tag(digest: str, parts: int) -> str:
    """The 8 hex digits after the group tag of a planned chunk id: a group whose member
    axes hash to ``digest``, cut into ``parts`` chunks (:data:`pipeline.grid._groups.LAYOUT_LEN`)."""
    return hashlib.sha256(f"{digest}:{parts}".encode()).hexdigest()[: LAYOUT_LEN - GROUP_TAG_LEN]


def plan_chunks(
    grid: Grid, *, min_chunks: int = 1, device_memory: int | None = None
) -> list[ChunkTask]:
    """The chunks of the whole grid, group by group, in grid order.

    Each group is cut into chunks of equal size (±1) of at most
    :func:`pipeline.grid._cost.chunk_members` members (on the CPU, or on a GPU trial of
    ``device_memory`` bytes), and into at least its share of ``min_chunks`` (e.g. the
    trials that run at once, so that every slot gets a chunk of a small grid). A group
    whose shapes equal an earlier group's (a split axis listing one value twice) repeats
    its points and is left out. O(groups) configs are validated, O(chunks) tasks made.
    """
    digest = member_digest(grid)
    total = max(1, grid.members * grid.n_groups)
    share = -(-min_chunks * grid.members // total)
    seen: set[bytes] = set()
    tasks: list[ChunkTask] = []
    for group in grid.groups():
        config = grid.group_config(group)
        key = hashlib.blake2b(shape_key(config).encode(), digest_size=16).digest()
        if key in seen:
            continue
        seen.add(key)
        size = chunk_members(config, grid.spec.execution, device_memory)
        parts = chunk_parts(grid.members, size, share)
        bounds = chunk_bounds(grid.members, parts)
        prefix = group_tag(config) + layout_tag(digest, parts)
        for index, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
            chunk_id = f"{prefix}{index:08x}"
            tasks.append(ChunkTask(chunk_id, group, start, stop, config.train.steps))
    return tasks


def expand_task(grid: Grid, task: ChunkTask) -> Chunk:
    """The task's points: its members in grid order, less repeats and the members the
    plan found stored, column-wise (:meth:`~pipeline.grid._grid.Grid.group_columns`).
    Raises :class:`SpecError` for a point the grid refuses."""
    offsets, members = grid.group_columns(task.group, task.start, task.stop)
    if task.stored:
        bits = np.unpackbits(np.frombuffer(task.stored, dtype=np.uint8), bitorder="little")
        stored = np.zeros(task.size, dtype=bool)
        stored[: min(len(bits), task.size)] = bits[: task.size].astype(bool)
        members = members.take(np.flatnonzero(~stored[offsets]))
    return Chunk(task.chunk_id, members)


def plan_stored(
    grid: Grid, tasks: Sequence[ChunkTask], store: Store
) -> tuple[list[ChunkTask], int]:
    """The tasks with points to train, and the grid's points the store holds.

    Reads the ``run_id``, ``chunk_id`` and ``status`` columns of the sweep's ``runs``
    files once. Where every stored point is filed under a chunk id of this plan, a chunk
    is complete when its id holds as many done runs as it has members: O(chunks), no
    run id computed. Where some are filed under other chunk ids (another layout: an
    extended grid, another chunk size; a store older than group tags; compacted files),
    the run ids of the grid are computed (no configs: a few µs a point) and each task
    carries the bitmask of its stored members (:attr:`ChunkTask.stored`), so that its
    trial need not read those files again.
    """
    done = store.done_rows(grid.sweep)
    if done.num_rows == 0:
        return list(tasks), 0
    ids = done.column("run_id").to_pylist()
    chunks = done.column("chunk_id").to_pylist()
    planned = {t.chunk_id for t in tasks}
    counts: dict[str, int] = {}
    foreign = False
    for chunk in chunks:
        if chunk in planned:
            counts[chunk] = counts.get(chunk, 0) + 1
        else:
            foreign = True
    if not foreign:
        left = [t for t in tasks if counts.get(t.chunk_id, 0) < t.size]
        return left, sum(min(counts.get(t.chunk_id, 0), t.size) for t in tasks)
    stored = set(ids)
    left, skipped = [], 0
    for task in tasks:
        bits, complete = _stored_bits(grid, task, stored)
        mask = np.packbits(bits, bitorder="little").tobytes() if bits.any() else b""
        skipped += int(bits.sum())
        if not complete:
            left.append(ChunkTask(**{**task.__dict__, "stored": mask}))
    return left, skipped


def _stored_bits(grid: Grid, task: ChunkTask, stored: Collection[str]) -> tuple[np.ndarray, bool]:
    """(members of the task found in ``stored``, whether every member that is no repeat is)."""
    bits = np.zeros(task.size, dtype=bool)
    complete = True
    for offset, run_id in grid.group_members(task.group, task.start, task.stop, grid.run_id):
        if run_id is None:
            continue
        if run_id in stored:
            bits[offset] = True
        else:
            complete = False
    return bits, complete
