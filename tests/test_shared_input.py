"""Members that share their input: the first layer as one GEMM per block
(pipeline.train._models.EnsembleStep, shared-input path) and how the trainer and the data stack
hand it a shared input. Checked against each member trained alone (E = 1, which never
takes the shared path), against autograd, and with one member's data different.

Tolerances: float64 throughout. 1e-10 relative is ~10⁶ units of round-off, far above
what any summation order of these short sums (≤ 48 terms) can lose, and far below what
a wrong term (a missing multiplier, bias or member) would change.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from phasesweep.pipeline.data._datasets import Dataset, stack
from phasesweep.pipeline.grid import Chunk, expand, make_chunks
from phasesweep.pipeline.spec import ModelConfig, validate_spec
from phasesweep.pipeline.train._models import (
    SHARED_MIN_BLOCK,
    SHARED_MIN_FIRST_LAYER,
    SHARED_MIN_INPUT_DIM,
    EnsembleMLP,
    EnsembleStep,
    Params,
    shares_input,
)
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk

E, N, D, K = 7, 24, 40, 2
RTOL = 1e-10
assert D >= SHARED_MIN_INPUT_DIM


def _setup(activation, parameterization, bias, depth, seed=0, width=6):
    gen = torch.Generator().manual_seed(seed)
    cfg = ModelConfig(
        depth=depth,
        width=width,
        activation=activation,
        parameterization=parameterization,
        bias=bias,
    )
    net = EnsembleMLP(cfg, D, K, leaky_slope=torch.rand(E, generator=gen, dtype=torch.float64))
    scale = [1.0 / np.sqrt(a) for a in net.dims[:-1]]
    weights = [
        s * torch.randn(E, b, a, generator=gen, dtype=torch.float64)
        for s, a, b in zip(scale, net.dims[:-1], net.dims[1:])
    ]
    biases = None
    if bias:
        biases = [0.1 * torch.randn(E, b, generator=gen, dtype=torch.float64) for b in net.dims[1:]]
    x0 = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = torch.randn(E, N, K, generator=gen, dtype=torch.float64)
    return net, Params(weights, biases), x0.expand(E, N, D), y


def _member(params: Params, e: int) -> Params:
    return Params(
        [w[e : e + 1].clone() for w in params.weights],
        None if params.biases is None else [v[e : e + 1].clone() for v in params.biases],
    )


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """|a − b| ≤ RTOL · max|b| per member (max over the member's entries)."""
    err = (a - b).abs().reshape(a.shape[0], -1).amax(1)
    ref = b.abs().reshape(b.shape[0], -1).amax(1)
    assert bool((err <= RTOL * ref).all()), f"{what}: {(err / ref).max():.3g} relative"


CASES = list(
    itertools.product(
        ["relu", "tanh", "linear", "leaky_relu"], ["ntk", "standard", "mean_field"], [False, True]
    )
)


@pytest.mark.parametrize("activation,parameterization,bias", CASES)
@pytest.mark.parametrize("depth,block", [(2, 3), (3, None), (4, 2)])
def test_shared_steps_equal_each_member_trained_alone(
    activation, parameterization, bias, depth, block
):
    """30 fused steps of the whole ensemble (blocks 3, 2, 2 / auto / 2, 2, 2, 1) == the same
    30 steps of each member alone, losses and final parameters."""
    net, params, x, y = _setup(activation, parameterization, bias, depth)
    start = params.clone()
    step = EnsembleStep(net, E, block)
    assert step.shared(params, x)
    _, blocks = step.blocks_for(params, x)
    assert all(k.shared for k in blocks)
    eta = torch.linspace(0.02, 0.1, E, dtype=torch.float64)
    losses = torch.stack([step.step(params, x, y, eta) for _ in range(30)], 1)
    assert bool(torch.isfinite(losses).all())
    for e in range(E):
        alone = _member(start, e)
        one = EnsembleStep(net.members(e, e + 1), 1)
        xe = x[e : e + 1].contiguous()
        ref = torch.stack([one.step(alone, xe, y[e : e + 1], eta[e : e + 1]) for _ in range(30)])
        _close(losses[e : e + 1], ref.T, f"member {e} losses")
        for got, want in zip(params.tensors(), alone.tensors()):
            _close(got[e : e + 1], want, f"member {e} parameters")


def _autograd(net: EnsembleMLP, params: Params, x: torch.Tensor, y: torch.Tensor):
    """Loss (E,) and gradients of the mse loss by autograd through the plain forward."""
    leaves = [t.clone().requires_grad_(True) for t in params.tensors()]
    L = len(params.weights)
    p = Params(leaves[:L], leaves[L:] or None)
    out = net(p, x.contiguous())
    loss = 0.5 * (out - y).square().sum((1, 2)) / x.shape[1]
    return loss.detach(), torch.autograd.grad(loss.sum(), leaves)


@pytest.mark.parametrize("activation,parameterization,bias", CASES)
@pytest.mark.parametrize("depth", [2, 3])
def test_shared_loss_and_grads_equal_autograd(activation, parameterization, bias, depth):
    net, params, x, y = _setup(activation, parameterization, bias, depth, seed=3)
    step = EnsembleStep(net, E, 3)
    assert step.shared(params, x)
    loss, grads = step.loss_and_grads(params, x, y)
    loss0, grads0 = _autograd(net, params, x, y)
    _close(loss.unsqueeze(1), loss0.unsqueeze(1), "loss")
    for g, g0 in zip(grads.tensors(), grads0):
        _close(g, g0, "gradient")
    _close(step.loss(params, x, y).unsqueeze(1), loss0.unsqueeze(1), "loss only")


def test_detection_is_the_stride_and_the_input_dim():
    net, params, x, y = _setup("relu", "ntk", True, 3)
    assert shares_input(x) and not shares_input(x.contiguous()) and not shares_input(x[:1])
    step = EnsembleStep(net, E)
    assert step.shared(params, x) and not step.shared(params, x.contiguous())
    _, blocks = step.blocks_for(params, x.contiguous())
    assert not any(k.shared for k in blocks)
    _, blocks = step.blocks_for(params, x)
    assert all(k.shared for k in blocks)
    # a shared input counts once in the cache budget
    assert step.block_size(x) >= step.block_size(x.contiguous())
    # past the cache budget, at least input_dim // width members (up to SHARED_MIN_BLOCK)
    n_big = 1 << 14
    big = torch.zeros(n_big, D, dtype=torch.float64).expand(E, -1, -1)
    for width, least in [(6, SHARED_MIN_BLOCK), (D // 2, 2), (D, 1), (4 * D, 1)]:
        wide = EnsembleStep(EnsembleMLP(ModelConfig(depth=2, width=width), D, K), E)
        assert wide.block_size(big.contiguous()) == 1
        assert wide.block_size(big) == min(E, least), width
    # few input features: the per-member path (the wide GEMM does not pay there)
    narrow = EnsembleMLP(ModelConfig(depth=2, width=6), SHARED_MIN_INPUT_DIM - 1, K)
    xs = torch.zeros(N, SHARED_MIN_INPUT_DIM - 1, dtype=torch.float64).expand(E, -1, -1)
    w = [torch.zeros(E, b, a, dtype=torch.float64) for a, b in zip(narrow.dims, narrow.dims[1:])]
    assert not EnsembleStep(narrow, E).shared(Params(w, None), xs)
    # the first layer a small part of the weights: the per-member path
    deep = EnsembleMLP(ModelConfig(depth=3, width=2 * D), D, K)
    wd = [torch.zeros(E, b, a, dtype=torch.float64) for a, b in zip(deep.dims, deep.dims[1:])]
    assert wd[0][0].numel() < SHARED_MIN_FIRST_LAYER * sum(w[0].numel() for w in wd)
    assert not EnsembleStep(deep, E).shared(Params(wd, None), x)
    # no hidden layer, or W_1 not one matrix per block: the per-member path
    lin = EnsembleMLP(ModelConfig(depth=1, width=6), D, K)
    assert not EnsembleStep(lin, E).shared(Params([torch.zeros(E, K, D)], None), x)
    strided = Params([params.weights[0].transpose(1, 2).contiguous().transpose(1, 2)], None)
    assert not step.shared(strided, x)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_shared_and_per_member_paths_agree(activation):
    """The shared path on the expanded x == the per-member path on its contiguous copy."""
    net, params, x, y = _setup(activation, "mean_field", True, 3)
    eta = torch.full((E,), 0.1, dtype=torch.float64)
    a, b = params.clone(), params.clone()
    sa, sb = EnsembleStep(net, E, 3), EnsembleStep(net, E, 3)
    for _ in range(10):
        la, lb = sa.step(a, x, y, eta), sb.step(b, x.contiguous(), y, eta)
        _close(la.unsqueeze(1), lb.unsqueeze(1), "loss")
    for p, q in zip(a.tensors(), b.tensors()):
        _close(p, q, "parameters")


# -- the data stack and the trainer ---------------------------------------------------------


def _ds(x: torch.Tensor, seed: int) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    return Dataset(x, torch.randn(n, 1, generator=gen, dtype=torch.float64), x[:3], x[:3, :1])


def test_stack_shares_equal_inputs_only():
    x = torch.randn(N, D, dtype=torch.float64)
    shared = stack([_ds(x.clone(), s) for s in range(4)], torch.float64, "cpu")
    assert shares_input(shared.x_train) and shared.x_train.shape == (4, N, D)
    assert torch.equal(shared.x_train[2], x)
    assert not torch.equal(shared.y_train[0], shared.y_train[1])  # labels stay per member
    other = x.clone()
    other[5, 7] += 1e-12  # one entry of one member differs: stacked, not shared
    mixed = stack([_ds(x.clone(), 0), _ds(x.clone(), 1), _ds(other, 2)], torch.float64, "cpu")
    assert not shares_input(mixed.x_train)
    assert torch.equal(mixed.x_train[2], other) and torch.equal(mixed.x_train[0], x)
    f32 = stack([_ds(x.clone(), s) for s in range(2)], torch.float32, "cpu")
    assert shares_input(f32.x_train) and torch.equal(f32.x_train[1], x.float())


def _spec(activation="relu", bias=False, depth=2, seeds=(0,), data_seed=None, **train):
    return validate_spec(
        {
            "name": "t",
            "model": {"depth": depth, "width": 12, "activation": activation, "bias": bias},
            "data": {
                "kind": "teacher",
                "n_train": 32,
                "n_test": 20,
                "input_dim": D,
                "seed": data_seed,
            },
            "train": {"steps": 40, "lr": 0.1, "log_points": 6, **train},
            "metrics": {"probe_size": 8},
            "grid": {"init_scale": [0.5, 1.0, 1.5], "lr": [0.05, 0.2], "seed": list(seeds)},
        }
    )


def _frame(tables, keys):
    return tables["trajectories"].to_pandas().sort_values(keys).reset_index(drop=True)


SGD = {"optimizer": "sgd", "batch_size": 8}


@pytest.mark.parametrize(
    "activation,bias,depth,train,seeds,data_seed,shared",
    [
        ("relu", False, 2, {}, (0,), None, True),
        ("tanh", True, 3, {}, (0,), None, True),
        ("linear", False, 2, {}, (0,), None, True),
        ("relu", True, 2, SGD, (0,), None, True),  # shared minibatches too
        ("tanh", False, 2, SGD, (0, 1), 9, True),  # one data set, per-member minibatches
        ("tanh", False, 2, {}, (0, 1), None, False),  # two data sets: nothing shared
    ],
)
def test_chunk_equals_each_point_alone(activation, bias, depth, train, seeds, data_seed, shared):
    """A chunk of points on one data set (the shared path) trains each point as it trains
    alone: every logged train/test loss and metric within 1e-10."""
    spec = _spec(activation, bias, depth, seeds, data_seed, **train)
    points = expand(spec)
    (chunk,) = make_chunks(points, spec)
    trainer = ChunkTrainer(chunk)
    assert shares_input(trainer.batch.x_train) == shared
    tables = trainer.run()
    step = EnsembleStep(trainer.net, trainer.E)
    assert step.shared(trainer.params0, trainer.batch.x_train) == shared
    together = _frame(tables, ["run_id", "step"])
    for p in points:
        alone = _frame(train_chunk(Chunk(p.run_id, (p,))), ["step"])
        mine = together[together.run_id == p.run_id].reset_index(drop=True)
        assert len(mine) == len(alone) > 2
        for col in ["train_loss", "test_loss", "grad_norm", "param_rel_change"]:
            np.testing.assert_allclose(mine[col], alone[col], rtol=RTOL, atol=0, err_msg=col)


def _trainer(spec) -> ChunkTrainer:
    (chunk,) = make_chunks(expand(spec), spec)
    return ChunkTrainer(chunk)


def test_sgd_minibatch_inputs_shared_only_with_one_sgd_seed():
    one = _trainer(_spec(optimizer="sgd", batch_size=8))
    x, y = one.minibatch(3)
    assert shares_input(x) and x.shape == (6, 8, D) and y.shape == (6, 8, 1)
    # several seeds on one data set (data.seed fixed): shared data, per-member SGD orders
    many = _trainer(_spec(seeds=(0, 1, 2), data_seed=9, optimizer="sgd", batch_size=8))
    assert shares_input(many.batch.x_train)
    x, y = many.minibatch(3)
    assert not shares_input(x)
    assert not all(torch.equal(x[0], x[e]) for e in range(1, many.E))
    for t in (one, many):  # either way, each member's rows of its own data, with its labels
        x, y = t.minibatch(5)
        for e in range(t.E):
            hit = (t.batch.x_train[e].unsqueeze(0) == x[e].unsqueeze(1)).all(2)  # (batch, n)
            rows = hit.float().argmax(1)
            assert bool(hit.any(1).all()) and torch.equal(t.batch.y_train[e, rows], y[e])
