"""Small chunks for the device tests (``test_device_paths``, ``test_gpu``): a 3-layer net on
subspace data, 12 points by default (one of which diverges), and a chunk's checkpoint as
the driver writes it. Imports only what the GPU tier may (no conftest, no store)."""

from __future__ import annotations

import io

import torch
from phasesweep.pipeline.grid import Chunk, expand, make_chunks
from phasesweep.pipeline.spec import SweepSpec, validate_spec
from phasesweep.pipeline.train._trainer import train_chunk


def small_spec(model=None, data=None, train=None, metrics=None, grid=None) -> SweepSpec:  # noqa: ANN001
    """The sections given update the defaults (``data`` replaces the subspace kind's keys;
    ``grid`` replaces the grid); spectra at every logged step."""
    return validate_spec(
        {
            "name": "t",
            "model": {"depth": 3, "width": 12, "activation": "relu", "bias": True, **(model or {})},
            "data": {"n_train": 16, "n_test": 20, "input_dim": 5}
            | (data or {"kind": "subspace", "subspace_dim": 2}),
            "train": {"steps": 60, "lr": 0.1, "log_points": 12, **(train or {})},
            "metrics": {"probe_size": 8, "spectra_budget": None, **(metrics or {})},
            "grid": grid or {"init_scale": [0.3, 1.0], "lr": [0.05, 0.2, 200.0], "seed": [0, 1]},
        }
    )


def only_chunk(spec: SweepSpec) -> Chunk:
    (chunk,) = make_chunks(expand(spec), spec)
    return chunk


class _Stop(Exception):
    pass


def checkpoint_at(chunk: Chunk, k: int, device: str = "cpu") -> bytes:
    """``torch.save`` of the training state of ``chunk`` on ``device`` before step ``k``
    (a multiple of the hook's interval), the run stopped there."""
    saved = []

    def hook(step: int, state) -> None:  # noqa: ANN001
        if step == k:
            buf = io.BytesIO()
            torch.save(state(), buf)
            saved.append(buf.getvalue())
            raise _Stop

    try:
        train_chunk(chunk, device, hook=hook)
    except _Stop:
        return saved[0]
    raise ValueError(f"the run ended before step {k}")
