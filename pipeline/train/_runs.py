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
from phasesweep.pipeline.grid import Members, Point
from phasesweep.storage.schema import to_table


def runs_table(
    points: Sequence[Point] | Members,
    chunk_id: str,
    node_id: str | None,
    outcome: Mapping[str, Any],
) -> pa.Table:
    """The ``runs`` rows of ``points`` (one each, in order), of schema ``storage.schema.RUNS``,
    built column-wise from their :class:`~pipeline.grid._members.Members`.

    ``chunk_id``: the chunk they trained in; ``node_id``: the Ray node that trained
    them (None outside Ray or where none did). ``outcome``: the columns that depend on
    the training, one value per point (``status`` at least); columns given by neither
    are NULL.
    """
    m = points if isinstance(points, Members) else Members.from_points(points)
    n = len(m)
    column = lambda path: m.column(*path.split("."))  # noqa: E731
    given = {
        "run_id": pa.array(m.run_ids, pa.string()),
        "chunk_id": pa.repeat(pa.scalar(chunk_id, pa.string()), n),
        "node_id": pa.repeat(pa.scalar(node_id, pa.string()), n),
        "init_scale": column("model.init_scale"),
        "width": column("model.width"),
        "depth": column("model.depth"),
        "noise_sigma": column("data.noise_sigma"),
        "lr": column("train.lr"),
        "lr_effective": m.learning_rates(),
        "seed": column("train.seed"),
        "activation": column("model.activation"),
        "bias": column("model.bias"),
        "parameterization": column("model.parameterization"),
        "data_kind": column("data.kind"),
        "steps": column("train.steps"),
        "config": m.config_jsons(),
        "n_train": column("data.n_train"),
        "leaky_slope": column("model.leaky_slope"),
        "optimizer": column("train.optimizer"),
    }
    clash = sorted(set(given) & set(outcome))
    if clash or "status" not in outcome:
        raise ValueError(f"runs outcome: needs 'status' and none of the point's columns {clash}")
    return to_table("runs", {**given, **outcome}, n)
