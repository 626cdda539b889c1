"""phasesweep's pipeline: sweep spec → grid → chunks → vectorized ensemble training on Ray.

The public surface is re-exported here; the ``_`` modules behind it are private
details that may move. Public modules: :mod:`pipeline.spec` (the sweep spec's models)
and :mod:`pipeline.activations` (the activation registry; ``register`` adds one).
Typical use from Python::

    from phasesweep.pipeline import load_spec_and_raw, expand, make_chunks, train_chunk

    spec, _ = load_spec_and_raw("sweeps/quickstart.yaml", ["train.steps=500"])
    chunks = make_chunks(expand(spec), spec)
    tables = train_chunk(chunks[0])      # {"runs", "trajectories", "layers"}: pyarrow Tables

Concurrency: :func:`train_chunk` uses the calling process's torch threads; set
``torch.set_num_threads`` to the CPUs the process owns (with more threads than
cores, small batched ops slow down by an order of magnitude).
"""

from typing import TYPE_CHECKING

from phasesweep.pipeline.grid import Chunk, Point, expand, make_chunks, run_id_of
from phasesweep.pipeline.spec import (
    RunConfig,
    SpecError,
    SweepSpec,
    load_spec,
    load_spec_and_raw,
    validate_spec,
)

#: The trainer pulls in torch: imported on first use so the CLI starts fast
#: (:mod:`phasesweep._lazy`).
if TYPE_CHECKING:
    from phasesweep.pipeline.train._trainer import train_chunk
else:
    from phasesweep._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(globals())

__all__ = [
    "Chunk",
    "Point",
    "RunConfig",
    "SpecError",
    "SweepSpec",
    "expand",
    "load_spec",
    "load_spec_and_raw",
    "make_chunks",
    "run_id_of",
    "train_chunk",
    "validate_spec",
]
