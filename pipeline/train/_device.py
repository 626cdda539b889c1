"""Which device a trial trains on, and which code paths that device takes.

A trial that Ray gave a GPU trains on it or fails at once with an error that says how
to get a CUDA build of torch: falling back to the CPU would train the same numbers
tens of times slower, and only ``runs.device`` would show it.

Off the CPU the trainer takes its accelerator paths (:func:`accelerated`): the
non-logged step replayed as a CUDA graph, the logged rows copied to the host once per
logged step, the metrics of the whole chunk in one block, and the spectra and the kernel
predictor by fixed sequences of batched matmuls instead of one cuSOLVER call per member
(:mod:`pipeline.train.metrics._squaring`, :mod:`~pipeline.train.metrics._subspace`,
:mod:`~pipeline.train.metrics._decay`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: How a GPU user gets a CUDA build of torch (the README says the same).
CUDA_INSTALL_HINT = (
    "install a CUDA build of torch: `pip install torch==2.13.0` from PyPI is the CUDA build "
    "on Linux x86-64 (other platforms: https://pytorch.org/get-started/locally/), "
    "or launch without --gpus-per-trial to train on CPUs"
)


class CudaUnavailableError(RuntimeError):
    """A trial was given a GPU that this process's torch cannot use."""


def trial_device(assigned: Mapping[str, float]) -> torch.device:
    """The device of a trial with Ray's ``assigned`` resources (``{"CPU": 2, "GPU": 0.5}``):
    CUDA where it was given any share of a GPU, else the CPU.

    Ray exposes a trial's GPUs as ``CUDA_VISIBLE_DEVICES``, so its GPU is ``cuda:0``.
    Raises :class:`CudaUnavailableError` where a GPU was given but torch cannot use CUDA
    (a CPU-only build, or no driver or device visible to the process)."""
    gpus = float(assigned.get("GPU", 0) or 0)
    if gpus <= 0:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if torch.version.cuda is None:
        why = f"torch {torch.__version__} is a CPU-only build"
    else:
        why = (
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU "
            "(no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides the device)"
        )
    raise CudaUnavailableError(f"this trial was given {gpus:g} GPU but {why}: {CUDA_INSTALL_HINT}")


def accelerated(device: torch.device | str) -> bool:
    """Whether ``device`` takes the accelerator paths (see the module docstring): any
    device but the CPU. Tests run those paths on CPU tensors by passing ``accelerated``
    explicitly where a function takes it."""
    return torch.device(device).type != "cpu"
