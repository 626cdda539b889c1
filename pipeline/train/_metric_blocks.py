"""The metrics of a chunk recorded in blocks of members where the whole chunk would not fit.

On the CPU the batched metric ops of a large chunk stream from memory, and cost more per
member than in cache-sized blocks; on an accelerator a block is as large as its free
memory allows (the whole chunk, as a rule). :func:`member_blocks` gives one recorder of
the whole chunk, or one per block wrapped as one (:class:`BlockedRecorder`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence

import torch
from phasesweep.pipeline.data._datasets import DataBatch
from phasesweep.pipeline.grid._cost import metrics_working_set
from phasesweep.pipeline.spec import MetricsConfig
from phasesweep.pipeline.train._device import accelerated as is_accelerated
from phasesweep.pipeline.train._models import (
    DEVICE_MEMORY_FRACTION,
    EnsembleMLP,
    Params,
    equal_blocks,
    free_device_bytes,
)
from phasesweep.pipeline.train.metrics._metrics import MetricRecorder, probe_count
from torch import Tensor

#: Most members whose metrics are computed in one batch on the CPU. Past this, the batched
#: metric ops of a chunk stream from memory and cost more per member (benchmarks/: about
#: twice as much at 1024 members as at 256), so larger chunks record theirs in blocks.
METRICS_BLOCK = 256

#: Working set (bytes) of one block of members' metrics on CPU (see :func:`metrics_block`).
#: Measured on the project's 2-core machines at width 64, depth 3, 64 probe inputs (16
#: members a block): right after training steps, one logged step's trajectory metrics
#: took 77-90 ms per 256 members in blocks of 16 or 32 and 125-139 ms in one block.
METRICS_BLOCK_BYTES = 6 << 20


def metrics_block(
    dims: Sequence[int],
    probe: int,
    itemsize: int,
    device: torch.device,
    accelerated: bool | None = None,
    kernels: bool = True,
    spectra: bool = True,
    predictor_rows: int = 0,
) -> int:
    """Most members per block of metrics, each holding
    :func:`~pipeline.grid._cost.metrics_working_set` bytes.

    On CPU as many as fit :data:`METRICS_BLOCK_BYTES` (at most :data:`METRICS_BLOCK`).
    ``accelerated`` (default: off the CPU): as many as fit
    :data:`~pipeline.train._models.DEVICE_MEMORY_FRACTION` of the device's free memory
    with the batched methods' matrices besides (``spectra``, ``predictor_rows``: see the
    working set); no limit where the device does not report it. On a GPU that is the
    whole chunk: a logged step costs one pass of the metrics' kernels, not one per
    cache-sized block."""
    on_device = is_accelerated(device) if accelerated is None else accelerated
    per_member = metrics_working_set(
        dims, probe, itemsize, kernels, spectra, predictor_rows, accelerated=on_device
    )
    if not on_device:
        return max(1, min(METRICS_BLOCK, METRICS_BLOCK_BYTES // per_member))
    free = free_device_bytes(device)
    return sys.maxsize if free is None else max(1, int(DEVICE_MEMORY_FRACTION * free) // per_member)


class BlockedRecorder:
    """One recorder per block of members, used like one recorder of the whole chunk."""

    def __init__(self, bounds: list[tuple[int, int]], recorders: list) -> None:
        self.bounds, self.recorders = bounds, recorders

    def record(
        self, params: Params, grads: Params, step: int | None = None, time: Tensor | None = None
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        parts = [
            rec.record(
                _slice_params(params, s, e),
                _slice_params(grads, s, e),
                step=step,
                time=None if time is None else time[s:e],
            )
            for (s, e), rec in zip(self.bounds, self.recorders)
        ]
        return tuple(  # type: ignore[return-value]
            {key: torch.cat([p[i][key] for p in parts]) for key in parts[0][i]} for i in range(2)
        )


def _slice_params(p: Params, s: int, e: int) -> Params:
    return Params(
        [w[s:e] for w in p.weights], None if p.biases is None else [v[s:e] for v in p.biases]
    )


def member_blocks(
    make: Callable[[EnsembleMLP, Params, DataBatch, slice], MetricRecorder],
    net: EnsembleMLP,
    params0: Params,
    batch: DataBatch,
    metrics: MetricsConfig,
    device: torch.device,
    accelerated: bool,
) -> MetricRecorder | BlockedRecorder:
    """``make(net, params0, batch, members)`` for the whole chunk, or per block of at most
    :func:`metrics_block` members (equal sizes ±1) wrapped as one recorder; ``members``:
    the block's slice of the chunk's members (for what else ``make`` reads per member).
    ``params0``: θ(0) of every member; ``accelerated``: size blocks as on an accelerator."""
    E = params0.weights[0].shape[0]
    probe = probe_count(metrics, batch.x_test.shape[1])
    block = metrics_block(
        net.dims,
        probe,
        params0.weights[0].element_size(),
        device,
        accelerated,
        kernels=metrics.ntk,
        spectra=metrics.spectra,
        predictor_rows=(batch.x_train.shape[1] + probe) * (metrics.ntk and metrics.linearized),
    )
    if block >= E:
        return make(net, params0, batch, slice(0, E))
    bounds = equal_blocks(E, block)
    recorders = []
    for s, e in bounds:
        codim = batch.codim_basis
        block_batch = dataclasses.replace(
            batch,
            x_train=batch.x_train[s:e],
            y_train=batch.y_train[s:e],
            x_test=batch.x_test[s:e],
            y_test=batch.y_test[s:e],
            codim_basis=None if codim is None else codim[s:e],
        )
        recorders.append(
            make(net.members(s, e), _slice_params(params0, s, e), block_batch, slice(s, e))
        )
    return BlockedRecorder(bounds, recorders)
