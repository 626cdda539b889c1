"""The ``runs`` row of a grid point: the one place that assembles it.

A row is the point's identity and configuration (what its config alone decides), where
it trained (chunk, Ray node), and the outcome of its training (status, losses, times,
or the error of a failed trial). The trainer's completed and diverged rows and the
driver's failed rows both come from :func:`runs_table`; nothing patches a row later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from phasesweep.pipeline.grid import Point, member_lr
from phasesweep.pipeline.spec import RunConfig
from phasesweep.storage.schema import to_table
from pydantic import BaseModel


def config_jsons(configs: Sequence[RunConfig]) -> list[str]:
    """``config.model_dump_json()`` of each config, from each section's JSON made once per
    section object: the members of a chunk share most of their sections (a fifth of the
    cost where one section differs per member)."""
    made: dict[int, str] = {}

    def section(model: BaseModel) -> str:
        text = made.get(id(model))  # the configs outlive this call: ids are not reused
        if text is None:
            text = made[id(model)] = model.model_dump_json()
        return text

    return [
        "{" + ",".join(f'"{name}":{section(getattr(c, name))}' for name in _SECTIONS) + "}"
        for c in configs
    ]


_SECTIONS = tuple(RunConfig.model_fields)


def runs_table(
    points: Sequence[Point],
    chunk_id: str,
    node_id: str | None,
    outcome: Mapping[str, Any],
) -> pa.Table:
    """The ``runs`` rows of ``points`` (one each, in order), of schema ``storage.schema.RUNS``.

    ``chunk_id``: the chunk they trained in; ``node_id``: the Ray node that trained
    them (None outside Ray or where none did). ``outcome``: the columns that depend on
    the training, one value per point (``status`` at least); columns given by neither
    are NULL.
    """
    cfg = [p.config for p in points]
    n = len(points)
    given = {
        "run_id": [p.run_id for p in points],
        "chunk_id": [chunk_id] * n,
        "node_id": [node_id] * n,
        "init_scale": [c.model.init_scale for c in cfg],
        "width": [c.model.width for c in cfg],
        "depth": [c.model.depth for c in cfg],
        "noise_sigma": [c.data.noise_sigma for c in cfg],
        "lr": [c.train.lr for c in cfg],
        "lr_effective": [member_lr(c) for c in cfg],
        "seed": [c.train.seed for c in cfg],
        "activation": [c.model.activation for c in cfg],
        "bias": [c.model.bias for c in cfg],
        "parameterization": [c.model.parameterization for c in cfg],
        "data_kind": [c.data.kind for c in cfg],
        "steps": [c.train.steps for c in cfg],
        "config": config_jsons(cfg),
        "n_train": [c.data.n_train for c in cfg],
        "leaky_slope": [c.model.leaky_slope for c in cfg],
        "optimizer": [c.train.optimizer for c in cfg],
    }
    clash = sorted(set(given) & set(outcome))
    if clash or "status" not in outcome:
        raise ValueError(f"runs outcome: needs 'status' and none of the point's columns {clash}")
    return to_table("runs", {**given, **outcome}, n)
