"""The cost model of a grid point: its memory (:func:`member_bytes`,
:func:`metrics_bytes`) and training FLOPs (:func:`flops_per_step`), and from them how many
members one chunk holds (:func:`chunk_members`) on the CPU or on a GPU trial."""

from __future__ import annotations

from collections.abc import Sequence

from phasesweep.pipeline.spec import ExecutionConfig, RunConfig


def member_bytes(config: RunConfig) -> int:
    """Rough memory of one ensemble member in bytes: data, parameters with their
    gradient, initial copy and update, and the activations of forward and backward."""
    m, d = config.model, config.data
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    n_params = sum(a * b + (b if m.bias else 0) for a, b in zip(dims[:-1], dims[1:]))
    n_rows = d.n_train + d.n_test + config.metrics.probe_size
    activations = n_rows * sum(dims) * 3
    data = n_rows * (d.input_dim + d.output_dim)
    itemsize = 8 if config.train.dtype == "float64" else 4
    return itemsize * (4 * n_params + activations + data)


def step_rows(config: RunConfig) -> int:
    """Samples one training step sees: the minibatch for SGD, the training set for GD."""
    t = config.train
    return t.batch_size if t.optimizer == "sgd" else config.data.n_train


def flops_per_step(config: RunConfig) -> float:
    """Training FLOPs of one member per step (see :func:`step_flops`)."""
    m, d = config.model, config.data
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    return step_flops(dims, step_rows(config))


def step_flops(dims: Sequence[int], rows: int) -> float:
    """FLOPs of one training step of one member: forward 2, backward 4 per weight per row.

    ``dims``: layer widths from input to output; ``rows``: the samples the step sees
    (the minibatch for SGD, the training set for GD)."""
    return 6.0 * rows * sum(a * b for a, b in zip(dims[:-1], dims[1:]))


#: Members per chunk, and memory of a chunk in MiB, where the spec leaves
#: ``execution.max_chunk_size`` / ``execution.memory_budget_mb`` unset and the chunk
#: trains on the CPU. The trainer steps a chunk in cache-sized blocks of members
#: (:class:`pipeline.train._models.EnsembleStep`), so these bound memory, not speed.
CPU_CHUNK_MEMBERS = 1024
CPU_CHUNK_BUDGET_MB = 1024

#: Training work (FLOPs, :func:`flops_per_step` × steps, summed over members) that a CPU
#: chunk of briefly trained members holds at least: about a second of one core of the
#: project's machines (benchmarks/scale: 7 µs per step of a 135 kFLOP member). A trial
#: has fixed costs beside its training (Tune's scheduling of it, the claim, the done-check
#: and three store files, ~0.1 s), so a grid of 10⁶ points × 10 steps cut into chunks of
#: 1024 members spends more on trials than on training. Such chunks grow up to
#: :data:`CPU_CHUNK_MAX_MEMBERS`, still within the memory budget; at 10⁴ or more
#: member-steps of work each, chunks keep :data:`CPU_CHUNK_MEMBERS`.
CPU_CHUNK_WORK = 2e10
CPU_CHUNK_MAX_MEMBERS = 8192

#: Part of a GPU trial's device memory (the card's memory times ``--gpus-per-trial``) that
#: one chunk may fill where the spec leaves ``execution.memory_budget_mb`` unset: the
#: trainer runs the whole ensemble as one block where it fits half the free memory
#: (:data:`pipeline.train._models.DEVICE_MEMORY_FRACTION`), and the rest holds the CUDA
#: context, the allocator's slack and the metrics' temporaries.
DEVICE_CHUNK_FRACTION = 0.5


def chunk_members(
    config: RunConfig, execution: ExecutionConfig, device_memory: int | None = None
) -> int:
    """Most members of one chunk of points shaped like ``config``.

    On the CPU (``device_memory`` None): ``execution.max_chunk_size`` (default
    :data:`CPU_CHUNK_MEMBERS`, more for members that train briefly: see
    :data:`CPU_CHUNK_WORK`) and ``execution.memory_budget_mb`` (default
    :data:`CPU_CHUNK_BUDGET_MB`) over :func:`member_bytes`. On a GPU trial of
    ``device_memory`` bytes: as many members as :data:`DEVICE_CHUNK_FRACTION` of it holds
    at :func:`member_bytes` plus the metrics' working set (:func:`metrics_bytes`) each,
    unless the spec sets either limit (then it applies there too): on an 80 GB card
    about 10⁵ small members train as one ensemble.
    """
    cap, budget_mb = execution.max_chunk_size, execution.memory_budget_mb
    per = member_bytes(config)
    if device_memory is None:
        if cap is None:
            work = flops_per_step(config) * config.train.steps
            cap = min(max(int(CPU_CHUNK_WORK // work), CPU_CHUNK_MEMBERS), CPU_CHUNK_MAX_MEMBERS)
        budget = (CPU_CHUNK_BUDGET_MB if budget_mb is None else budget_mb) * 2**20
    else:
        per += metrics_bytes(config)
        budget = (
            int(DEVICE_CHUNK_FRACTION * device_memory) if budget_mb is None else budget_mb * 2**20
        )
    size = budget // per
    return max(1, size if cap is None else min(cap, size))


def metrics_bytes(config: RunConfig) -> int:
    """Rough working set of one member's metrics at a logged step in bytes: the probe
    activations and sensitivities (probe × Σ widths, twice), a few probe × probe kernels
    and three copies of θ (see :func:`pipeline.train._trainer.metrics_block`)."""
    m, d = config.model, config.data
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    n_params = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    probe = min(config.metrics.probe_size, d.n_test)
    itemsize = 8 if config.train.dtype == "float64" else 4
    return itemsize * (2 * probe * sum(dims[1:]) + 4 * probe * probe + 3 * n_params)
