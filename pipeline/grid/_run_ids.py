"""Deterministic run ids: the same point is the same run on every machine and relaunch.

``run_id`` = a hash of the sweep name and the canonical JSON of each section of the
point's resolved :class:`~pipeline.spec.RunConfig`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from phasesweep.pipeline.spec import RunConfig
from pydantic import BaseModel

#: The sections of a run's config, in the order their JSON enters the run id.
SECTIONS: tuple[str, ...] = tuple(RunConfig.model_fields)


def section_json(section: BaseModel) -> str:
    """The canonical JSON of one section of a config (what the run id hashes)."""
    return section.model_dump_json()


def run_id_of(sweep: str, config: RunConfig) -> str:
    """Deterministic id: sha256 of the sweep name and the canonical JSON of each section."""
    return run_id_from_json(sweep, [section_json(getattr(config, s)) for s in SECTIONS])


def run_id_from_json(sweep: str, section_jsons: Sequence[str]) -> str:
    """The run id of the sections whose :func:`section_json` are ``section_jsons`` (in
    :data:`SECTIONS` order): computed without the configs themselves."""
    payload = "\n".join([sweep, *section_jsons])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def run_ids_from_json(
    sweep: str, section_jsons: Sequence[Sequence[str]], index: Sequence[np.ndarray]
) -> list[str]:
    """:func:`run_id_from_json` of many points: point e has section s's JSON
    ``section_jsons[s][index[s][e]]`` (sections in :data:`SECTIONS` order, each (E,))."""
    sha = hashlib.sha256
    return [
        sha("\n".join((sweep, *texts)).encode()).hexdigest()[:16]
        for texts in zip(
            *([jsons[i] for i in idx.tolist()] for jsons, idx in zip(section_jsons, index))
        )
    ]
