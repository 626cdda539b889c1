"""The factored step of bias-free linear nets (pipeline.train._linear_step) against backpropagation
(pipeline.train._models.loss_and_grads), autograd, a plain PyTorch loop per point, and the
trainer's backpropagation engine. No timings: the speed is benchmarks/' job."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
import torch
from phasesweep.pipeline.data._datasets import data_seed, make_dataset
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import ModelConfig, validate_spec
from phasesweep.pipeline.train import _trainer
from phasesweep.pipeline.train._init import init_params
from phasesweep.pipeline.train._linear_step import LinearStep, linear_step_applies
from phasesweep.pipeline.train._models import EnsembleMLP, EnsembleStep, Params, loss_and_grads
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk

E, N, D = 6, 11, 5
#: Normwise relative tolerance per member: the factored products are associated otherwise,
#: which moves each result by a few ulps of its terms' sizes, whatever the summation order.
RTOL = 1e-12


def _problem(depth, parameterization, k, shared, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cfg = ModelConfig(depth=depth, width=4, activation="linear", parameterization=parameterization)
    net = EnsembleMLP(cfg, D, k)
    weights = [
        torch.randn(E, b, a, generator=gen, dtype=torch.float64)
        for a, b in zip(net.dims[:-1], net.dims[1:])
    ]
    if shared:  # one input matrix for every member, as the data stack builds it
        x = torch.randn(N, D, generator=gen, dtype=torch.float64).expand(E, N, D)
    else:
        x = torch.randn(E, N, D, generator=gen, dtype=torch.float64)
    y = torch.randn(E, N, k, generator=gen, dtype=torch.float64)
    return net, Params(weights, None), x, y


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL) -> None:
    """‖a_e − b_e‖ ≤ rtol ‖b_e‖ for every member e."""
    err = (a - b).reshape(a.shape[0], -1).norm(dim=1)
    size = b.reshape(b.shape[0], -1).norm(dim=1)
    assert bool((err <= rtol * size).all()), (err / size).max().item()


CASES = list(
    itertools.product([1, 2, 3, 5], ["standard", "ntk", "mean_field"], [1, 3], [False, True])
)


@pytest.mark.parametrize("depth,parameterization,k,shared", CASES)
def test_factored_step_equals_backpropagation(depth, parameterization, k, shared):
    net, params, x, y = _problem(depth, parameterization, k, shared)
    loss0, grads0, _ = loss_and_grads(net, params, x, y)
    step = LinearStep(net, E)
    loss1, grads1 = step.loss_and_grads(params, x, y)
    _close(loss1.unsqueeze(1), loss0.unsqueeze(1))
    for g1, g0 in zip(grads1.weights, grads0.weights):
        _close(g1, g0)
    _close(step.loss(params, x, y).unsqueeze(1), loss0.unsqueeze(1))
    # into given buffers, as the trainer passes last step's gradients
    bufs = Params([torch.full_like(w, float("nan")) for w in params.weights], None)
    _, into = step.loss_and_grads(params, x, y, bufs)
    assert into is bufs
    for g1, g0 in zip(bufs.weights, grads0.weights):
        _close(g1, g0)
    # the step: θ − η∇L with η per member, every layer from the old weights
    eta = torch.rand(E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    moved = params.clone()
    loss2 = step.step(moved, x, y, eta)
    _close(loss2.unsqueeze(1), loss0.unsqueeze(1))
    for p1, p0, g0 in zip(moved.weights, params.weights, grads0.weights):
        update = eta.view(-1, 1, 1) * g0
        _close(p1 - p0, -update)


def test_factored_step_in_float32():
    net, params, x, y = _problem(3, "ntk", 2, True)
    params32 = Params([w.float() for w in params.weights], None)
    loss0, grads0, _ = loss_and_grads(net, params, x, y)  # float64 reference
    loss1, grads1 = LinearStep(net, E).loss_and_grads(params32, x.float(), y.float())
    assert loss1.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads1.weights)
    _close(loss1.double().unsqueeze(1), loss0.unsqueeze(1), rtol=1e-5)
    for g1, g0 in zip(grads1.weights, grads0.weights):
        _close(g1.double(), g0, rtol=1e-5)


def test_factored_gradients_equal_autograd():
    """Independent of the hand-written backward: torch.autograd on each member's loss."""
    net, params, x, y = _problem(4, "mean_field", 2, False)
    loss, grads = LinearStep(net, E).loss_and_grads(params, x, y)
    for e in range(E):
        ws = [w[e].clone().requires_grad_(True) for w in params.weights]
        h = x[e]
        for w, c in zip(ws, net.multipliers):
            h = c * h @ w.T
        member_loss = 0.5 * (h - y[e]).square().sum() / N
        member_loss.backward()
        assert abs(member_loss.item() - loss[e].item()) <= RTOL * member_loss.item()
        for w, g in zip(ws, grads.weights):
            assert (w.grad - g[e]).norm() <= RTOL * w.grad.norm()


def test_members_never_mix_even_when_one_is_not_finite():
    for shared in (False, True):
        net, params, x, y = _problem(3, "ntk", 1, shared)
        params.weights[1][2] = float("nan")
        params.weights[0][4] = float("inf")
        loss, grads = LinearStep(net, E).loss_and_grads(params, x, y)
        ok = [i for i in range(E) if i not in (2, 4)]
        loss0, grads0, _ = loss_and_grads(
            net, Params([w[ok] for w in params.weights], None), x[ok], y[ok]
        )
        _close(loss[ok].unsqueeze(1), loss0.unsqueeze(1))
        for g, g0 in zip(grads.weights, grads0.weights):
            _close(g[ok], g0)
        assert not torch.isfinite(loss[[2, 4]]).any()


def test_which_nets_take_the_factored_step():
    def net(activation, depth, k=1):
        return EnsembleMLP(ModelConfig(depth=depth, width=64, activation=activation), 10, k)

    assert linear_step_applies(net("linear", 3), biased=False, n_rows=128)
    assert linear_step_applies(net("relu", 1), biased=False, n_rows=128)  # no hidden layer
    assert not linear_step_applies(net("linear", 3), biased=True, n_rows=128)
    assert not linear_step_applies(net("relu", 3), biased=False, n_rows=128)
    assert not linear_step_applies(net("tanh", 2), biased=False, n_rows=128)
    # as many outputs as rows: backpropagation needs fewer flops
    assert not linear_step_applies(net("linear", 3, k=128), biased=False, n_rows=128)


def _spec(**train):
    return validate_spec(
        {
            "name": "t",
            "model": {"depth": 3, "width": 8, "activation": "linear"},
            "data": {"kind": "teacher", "n_train": 24, "n_test": 20, "input_dim": 5},
            "train": {"steps": 80, "lr": 0.2, "log_points": 10, **train},
            "metrics": {"probe_size": 8},
            "grid": {"init_scale": [0.1, 1.0], "lr": [0.05, 0.2], "seed": [0, 1]},
        }
    )


def _sorted(table: pa.Table, keys: list[str]):
    return table.to_pandas().sort_values(keys).reset_index(drop=True)


#: Columns that are small differences of O(1) terms (1 − cos, a conserved quantity's drift) or
#: round-off itself (the smallest eigenvalue of a kernel of rank ≤ input_dim on more probe
#: points): compared to absolute bounds on the terms' sizes, since any summation order moves
#: them by ulps of those terms, not of themselves.
CANCELLING = {"kernel_distance": 1e-12, "balance_defect": 1e-12, "ntk_eig_min": None}


@pytest.mark.parametrize("train", [{}, {"optimizer": "sgd", "batch_size": 6}])
def test_trainer_tables_equal_those_of_backpropagation(monkeypatch, train):
    """The whole chunk, metrics included, through the factored step and through
    EnsembleStep (the factored step switched off)."""
    spec = _spec(**train)
    chunk = make_chunks(expand(spec), spec)[0]
    assert isinstance(ChunkTrainer(chunk).make_step(), LinearStep)
    factored = train_chunk(chunk)
    monkeypatch.setattr(_trainer, "linear_step_applies", lambda *a: False)
    assert isinstance(ChunkTrainer(chunk).make_step(), EnsembleStep)
    backprop = train_chunk(chunk)
    compared = set()
    for name, keys in (
        ("trajectories", ["run_id", "step"]),
        ("layers", ["run_id", "step", "layer"]),
    ):
        a, b = _sorted(factored[name], keys), _sorted(backprop[name], keys)
        assert list(a.run_id) == list(b.run_id)
        for col in a.columns:
            if a[col].dtype != float:
                continue
            compared.add(col)
            if col in CANCELLING:  # the largest eigenvalue sizes the smallest one's round-off
                atol = CANCELLING[col] or 1e-12 * np.nanmax(b["ntk_eig_max"])
                np.testing.assert_allclose(a[col], b[col], rtol=0, atol=atol, err_msg=col)
            else:
                np.testing.assert_allclose(a[col], b[col], rtol=1e-10, atol=1e-300, err_msg=col)
    assert {"train_loss", "grad_norm", "kernel_alignment", "fro_norm"} | set(CANCELLING) <= compared


def test_each_point_equals_a_plain_pytorch_loop():
    """Every member of a chunk trained in factored form = nn.Linear layers + torch.optim.SGD
    on the same data and initial weights, the point alone (autograd, no phasesweep step)."""
    spec = _spec()
    points = expand(spec)
    tables = train_chunk(make_chunks(points, spec)[0])
    traj = tables["trajectories"].to_pandas()
    for p in points:
        cfg = p.config
        ds = make_dataset(cfg.data, data_seed(cfg.data, cfg.train.seed))
        net = EnsembleMLP(cfg.model, ds.x_train.shape[1], ds.y_train.shape[1])
        p0 = init_params(net, [cfg.model], [cfg.train.seed])
        layers = [
            torch.nn.Linear(a, b, bias=False, dtype=torch.float64)
            for a, b in zip(net.dims[:-1], net.dims[1:])
        ]
        with torch.no_grad():
            for lin, w in zip(layers, p0.weights):
                lin.weight.copy_(w[0])
        opt = torch.optim.SGD([lin.weight for lin in layers], lr=cfg.train.lr)
        losses = []
        for _ in range(cfg.train.steps + 1):
            opt.zero_grad()
            h = ds.x_train
            for lin, c in zip(layers, net.multipliers):
                h = c * lin(h)
            loss = 0.5 * (h - ds.y_train).square().sum() / ds.x_train.shape[0]
            losses.append(loss.item())
            loss.backward()
            opt.step()
        rows = traj[traj.run_id == p.run_id].sort_values("step")
        np.testing.assert_allclose(
            rows.train_loss, np.asarray(losses)[rows.step.to_numpy()], rtol=1e-10
        )
