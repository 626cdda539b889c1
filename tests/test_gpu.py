"""The GPU tier (pytest marker ``gpu``; ``scripts/gpu-check`` runs it): the trainer on
CUDA, in this process, without Ray, against the same chunks on the CPU.

Skipped, with the reason, where torch sees no CUDA device. It imports only the trainer's
own needs (torch, numpy, pyarrow, pandas, pydantic, pyyaml: no Ray, DuckDB, fsspec,
Optuna or plotting), so that it runs on a GPU machine that has little more than a CUDA
build of torch; ``scripts/gpu-check`` runs it without ``conftest.py`` for that reason.
The same paths run on CPU tensors in ``tests/test_device_paths.py`` on every machine.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch
from chunks import checkpoint_at, only_chunk, small_spec
from phasesweep.pipeline.train._capture import GRAPH_WARMUP
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk
from phasesweep.storage.schema import log_steps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed

from benchmarks.gpu import column_differences  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

#: float64 on two devices: the same arithmetic in other summation orders (cuBLAS against
#: the CPU's BLAS), so equal to round-off, which 60-90 steps of GD amplify a little.
RTOL = 1e-9


def _assert_close(a_tables, b_tables, rtol=RTOL):
    """Every stored column (:func:`benchmarks.gpu.column_differences`): the same rows and
    NULLs, values within ``rtol`` of the column's scale."""
    for column, d in column_differences(a_tables, b_tables).items():
        assert d["null_mismatches"] == 0 and d["max_rel_diff"] <= rtol, (column, d)


CASES = {
    "gd_relu": {},
    "sgd": {"train": {"optimizer": "sgd", "batch_size": 4}},
    "cosine": {"train": {"lr_schedule": "cosine", "lr_min_frac": 0.1}},
    "norm_adaptive": {"train": {"lr_schedule": "norm_adaptive", "lr_c": 0.5}},
    "linear_factored": {
        "model": {"activation": "linear", "bias": False, "depth": 4},
        "data": {"kind": "teacher", "n_train": 64},
    },
    "tanh_symmetric": {"model": {"activation": "tanh"}, "data": {"kind": "symmetric"}},
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_chunk_on_the_gpu_stores_what_it_stores_on_the_cpu(case):
    chunk = only_chunk(small_spec(**case))
    trainer = ChunkTrainer(chunk, "cuda")
    gpu = trainer.run()
    _assert_close(train_chunk(chunk, "cpu"), gpu)
    assert set(gpu["runs"].column("device").to_pylist()) == {torch.cuda.get_device_name()}
    steps = trainer.base.train.steps
    non_logged = steps + 1 - len(log_steps(steps, trainer.base.train.log_points))
    assert trainer.step_graph.replays == non_logged - GRAPH_WARMUP  # the rest from the graph


def test_no_step_synchronises_with_the_host():
    """CUDA's own check: non-logged steps (the eager warm-up and the capture) and, with
    the spectra off, logged steps too, whose rows go to pinned memory asynchronously."""
    chunk = only_chunk(small_spec(metrics={"spectra": False, "ntk": False}))
    trainer = ChunkTrainer(chunk, "cuda")
    checked = []

    def strict(fn):
        def call(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
                checked.append(fn.__name__)

        return call

    trainer.fused_step = strict(trainer.fused_step)
    trainer.log_step = strict(trainer.log_step)
    trainer.run()
    assert checked.count("fused_step") == GRAPH_WARMUP + 1 and "log_step" in checked


def _snapshot(chunk, device, k):
    """The checkpoint loaded onto the CPU, as the driver loads every checkpoint."""
    return torch.load(
        io.BytesIO(checkpoint_at(chunk, k, device)), map_location="cpu", weights_only=True
    )


@pytest.mark.parametrize("written_on", ["cuda", "cpu"])
def test_a_checkpoint_resumes_on_the_gpu(written_on):
    """Loaded onto the CPU as the driver loads it, resumed on the GPU: the uninterrupted
    GPU run's rows (to round-off where the first 48 steps ran on the CPU)."""
    chunk = only_chunk(
        small_spec(train={"steps": 90}, grid={"lr": [0.05, 0.2, 200.0], "seed": [0, 1]})
    )
    whole = train_chunk(chunk, "cuda")
    resumed = train_chunk(chunk, "cuda", resume=_snapshot(chunk, written_on, 48))
    _assert_close(whole, resumed, rtol=1e-13 if written_on == "cuda" else RTOL)


def test_free_memory_is_asked_once_per_chunk_not_per_step(monkeypatch):
    calls = []
    real = torch.cuda.mem_get_info
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: calls.append(1) or real(*a))
    train_chunk(only_chunk(small_spec(train={"steps": 200})), "cuda")
    assert 1 <= len(calls) <= 3  # the step's blocks, the metrics' block (and a test loss's)
