"""The grid: axes, points, run ids, chunks and the cost model; the reach of a grid in
gradient-flow time. Imports neither torch nor Ray.

Private: the modules here are re-exported where they are public. The names below are
what the other rooms of the pipeline (train, run, refine) use; a module here imports its
neighbours directly, never this package.

- :mod:`._grid`: :class:`Grid` (any point by its indices, a chunk's members column-wise),
  :func:`iter_points`, :func:`expand`, :func:`grid_size`;
- :mod:`._members`: :class:`Point`, :class:`Members` (a chunk's members column-wise);
- :mod:`._section_options`: the validated configs of one section over its axes;
- :mod:`._run_ids`: :func:`run_id_of`;
- :mod:`._groups`: groups of points that may share a chunk (:data:`MEMBER_FIELDS`,
  :func:`shape_key`) and the chunk ids' tags;
- :mod:`._chunks`: :class:`Chunk`, :func:`make_chunks` and the cutting of a group;
- :mod:`._cost`: memory and FLOPs of a point, :func:`chunk_members`;
- :mod:`._lr`: :func:`member_lr`, the scaled learning rate;
- :mod:`._horizon`: the gradient-flow time a grid reaches (:func:`check_at_time`).

The axes' names and forms are the spec's (:mod:`pipeline._axes`).
"""

from phasesweep.pipeline.grid._chunks import Chunk, chunk_bounds, chunk_parts, make_chunks
from phasesweep.pipeline.grid._cost import (
    chunk_members,
    flops_per_step,
    member_bytes,
    step_flops,
)
from phasesweep.pipeline.grid._grid import Grid, expand, grid_size, iter_points
from phasesweep.pipeline.grid._groups import (
    GROUP_TAG_LEN,
    LAYOUT_LEN,
    MEMBER_FIELDS,
    group_tag,
    shape_key,
    tagged,
)
from phasesweep.pipeline.grid._horizon import check_at_time
from phasesweep.pipeline.grid._lr import member_lr
from phasesweep.pipeline.grid._members import Members, Point
from phasesweep.pipeline.grid._run_ids import run_id_of

__all__ = [
    "GROUP_TAG_LEN",
    "LAYOUT_LEN",
    "MEMBER_FIELDS",
    "Members",
    "Chunk",
    "Grid",
    "Point",
    "check_at_time",
    "chunk_bounds",
    "chunk_members",
    "chunk_parts",
    "expand",
    "flops_per_step",
    "grid_size",
    "group_tag",
    "iter_points",
    "make_chunks",
    "member_bytes",
    "member_lr",
    "run_id_of",
    "shape_key",
    "step_flops",
    "tagged",
]
