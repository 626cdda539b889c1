"""The cost model of a grid point: its memory (:func:`member_bytes` on the CPU,
:func:`device_member_bytes` on a GPU) and training FLOPs (:func:`flops_per_step`), and from them how many
members one chunk holds (:func:`chunk_members`) on the CPU or on a GPU trial.

The rows a step sees are its optimizer's (:func:`pipeline.train._optim.step_rows`, a
torch-free fact of :mod:`pipeline.train._optim`)."""

from __future__ import annotations

from collections.abc import Sequence

from phasesweep.pipeline.spec import ExecutionConfig, RunConfig
from phasesweep.pipeline.train._optim import step_rows


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
    at :func:`device_member_bytes` each, unless the spec sets either limit (then it applies
    there too): on an 80 GB card some 10⁴ small members train as one ensemble with the
    default metrics, some 10⁵ with the kernel metrics and spectra off.
    """
    cap, budget_mb = execution.max_chunk_size, execution.memory_budget_mb
    per = member_bytes(config) if device_memory is None else device_member_bytes(config)
    if device_memory is None:
        if cap is None:
            work = flops_per_step(config) * config.train.steps
            cap = min(max(int(CPU_CHUNK_WORK // work), CPU_CHUNK_MEMBERS), CPU_CHUNK_MAX_MEMBERS)
        budget = (CPU_CHUNK_BUDGET_MB if budget_mb is None else budget_mb) * 2**20
    else:
        budget = (
            int(DEVICE_CHUNK_FRACTION * device_memory) if budget_mb is None else budget_mb * 2**20
        )
    size = budget // per
    return max(1, size if cap is None else min(cap, size))


def metrics_working_set(
    dims: Sequence[int],
    probe: int,
    itemsize: int,
    kernels: bool = True,
    spectra: bool = True,
    predictor_rows: int = 0,
    accelerated: bool = False,
) -> int:
    """Bytes of one member's metrics at a logged step: the probe activations and
    sensitivities (probe × Σ widths, twice), a few probe × probe kernels (``kernels``: the
    NTK metrics are on), θ − θ(0) (held for the whole step) and two copies of the largest
    layer (the temporaries of its norms and its balance, one layer at a time). ``accelerated``: besides, what the batched
    matmul methods hold at once (:mod:`pipeline.train.metrics._squaring`, ``_subspace``,
    ``_decay``): eight copies of the largest matrix the spectra work on (the two shifted
    kernels, their powers and spares; the layers' shorter side squared, with ``spectra``),
    and four of the kernel on the predictor's ``predictor_rows`` = n_train + probe inputs
    (its set-up; 0 where the predictor is off)."""
    layer_sizes = [a * b for a, b in zip(dims[:-1], dims[1:])]
    per = 2 * probe * sum(dims[1:]) + 4 * probe * probe * kernels
    per += sum(layer_sizes) + 2 * max(layer_sizes)
    if accelerated:
        layers = [min(a, b) ** 2 * spectra for a, b in zip(dims[:-1], dims[1:])]
        per += 8 * max([probe * probe * kernels, *layers]) + 4 * predictor_rows**2
    return itemsize * per


def device_member_bytes(config: RunConfig) -> int:
    """Peak device memory of one member on a GPU trial in bytes: data, θ in four copies, the
    step's activations on the training rows (three passes) and the test and probe rows'
    (forwarded at logged steps only), and the metrics' accelerated working set
    (:func:`metrics_working_set`). On an H200 (``benchmarks/gpu.py``, 1000 steps) it came
    within a factor 1.4 of the measured peak at widths 16 and 256, metrics off and default."""
    m, d, mc = config.model, config.data, config.metrics
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    n_params = sum(a * b + (b if m.bias else 0) for a, b in zip(dims[:-1], dims[1:]))
    probe = min(mc.probe_size, d.n_test)
    activations = (3 * d.n_train + d.n_test + probe) * sum(dims)
    data = (d.n_train + d.n_test) * (d.input_dim + d.output_dim)
    itemsize = 8 if config.train.dtype == "float64" else 4
    predictor = mc.ntk and mc.linearized and d.output_dim == 1
    metrics = metrics_working_set(
        dims, probe, itemsize, kernels=mc.ntk, spectra=mc.spectra,
        predictor_rows=(d.n_train + probe) * predictor, accelerated=True,
    )  # fmt: skip
    return itemsize * (4 * n_params + activations + data) + metrics
