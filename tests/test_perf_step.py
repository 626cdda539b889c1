"""Correctness of the optimised training step (pipeline.train._models.EnsembleStep) and of the
trainer's fused step loop and chunk sizing. No timings: the speed is benchmarks/' job."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from phasesweep.pipeline import activations
from phasesweep.pipeline.grid import Chunk, expand, make_chunks
from phasesweep.pipeline.spec import ModelConfig, validate_spec
from phasesweep.pipeline.train._models import (
    CPU_BLOCK_BYTES,
    EnsembleMLP,
    EnsembleStep,
    Params,
    block_bytes_per_member,
    loss_and_grads,
)
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk

E, N, D, K = 7, 9, 5, 2


def _net_and_params(activation, parameterization, bias, depth, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cfg = ModelConfig(
        depth=depth, width=6, activation=activation, parameterization=parameterization, bias=bias
    )
    slope = torch.rand(E, generator=gen, dtype=dtype)
    net = EnsembleMLP(cfg, D, K, leaky_slope=slope)
    weights = [
        torch.randn(E, b, a, generator=gen, dtype=dtype)
        for a, b in zip(net.dims[:-1], net.dims[1:])
    ]
    biases = [torch.randn(E, b, generator=gen, dtype=dtype) for b in net.dims[1:]] if bias else None
    x = torch.randn(E, N, D, generator=gen, dtype=dtype)
    y = torch.randn(E, N, K, generator=gen, dtype=dtype)
    return net, Params(weights, biases), x, y


CASES = list(
    itertools.product(
        activations.names(),  # every registered activation
        ["standard", "ntk", "mean_field"],
        [False, True],
        [1, 2, 4],
    )
)


@pytest.mark.parametrize("activation,parameterization,bias,depth", CASES)
@pytest.mark.parametrize("block", [None, 1, 3])
def test_blocked_step_equals_reference_backward(activation, parameterization, bias, depth, block):
    net, params, x, y = _net_and_params(activation, parameterization, bias, depth)
    loss0, grads0, _ = loss_and_grads(net, params, x, y)
    step = EnsembleStep(net, E, block)
    loss1, grads1 = step.loss_and_grads(params, x, y)
    torch.testing.assert_close(loss1, loss0, rtol=1e-12, atol=0)
    for g1, g0 in zip(grads1.tensors(), grads0.tensors()):
        torch.testing.assert_close(g1, g0, rtol=1e-11, atol=1e-14)
    torch.testing.assert_close(step.loss(params, x, y), loss0, rtol=1e-12, atol=0)
    # fused update == θ − η∇L, member-wise η
    eta = torch.rand(E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    moved = params.clone()
    loss2 = step.step(moved, x, y, eta)
    torch.testing.assert_close(loss2, loss0, rtol=1e-12, atol=0)
    for p1, p0, g0 in zip(moved.tensors(), params.tensors(), grads0.tensors()):
        expected = p0 - eta.view(-1, *([1] * (p0.dim() - 1))) * g0
        torch.testing.assert_close(p1, expected, rtol=1e-12, atol=1e-14)


def test_step_float32_and_uniform_leaky_slope():
    net, params, x, y = _net_and_params("leaky_relu", "ntk", True, 3, dtype=torch.float32)
    net.slope = 0.1  # one slope for every member: the in-place leaky_relu_ path
    loss0, grads0, _ = loss_and_grads(net, params, x, y)
    loss1, grads1 = EnsembleStep(net, E, 2).loss_and_grads(params, x, y)
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    for g1, g0 in zip(grads1.tensors(), grads0.tensors()):
        torch.testing.assert_close(g1, g0, rtol=1e-5, atol=1e-6)


def test_cached_views_follow_in_place_updates_and_new_tensors():
    """Repeated steps reuse views of the same tensors; new tensors or shapes rebuild them."""
    net, params, x, y = _net_and_params("relu", "ntk", True, 3)
    step = EnsembleStep(net, E, 2)
    eta = torch.full((E,), 0.01, dtype=torch.float64)
    ref = params.clone()
    for i in range(4):
        xs, ys = (x, y) if i % 2 == 0 else (x[:, :4], y[:, :4])  # minibatch and full batch
        _, g, _ = loss_and_grads(net, ref, xs, ys)
        for p, gp in zip(ref.tensors(), g.tensors()):
            p.sub_(eta.view(-1, *([1] * (p.dim() - 1))) * gp)
        step.step(params, xs, ys, eta)
    for p, r in zip(params.tensors(), ref.tensors()):
        torch.testing.assert_close(p, r, rtol=1e-12, atol=1e-14)
    other = params.clone()  # different tensors: must not write into the cached ones
    before = [p.clone() for p in params.tensors()]
    step.step(other, x, y, eta)
    for p, b in zip(params.tensors(), before):
        assert torch.equal(p, b)


def test_members_never_mix_even_when_one_is_not_finite():
    net, params, x, y = _net_and_params("relu", "ntk", False, 3)
    params.weights[1][2] = float("nan")
    params.weights[0][4] = float("inf")
    loss, grads = EnsembleStep(net, E, 3).loss_and_grads(params, x, y)
    ok = [i for i in range(E) if i not in (2, 4)]
    loss0, grads0, _ = loss_and_grads(
        net, Params([w[ok] for w in params.weights], None), x[ok], y[ok]
    )
    torch.testing.assert_close(loss[ok], loss0, rtol=1e-12, atol=0)
    for g, g0 in zip(grads.tensors(), grads0.tensors()):
        torch.testing.assert_close(g[ok], g0, rtol=1e-11, atol=1e-14)


def test_block_size_from_cache_budget_is_balanced():
    cfg = ModelConfig(depth=3, width=64)
    net = EnsembleMLP(cfg, 10, 1)
    x = torch.zeros(256, 128, 10, dtype=torch.float64)
    step = EnsembleStep(net, 256)
    b = step.block_size(x)
    per = block_bytes_per_member(net.dims, 128, 8)
    assert b == max(1, CPU_BLOCK_BYTES // per) and 1 < b < 256
    params = Params(
        [torch.zeros(256, o, i, dtype=torch.float64) for i, o in zip(net.dims[:-1], net.dims[1:])],
        None,
    )
    _, blocks = step.blocks_for(params, x)
    sizes = [k.e - k.s for k in blocks]
    assert sum(sizes) == 256 and max(sizes) <= b and max(sizes) - min(sizes) <= 1
    assert [k.s for k in blocks[1:]] == [k.e for k in blocks[:-1]]
    assert EnsembleStep(net, 256, block=5).block_size(x) == 5
    huge = EnsembleMLP(ModelConfig(depth=3, width=4096), 10, 1)
    assert EnsembleStep(huge, 8).block_size(x[:8]) == 1


def _spec(**train):
    return validate_spec(
        {
            "name": "t",
            "model": {"depth": 3, "width": 12, "activation": "relu", "bias": True},
            "data": {"kind": "teacher", "n_train": 16, "n_test": 20, "input_dim": 5},
            "train": {"steps": 40, "lr": 0.1, "log_points": 8, **train},
            "metrics": {"probe_size": 8},
            "grid": {"init_scale": [0.3, 1.0, 2.0], "lr": [0.05, 0.2], "seed": [0, 1]},
        }
    )


def _frame(tables, name, keys):
    return tables[name].to_pandas().sort_values(keys).reset_index(drop=True)


@pytest.mark.parametrize(
    "train",
    [
        {},
        {"optimizer": "sgd", "batch_size": 4},
        {"lr_schedule": "cosine", "lr_min_frac": 0.1},
        {"lr_schedule": "norm_adaptive", "lr_c": 0.5},
    ],
)
def test_fused_steps_equal_unfused_steps(train):
    """Sparse logging (fused steps in between) == logging every step (no fused step)."""
    sparse = _spec(**train)
    dense = _spec(**{**train, "log_points": 1000})  # every step logged: no fused step
    pts_s, pts_d = expand(sparse), expand(dense)
    a = train_chunk(make_chunks(pts_s, sparse)[0])
    b = train_chunk(make_chunks(pts_d, dense)[0])
    # run ids differ (log_points is part of the config): match by grid position
    rename = {d.run_id: s.run_id for s, d in zip(pts_s, pts_d)}
    ta = _frame(a, "trajectories", ["run_id", "step"])
    tb = _frame(b, "trajectories", ["run_id", "step"])
    tb["run_id"] = tb.run_id.map(rename)
    tb = ta[["run_id", "step"]].merge(tb, on=["run_id", "step"], how="left")
    assert len(ta) == len(tb) > len(pts_s)
    for col in ["time", "train_loss", "test_loss", "param_rel_change", "grad_norm"]:
        np.testing.assert_allclose(ta[col], tb[col], rtol=1e-10, err_msg=col)


def test_divergent_member_in_a_fused_step_is_stopped_like_before():
    spec = validate_spec(
        {
            "name": "t",
            "model": {"depth": 3, "width": 12},
            "data": {"n_train": 16, "n_test": 20, "input_dim": 5},
            "train": {"steps": 60, "log_points": 5},
            "metrics": {"probe_size": 8},
            "grid": {"lr": [0.05, 200.0], "seed": [0, 1]},
        }
    )
    points = expand(spec)
    trainer = ChunkTrainer(make_chunks(points, spec)[0])
    tables = trainer.run()
    runs = tables["runs"].to_pandas().set_index("run_id")
    traj = tables["trajectories"].to_pandas()
    for p in points:
        row = runs.loc[p.run_id]
        rows = traj[traj.run_id == p.run_id]
        assert np.isfinite(rows.train_loss).all()
        if p.config.train.lr == 200.0:
            assert row.status == "diverged" and 0 < row.final_step < 60
            assert rows.step.max() < row.final_step
        else:
            assert row.status == "completed"
    assert set(trainer.timing) == {"train_s", "metrics_s", "setup_s", "other_s"}


def test_make_chunks_balanced_and_min_chunks():
    spec = _spec()
    points = expand(spec)  # 12 points, one shape
    assert [len(c.points) for c in make_chunks(points, spec)] == [12]
    sizes = [len(c.points) for c in make_chunks(points, spec, min_chunks=5)]
    assert sum(sizes) == 12 and len(sizes) == 5 and max(sizes) - min(sizes) <= 1
    assert len(make_chunks(points, spec, min_chunks=100)) == 12
    small = spec.model_copy(
        update={"execution": spec.execution.model_copy(update={"max_chunk_size": 5})}
    )
    sizes = [len(c.points) for c in make_chunks(points, small)]
    assert sizes == [4, 4, 4]
    # every point exactly once, and chunk ids are deterministic
    ids = [p.run_id for c in make_chunks(points, spec, min_chunks=5) for p in c.points]
    assert sorted(ids) == sorted(p.run_id for p in points)
    assert [c.chunk_id for c in make_chunks(points, spec, 5)] == [
        c.chunk_id for c in make_chunks(points, spec, 5)
    ]
    assert isinstance(make_chunks(points, spec)[0], Chunk)


@pytest.mark.parametrize("kind", ["subspace", "symmetric"])
def test_metrics_in_member_blocks_equal_metrics_of_the_whole_chunk(monkeypatch, kind):
    import phasesweep.pipeline.train._metric_blocks as blocks_mod

    data = {"kind": kind, "n_train": 16, "n_test": 20, "input_dim": 5}
    if kind == "subspace":
        data["subspace_dim"] = 2
    spec = validate_spec(
        {
            "name": "t",
            "model": {"depth": 3, "width": 12, "activation": "leaky_relu", "bias": True},
            "data": data,
            "train": {"steps": 30, "log_points": 6},
            "metrics": {"probe_size": 8},
            "grid": {"leaky_slope": [0.0, 0.1, 0.3], "seed": [0, 1, 2]},
        }
    )
    chunk = make_chunks(expand(spec), spec)[0]
    whole = train_chunk(chunk)
    monkeypatch.setattr(blocks_mod, "METRICS_BLOCK", 4)  # 9 members: blocks of 3
    blocked = train_chunk(chunk)
    for name, keys in (
        ("trajectories", ["run_id", "step"]),
        ("layers", ["run_id", "step", "layer"]),
    ):
        a, b = _frame(whole, name, keys), _frame(blocked, name, keys)
        assert list(a.columns) == list(b.columns) and len(a) == len(b)
        for col in a.columns:
            if col == "attempt":  # set by the store
                continue
            if a[col].dtype == object and col != "run_id":
                x = np.concatenate([np.asarray(v, float) for v in a[col] if v is not None] or [[]])
                y = np.concatenate([np.asarray(v, float) for v in b[col] if v is not None] or [[]])
                np.testing.assert_allclose(x, y, rtol=1e-10, err_msg=col)
            elif a[col].dtype.kind == "f":
                np.testing.assert_allclose(a[col], b[col], rtol=1e-10, atol=1e-300, err_msg=col)
            else:
                assert (a[col] == b[col]).all(), col


def test_a_device_budget_splits_the_ensemble_and_changes_nothing_else():
    """The accelerator's sizing (blocks from a memory budget) on CPU tensors: a budget of
    three members' bytes gives blocks of at most three, with the losses, gradients and
    fused update of the whole ensemble in one block."""
    net, params, x, y = _net_and_params("tanh", "ntk", True, 3)
    per = block_bytes_per_member(net.dims, x.shape[1], x.element_size())
    small = EnsembleStep(net, E, budget=3 * per + per // 2)
    whole = EnsembleStep(net, E, block=E)
    assert small.block_size(x) == 3 and whole.block_size(x) == E
    _, blocks = small.blocks_for(params, x)
    assert max(k.e - k.s for k in blocks) == 3 and len(blocks) == -(-E // 3)
    loss0, grads0 = whole.loss_and_grads(params, x, y)
    loss1, grads1 = small.loss_and_grads(params, x, y)
    torch.testing.assert_close(loss1, loss0, rtol=1e-12, atol=0)
    for g1, g0 in zip(grads1.tensors(), grads0.tensors()):
        torch.testing.assert_close(g1, g0, rtol=1e-11, atol=1e-14)
    eta = torch.full((E,), 0.05, dtype=torch.float64)
    a, b = params.clone(), params.clone()
    small.step(a, x, y, eta)
    whole.step(b, x, y, eta)
    for pa, pb in zip(a.tensors(), b.tensors()):
        torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-14)
    assert EnsembleStep(net, E, budget=1).block_size(x) == 1  # at least one member


def test_block_budget_per_device(monkeypatch):
    """CPU: the cache budget; CUDA: half the free memory torch reports (the CUDA branch,
    with torch's report replaced, so it runs on a machine without a GPU); a device that
    reports nothing: no budget, one block."""
    from phasesweep.pipeline.train import _models

    assert _models.block_budget(torch.device("cpu")) == CPU_BLOCK_BYTES
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10_000, 80_000))
    assert _models.free_device_bytes(torch.device("cuda", 0)) == 10_000
    assert _models.block_budget(torch.device("cuda", 0)) == 5_000
    assert _models.block_budget(torch.device("meta")) is None
    net, _, x, _ = _net_and_params("relu", "ntk", False, 2)
    monkeypatch.setattr(_models, "block_budget", lambda device: None)
    assert EnsembleStep(net, E).block_size(x) == E
