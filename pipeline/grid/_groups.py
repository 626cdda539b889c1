"""Groups of points and chunk ids.

The points of a grid that share every tensor shape and code path, all fields but
:data:`MEMBER_FIELDS` (their :func:`shape_key`), form a group: they may train as one
vectorized ensemble. A chunk id starts with its group's tag (:func:`group_tag`), so a
point's chunks, however a launch packs it, are found by that tag.
"""

from __future__ import annotations

import hashlib
import json

from phasesweep.pipeline.grid._run_ids import SECTIONS
from phasesweep.pipeline.spec import RunConfig
from pydantic import BaseModel

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


def _section_key(section: BaseModel, name: str) -> str:
    d = section.model_dump(mode="json")
    for sec, field in MEMBER_FIELDS:
        if sec == name:
            d.pop(field, None)
    return json.dumps(d, sort_keys=True)


def shape_key(config: RunConfig, cache: dict[int, str] | None = None) -> str:
    """Everything but :data:`MEMBER_FIELDS`: points with equal keys can share a chunk.

    ``cache`` maps ``id(section)`` to its key; points from one :func:`~pipeline.grid._grid.expand`
    share section objects, so a cache kept over one call makes this cheap. Only
    valid while those objects are alive (ids are reused after collection).
    """
    parts = []
    for s in SECTIONS:
        section = getattr(config, s)
        if cache is None:
            parts.append(_section_key(section, s))
        else:
            key = cache.get(id(section))
            if key is None:
                key = cache[id(section)] = _section_key(section, s)
            parts.append(key)
    return "|".join(parts)


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
