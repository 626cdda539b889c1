"""What a launch's trials run on: how many run at once, and the device memory of each.

Chunks are planned for it (:func:`pipeline.run._plan.plan_chunks`): at least one chunk per
trial slot, and on GPU trials as many members per chunk as the device memory holds
(:func:`pipeline.grid._cost.chunk_members`).
"""

from __future__ import annotations

import math
import os

from phasesweep.pipeline.run._ray import cluster_address, connect
from phasesweep.pipeline.spec import SpecError

#: Environment variable stating the memory of one GPU in GiB, for planning GPU trials
#: where no GPU can be seen (``run --dry-run`` on a laptop); ``--device-memory`` wins.
DEVICE_MEMORY_ENV = "PHASESWEEP_DEVICE_MEMORY"


def trial_slots(address: str | None, cpus_per_trial: float) -> int:
    """How many trials of ``cpus_per_trial`` CPUs run at once: on the cluster at
    ``address`` or ``$RAY_ADDRESS`` (connecting to it), else on this machine."""
    if cluster_address(address):
        connect(address)  # first: it sets what Ray reads when first imported
        import ray

        cpus = ray.cluster_resources().get("CPU", 1)
    else:
        cpus = os.cpu_count() or 1
    return max(1, int(cpus // cpus_per_trial))


def trial_resources(
    address: str | None,
    cpus_per_trial: float,
    gpus_per_trial: float = 0.0,
    device_memory: float | None = None,
) -> tuple[int, int | None]:
    """(trials that run at once, bytes of device memory each) for a launch.

    CPU trials (``gpus_per_trial`` 0): the CPU slots and None. GPU trials: as many as
    the GPUs allow too (GPUs // gpus_per_trial, at least 1), each with ``gpus_per_trial``
    times the memory of one GPU: ``device_memory`` GiB if given, else
    ``$PHASESWEEP_DEVICE_MEMORY`` GiB, else the free memory of the GPU that this process
    or, on a cluster, a one-GPU Ray task sees. No GPU and no stated memory is a
    :class:`SpecError` on ``--gpus-per-trial`` (exit 2).
    """
    slots = trial_slots(address, cpus_per_trial)
    if gpus_per_trial <= 0:
        return slots, None
    stated = device_memory if device_memory is not None else os.environ.get(DEVICE_MEMORY_ENV)
    gpus, free = _gpus(address)
    if stated is not None:
        key = "--device-memory" if device_memory is not None else f"${DEVICE_MEMORY_ENV}"
        try:
            per_gpu = float(stated) * 2**30
        except ValueError:
            per_gpu = math.nan
        if not (math.isfinite(per_gpu) and per_gpu > 0):
            raise SpecError(key, stated, "expected one GPU's memory in GiB, > 0", "argument")
    elif free is None:
        raise SpecError(
            "--gpus-per-trial",
            gpus_per_trial,
            "no GPU found to plan GPU trials for: run where the GPUs are, or state one GPU's "
            f"memory with --device-memory GiB (or ${DEVICE_MEMORY_ENV})",
            "argument",
        )
    else:
        per_gpu = free
    slots = min(slots, max(1, int(max(gpus, 1) // gpus_per_trial)))
    return slots, int(per_gpu * gpus_per_trial)


def _gpus(address: str | None) -> tuple[float, int | None]:
    """(GPUs, free bytes of one GPU or None) on the cluster or, embedded, this machine."""
    if cluster_address(address):
        connect(address)
        import ray

        gpus = ray.cluster_resources().get("GPU", 0)
        if not gpus:
            return 0, None
        return gpus, ray.get(ray.remote(num_gpus=1)(_free_gpu_memory).remote())
    import torch

    if not torch.cuda.is_available():
        return 0, None
    return torch.cuda.device_count(), _free_gpu_memory()


def _free_gpu_memory() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0])
