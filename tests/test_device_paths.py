"""The GPU's code paths, checked on any machine (issue 27): the device a trial trains on,
resuming a checkpoint on another device, no host read inside a non-logged step, the
capturable step run eagerly with the CPU step's results, and the accelerator's paths
(device clock, packed log copies, one metrics block, spectra and kernel predictor by
batched matmuls) storing what the CPU
paths store. The same checks on a real GPU are in ``tests/test_gpu.py``."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from chunks import checkpoint_at, only_chunk, small_spec
from host_reads import HostReads
from phasesweep.pipeline.train import _device, _models
from phasesweep.pipeline.train._metric_blocks import metrics_block
from phasesweep.pipeline.train._state import LoopState
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed

from benchmarks.gpu import column_differences  # noqa: E402

#: Stored columns that are the same computation in another order of kernels on the
#: accelerator's paths (batched matmuls instead of LAPACK): equal to round-off, not bit for bit.
SPECTRAL = {
    "trajectories.ntk_eig_min",
    "trajectories.ntk_eig_max",
    "trajectories.lin_test_loss",
    "trajectories.lin_distance",
    "layers.top_sv",
    "layers.delta_top_sv",
    "layers.stable_rank",
}


#: The kernel predictor's columns are within (S·n + t‖A‖)·ε of LAPACK's on the accelerator's
#: path, the problem's own condition (``pipeline/train/metrics/_decay.py``): t‖A‖ reaches
#: about 10² in these chunks, so 64 times the other columns' bound.
PREDICTOR_ULPS = {"trajectories.lin_test_loss": 64, "trajectories.lin_distance": 64}


def _without(tables, column):
    return {name: t.drop_columns([column]) for name, t in tables.items()}


# -- the device a trial trains on ------------------------------------------------------------


def test_a_trial_without_a_gpu_trains_on_the_cpu():
    assert _device.trial_device({"CPU": 2.0}) == torch.device("cpu")
    assert _device.trial_device({"CPU": 1.0, "GPU": 0.0}) == torch.device("cpu")


def test_a_trial_given_a_gpu_trains_on_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _device.trial_device({"CPU": 1.0, "GPU": 0.25}) == torch.device("cuda", 0)


@pytest.mark.parametrize("cuda_build", [None, "12.8"])
def test_a_trial_given_a_gpu_that_torch_cannot_use_fails_and_says_how_to_fix_it(
    monkeypatch, cuda_build
):
    """Never the silent fallback to the CPU: a CPU-only build, or a CUDA build that sees
    no device, fails with the install command."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    with pytest.raises(_device.CudaUnavailableError) as err:
        _device.trial_device({"CPU": 1.0, "GPU": 1.0})
    message = str(err.value)
    assert "given 1 GPU" in message and "pip install torch==2.13.0" in message
    assert ("CPU-only build" in message) == (cuda_build is None)
    assert ("sees no usable GPU" in message) == (cuda_build is not None)


def test_the_accelerator_paths_are_taken_off_the_cpu_only():
    assert not _device.accelerated("cpu") and not ChunkTrainer(only_chunk(small_spec())).accelerated
    assert _device.accelerated("cuda") and _device.accelerated(torch.device("meta"))


# -- resume on another device ----------------------------------------------------------------


class _Stop(Exception):
    pass


def test_a_checkpoint_resumes_on_a_device_other_than_the_one_that_wrote_it():
    """Loaded onto the CPU (as the driver loads every checkpoint), resumed by a trainer on
    another device (``meta``: a device without data, so any host read in the step
    raises): the training state moves to the trainer's device, the logged rows stay on
    the host, and the non-logged steps run there up to the next checkpoint. Before the
    fix the rows went to the device and ``.numpy()`` on them failed."""
    spec = small_spec(
        train={"steps": 600, "log_points": 8},
        metrics={"ntk": False},  # the kernel predictor reads its eigen-solver's convergence
    )
    chunk = only_chunk(spec)
    # no logged step in [480, 496): the trainer on `meta` takes 16 non-logged steps
    assert not set(range(480, 496)) & set(np.unique(np.geomspace(1, 600, 8).round()))
    state = torch.load(io.BytesIO(checkpoint_at(chunk, 480)), map_location="cpu", weights_only=True)
    seen = []

    def stop(k, state_now):
        seen.append(k)
        raise _Stop

    with pytest.raises(_Stop):
        train_chunk(chunk, "meta", hook=stop, resume=state)
    assert seen == [496]
    moved = LoopState.resumed(state, torch.device("meta"))
    assert {getattr(moved, key).device.type for key in LoopState.SAVED} == {"meta"}


@pytest.mark.parametrize("accelerated", [False, True])
def test_resume_from_the_store_equals_an_uninterrupted_run(tmp_path, accelerated):
    """The driver's path: a checkpoint in the store, loaded by the next holder of the
    points (`train_and_store`), gives the uninterrupted run's rows, on the CPU's paths and
    on the accelerator's."""
    import pyarrow.parquet as pq
    from phasesweep.pipeline.run._trial import train_and_store
    from phasesweep.storage import Store
    from phasesweep.storage._checkpoints import Checkpoint

    spec = small_spec(train={"steps": 90}, grid={"lr": [0.05, 0.2, 200.0], "seed": [0, 1]})
    chunk = only_chunk(spec)
    store = Store.open(str(tmp_path / "store"))
    ids = [p.run_id for p in chunk.points]
    Checkpoint.of(store, "t", chunk.chunk_id, ids).write(checkpoint_at(chunk, 48))
    summary = train_and_store(store.uri, "t", chunk, "cpu")
    assert summary["resumed"] == len(ids) and summary["points"] == len(ids)
    whole = ChunkTrainer(chunk, accelerated=accelerated).run()
    stored = {
        name: pa.concat_tables([pq.read_table(f) for f in store.readable_files(name, "t")])
        .select(whole[name].column_names)
        .drop_columns(["attempt"])  # the store's
        for name in whole
    }
    for column, d in column_differences(stored, _without(whole, "attempt")).items():
        exact = not accelerated or column not in SPECTRAL  # matmuls against LAPACK: below
        assert d["null_mismatches"] == 0 and (d["max_rel_diff"] == 0 or not exact), column


def test_a_trial_encodes_its_tables_on_its_threads(tmp_path, monkeypatch):
    """`train_and_store` hands the store the trial's torch threads (the CPUs Ray gave it)
    to encode the chunk's Parquet files on, and the chunk is committed."""
    from phasesweep.pipeline.run._trial import train_and_store
    from phasesweep.storage import Store

    chunk = only_chunk(small_spec(train={"steps": 10}, grid={"seed": [0, 1]}))
    store = Store.open(str(tmp_path / "store"))
    seen = []
    real = Store.write_chunk

    def write_chunk(self, sweep, chunk_id, tables, *, threads=1):  # noqa: ANN001
        seen.append(threads)
        real(self, sweep, chunk_id, tables, threads=threads)

    monkeypatch.setattr(Store, "write_chunk", write_chunk)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        summary = train_and_store(store.uri, "t", chunk, "cpu")
    finally:
        torch.set_num_threads(threads)
    assert seen == [2] and summary["points"] == 2
    assert store.done_run_ids("t") == {p.run_id for p in chunk.points}


# -- the accelerator's paths on the CPU ------------------------------------------------------

TRAINS = {
    "gd": {},
    "sgd": {"optimizer": "sgd", "batch_size": 4},
    "cosine": {"lr_schedule": "cosine", "lr_min_frac": 0.1},
    "norm_adaptive": {"lr_schedule": "norm_adaptive", "lr_c": 0.5},
}


@pytest.mark.parametrize("train", TRAINS.values(), ids=TRAINS.keys())
def test_the_capturable_step_run_eagerly_equals_the_cpu_step(train):
    """The non-logged step with its step index as a device tensor (what a CUDA graph
    captures) against the same step with Python integers: every parameter and every
    piece of state bit for bit, step after step, a diverging member included."""
    trainer = ChunkTrainer(only_chunk(small_spec(train=train)))
    sgd = trainer.base.train.optimizer == "sgd"
    stepper = trainer.make_step()
    runs = []
    for device_clock in (False, True):
        params = trainer.params0.clone()
        state = LoopState.fresh(trainer.E, trainer.base.train.steps, trainer.dtype, trainer.device)
        x, y = trainer.minibatch(0) if sgd else (trainer.batch.x_train, trainer.batch.y_train)
        state.begin(stepper.loss(params, x, y), trainer.base.train.divergence_factor)
        state.step.fill_(1)
        for k in range(1, 40):
            x, y = trainer.minibatch(k) if sgd else (x, y)
            trainer.fused_step(stepper, state, params, x, y, state.step if device_clock else k)
        runs.append((params, state))
    (p0, s0), (p1, s1) = runs
    assert int(s1.step) == 40
    capped = train.get("lr_schedule") == "norm_adaptive"  # its η ≤ c‖θ‖^(2−L): none diverges
    assert s0.alive.any() and capped == bool(s0.alive.all())  # lr 200 diverged, others go on
    same = lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)  # noqa: E731
    for a, b in zip(p0.tensors(), p1.tensors()):
        same(a, b)
    for key in LoopState.SAVED:
        same(getattr(s0, key), getattr(s1, key))


@pytest.mark.parametrize("train", TRAINS.values(), ids=TRAINS.keys())
def test_the_clock_known_ahead_is_the_trainers_bit_for_bit(train):
    """The schedule's clock at the logged steps (what the accelerated kernel predictor
    evaluates ahead) equals the time column the trainer stores, bit for bit, on every row
    of every member (a diverged member's rows end early); none where η depends on θ."""
    trainer = ChunkTrainer(only_chunk(small_spec(train=train)), accelerated=True)
    traj = trainer.run()["trajectories"].to_pandas()
    steps = sorted(int(k) for k in traj.step.unique())
    clock = trainer.schedule.clock(steps)
    if train.get("lr_schedule") == "norm_adaptive":
        assert clock is None
        return
    assert clock.shape == (trainer.E, len(steps))
    compared = 0
    for e, point in enumerate(trainer.chunk.points):
        rows = traj[traj.run_id == point.run_id].sort_values("step")
        np.testing.assert_array_equal(rows.time.to_numpy(), clock[e, : len(rows)].numpy())
        compared += len(rows)
    assert compared > trainer.E * len(steps) // 2 and len(steps) >= 10


ACCELERATED_CASES = {
    **{name: {"train": train} for name, train in TRAINS.items()},
    "linear_factored": {
        "model": {"activation": "linear", "bias": False, "depth": 4},
        "data": {"kind": "teacher", "n_train": 64},
    },
    "tanh_symmetric": {"model": {"activation": "tanh"}, "data": {"kind": "symmetric"}},
    "leaky_mixed_slopes": {
        "model": {"activation": "leaky_relu"},
        "grid": {"leaky_slope": [0.0, 0.1, 0.3], "seed": [0, 1]},
    },
    "float32": {"train": {"dtype": "float32"}},
}


@pytest.mark.parametrize("case", ACCELERATED_CASES.values(), ids=ACCELERATED_CASES.keys())
def test_accelerated_paths_store_what_the_cpu_paths_store(case):
    """Every stored column of a chunk trained on the accelerator's paths (on CPU tensors)
    equals the CPU paths' bit for bit, but the spectra, which a different method computes:
    those within a few ulps of their scale (the kernel's largest eigenvalue, the layer's
    largest singular value, the output's RMS), as any two backward-stable solvers, and the
    kernel predictor's within its condition (``PREDICTOR_ULPS``)."""
    chunk = only_chunk(small_spec(**case))
    cpu = ChunkTrainer(chunk).run()
    acc = ChunkTrainer(chunk, accelerated=True).run()
    float32 = case.get("train", {}).get("dtype") == "float32"
    ulps = 64 * torch.finfo(torch.float32 if float32 else torch.float64).eps
    differences = column_differences(cpu, acc)
    assert {"trajectories.train_loss", "layers.top_sv", "runs.t_cross_050"} <= set(differences)
    for column, d in differences.items():
        assert d["null_mismatches"] == 0, column
        bound = ulps * PREDICTOR_ULPS.get(column, 1) if column in SPECTRAL else 0.0
        assert d["max_rel_diff"] <= bound, column


def test_no_host_read_in_a_non_logged_step_and_one_copy_per_logged_step():
    """On the accelerator's paths: a non-logged step reads nothing on the host; a logged
    step copies its packed rows once, and otherwise reads only the batched spectra's
    convergence flags (one per sweep) where it computes them."""
    chunk = only_chunk(small_spec(train={"steps": 80, "log_points": 10}))
    trainer = ChunkTrainer(chunk, accelerated=True)
    step, log_step = trainer.fused_step, trainer.log_step
    steps, logged = [], []

    def counted(record, fn):
        def call(*args, **kwargs):
            with HostReads() as reads:
                fn(*args, **kwargs)
            record.append(reads.calls)

        return call

    trainer.fused_step = counted(steps, step)
    trainer.log_step = counted(logged, log_step)
    trainer.run()
    assert len(steps) + len(logged) == 81 and len(logged) >= 8
    assert all(calls == [] for calls in steps)
    for calls in logged:
        copies = [c for c in calls if c[0] == "_tables"]
        # one copy of the packed rows; besides, the unpacking of a block that is on the host
        # already (a pinned host tensor on CUDA): no read of the device
        assert copies[0] == ("_tables", "add", "cpu")
        assert set(copies[1:]) <= {("_tables", "_unpack", "numpy")}
        # the kernel predictor's reads: the largest t‖A‖ of a block of logged steps, for
        # its number of halvings (the clock known ahead: one block of n_train + 1 steps)
        rest = {c[:2] for c in calls} - {("_tables", "add"), ("_tables", "_unpack")}
        assert rest <= {("_decay", "integrals")}
    predictor = [c for calls in logged for c in calls if c[:2] == ("_decay", "integrals")]
    assert len(predictor) == -(-len(logged) // (trainer.batch.x_train.shape[1] + 1))


def test_the_cpu_step_reads_nothing_on_the_host_either():
    trainer = ChunkTrainer(only_chunk(small_spec(train=TRAINS["sgd"])))
    step, reads = trainer.fused_step, []

    def counted(*args, **kwargs):
        with HostReads() as r:
            step(*args, **kwargs)
        reads.extend(r.calls)

    trainer.fused_step = counted
    trainer.run()
    assert reads == []


def test_host_reads_sees_what_would_synchronise_a_gpu():
    t = torch.ones(3)
    with HostReads() as reads:
        bool(t.all())
        t.sum().item()
        t.to("cpu")
        t[t > 0]
        _ = t * 2 + t.sum()
    assert [c[2] for c in reads.calls] == ["__bool__", "item", "to", "index"]


# -- sizing -----------------------------------------------------------------------------------


def test_the_block_budget_is_measured_once_per_stepper(monkeypatch):
    """Free device memory is a host query (a synchronisation on CUDA): a stepper asks
    for it once, not at every step."""
    calls = []
    real = _models.block_budget
    monkeypatch.setattr(_models, "block_budget", lambda device: calls.append(1) or real(device))
    trainer = ChunkTrainer(only_chunk(small_spec()))
    stepper = trainer.make_step()
    params, x, y = trainer.params0.clone(), trainer.batch.x_train, trainer.batch.y_train
    eta = torch.full((trainer.E,), 0.01, dtype=trainer.dtype)
    for _ in range(5):
        stepper.step(params, x, y, eta)
        stepper.loss(params, trainer.batch.x_test, trainer.batch.y_test)
    stepper.reset()  # before a CUDA graph's capture: the layout is rebuilt, not re-measured
    stepper.step(params, x, y, eta)
    assert len(calls) == 1


def test_metrics_take_one_block_on_an_accelerator_and_cache_blocks_on_the_cpu(monkeypatch):
    dims, probe, itemsize = [10, 64, 64, 1], 64, 8
    cpu = metrics_block(dims, probe, itemsize, torch.device("cpu"))
    assert 1 <= cpu <= 256
    assert metrics_block(dims, probe, itemsize, torch.device("cpu"), accelerated=True) > 10**9
    import phasesweep.pipeline.train._metric_blocks as blocks_mod

    monkeypatch.setattr(blocks_mod, "free_device_bytes", lambda device: 80 << 30)
    # activations and sensitivities, kernels, θ − θ(0) and two copies of the largest layer,
    # eight of the largest matrix the batched spectra hold (the 64 × 64 kernel and hidden
    # layer), four of the predictor's kernel on 128 + 64 inputs
    per_member = itemsize * (
        2 * 64 * 129 + 4 * 64 * 64 + (640 + 4096 + 64) + 2 * 4096 + 8 * 64 * 64 + 4 * 192 * 192
    )
    on_gpu = metrics_block(dims, probe, itemsize, torch.device("cuda"), predictor_rows=192)
    assert on_gpu == (40 << 30) // per_member  # half of 80 GiB: 23 743 members of this shape
    spectra_only = metrics_block(dims, probe, itemsize, torch.device("cuda"), kernels=False)
    assert spectra_only > on_gpu  # the kernels and the predictor off: more members a block
