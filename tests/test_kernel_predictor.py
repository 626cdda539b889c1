"""The kernel predictor beside every run (lin_test_loss, lin_distance), against an independent
linearized-model training: the explicit Jacobian at θ(0) (torch.func.jacrev of a plain
torch net written here) trained by small-step GD, Richardson-extrapolated to gradient flow."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import validate_spec
from phasesweep.pipeline.train._trainer import ChunkTrainer
from phasesweep.pipeline.train.metrics._metrics import MetricRecorder
from torch.func import functional_call, jacrev

F64 = torch.float64


class Net(torch.nn.Module):
    """f(x) = (1/√m) W2 relu(W1 x / √d): the NTK parameterization, no bias."""

    def __init__(self, w1: torch.Tensor, w2: torch.Tensor) -> None:
        super().__init__()
        self.w1, self.w2 = torch.nn.Parameter(w1.clone()), torch.nn.Parameter(w2.clone())

    def forward(self, x):
        d, m = self.w1.shape[1], self.w1.shape[0]
        return torch.relu(x @ self.w1.T / math.sqrt(d)) @ self.w2.T / math.sqrt(m)


def _linear_gd(jac_x, jac_p, r0, f0_p, times, eta):
    """Outputs on the probe set of the linearized model trained by GD with step eta, read at
    ``times`` (multiples of eta): f_lin = f0 + J δ, δ ← δ − η J_Xᵀ (f_lin,X − y) / n."""
    n = jac_x.shape[0]
    delta = torch.zeros(jac_x.shape[1], dtype=F64)
    out, k, targets = [], 0, [round(t / eta) for t in times]
    for target in targets:
        while k < target:
            delta -= eta * jac_x.T @ (r0 + jac_x @ delta) / n
            k += 1
        out.append(f0_p + jac_p @ delta)
    return torch.stack(out)


@pytest.mark.parametrize("accelerated", [False, True], ids=["eigh", "squaring"])
@pytest.mark.parametrize("g", [1.0, 0.3])
@pytest.mark.parametrize("log_points", [8, 30])
def test_kernel_predictor_matches_an_explicit_linearized_training(g, accelerated, log_points):
    # 30 log points: the accelerated predictor computes them in blocks of n + 1 = 9
    d, m, n, P, lr, steps = 3, 16, 8, 6, 0.05, 200
    spec = validate_spec(
        {
            "name": "lin",
            "model": {"depth": 2, "width": m, "activation": "relu", "init_scale": g},
            "data": {"kind": "teacher", "input_dim": d, "n_train": n, "n_test": P},
            "train": {"lr": lr, "steps": steps, "log_points": log_points},
            "metrics": {"probe_size": P, "spectra": False},
            "grid": {"seed": [0, 1]},
        }
    )
    (chunk,) = make_chunks(expand(spec), spec)
    tr = ChunkTrainer(chunk, accelerated=accelerated)
    traj = tr.run()["trajectories"].to_pandas()
    b = tr.batch
    for e, point in enumerate(chunk.points):
        rows = traj[traj.run_id == point.run_id].sort_values("step")
        times = rows.time.to_numpy()
        net = Net(tr.params0.weights[0][e], tr.params0.weights[1][e])
        params = {k: v.detach() for k, v in net.named_parameters()}
        x_all = torch.cat([b.x_train[e], b.x_test[e, :P]])

        def flat_f(p, x_all=x_all, net=net):
            return functional_call(net, p, (x_all,))[:, 0]

        jac = jacrev(flat_f)(params)
        jac = torch.cat([jac[k].reshape(len(x_all), -1) for k in ("w1", "w2")], 1)
        f0 = flat_f(params)
        y, y_p = b.y_train[e, :, 0], b.y_test[e, :P, 0]
        args = (jac[:n], jac[n:], f0[:n] - y, f0[n:], times)
        coarse = _linear_gd(*args, eta=lr / 20)
        fine = _linear_gd(*args, eta=lr / 40)
        f_lin = 2 * fine - coarse  # Richardson: GD's O(eta) error removed
        err = (fine - coarse).abs().max().item()  # ~ the O(eta) error left in `fine`
        # the net itself, trained by plain GD with the run's lr (autograd, float64)
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        f_net = []
        for k in range(steps + 1):
            if k in set(rows.step.tolist()):
                f_net.append(net(b.x_test[e, :P])[:, 0].detach())
            opt.zero_grad()
            (0.5 * (net(b.x_train[e])[:, 0] - y).square().mean()).backward()
            opt.step()
        f_net = torch.stack(f_net)
        lin_loss = 0.5 * (f_lin - y_p).square().mean(1).numpy()
        dist = (f_net - f_lin).square().mean(1).sqrt().numpy()
        probe_loss = 0.5 * (f_net - y_p).square().mean(1).numpy()
        # Richardson leaves O(eta^2) ~ err^2 (err ~ 1e-6 .. 1e-4 here, the differences found
        # 1e-11 .. 1e-8); the loss error carries the size of its residuals
        scale = float(y_p.abs().max()) + float(f_lin.abs().max())
        tol = 50 * err**2 + 1e-12
        np.testing.assert_allclose(
            rows.lin_test_loss.to_numpy(), lin_loss, rtol=0, atol=tol * scale
        )
        np.testing.assert_allclose(rows.lin_distance.to_numpy(), dist, rtol=0, atol=tol)
        np.testing.assert_allclose(rows.probe_test_loss.to_numpy(), probe_loss, rtol=1e-9)
        # at t = 0 the linearization is the net
        assert rows.lin_distance.iloc[0] < 1e-14
        assert err < 1e-3  # the reference itself is accurate


def test_kernel_predictor_null_where_it_does_not_apply():
    spec = validate_spec(
        {
            "name": "lin",
            "model": {"depth": 2, "width": 8},
            "data": {"kind": "teacher", "input_dim": 3, "output_dim": 2, "n_train": 6},
            "train": {"steps": 2, "log_points": 2},
            "metrics": {"probe_size": 4},
        }
    )
    (chunk,) = make_chunks(expand(spec), spec)
    traj = ChunkTrainer(chunk).run()["trajectories"].to_pandas()
    assert traj.lin_test_loss.isna().all() and traj.lin_distance.isna().all()
    assert traj.probe_test_loss.notna().all()


def test_lin_distance_as_the_order_parameter_of_the_regimes():
    from phasesweep.analysis._analyze import analyze_frames
    from phasesweep.pipeline.spec import AnalysisConfig

    spec = validate_spec(
        {
            "name": "lin",
            "model": {"depth": 2, "width": 16, "init": "antisymmetric"},
            "data": {"kind": "teacher", "input_dim": 3, "n_train": 8, "n_test": 6},
            "train": {"lr": 0.05, "steps": 2000, "log_points": 10},
            "metrics": {"probe_size": 6, "spectra": False},
            "grid": {"init_scale": [0.1, 3.0]},
        }
    )
    (chunk,) = make_chunks(expand(spec), spec)
    tables = ChunkTrainer(chunk).run()
    runs = tables["runs"].to_pandas()
    traj = tables["trajectories"].to_pandas()
    cfg = AnalysisConfig(order_parameter="lin_distance", lazy_threshold=0.05)
    s = analyze_frames(runs, traj, cfg)["summaries"].to_pandas().set_index("run_id")
    last = traj.sort_values("step").groupby("run_id").last()
    assert (s.order_parameter == "lin_distance").all()
    np.testing.assert_array_equal(s.order_value, last.lin_distance[s.index])
    np.testing.assert_array_equal(s.final_lin_test_loss, last.lin_test_loss[s.index])
    # small init leaves the linearization (rich), large init stays close to it (lazy)
    by_g = runs.set_index("run_id").init_scale[s.index]
    assert s.loc[by_g == 0.1, "regime"].item() == "rich"
    assert s.loc[by_g == 3.0, "regime"].item() == "lazy"


@pytest.mark.parametrize("accelerated", [False, True], ids=["eigh", "squaring"])
def test_kernel_predictor_is_the_same_in_member_blocks(monkeypatch, accelerated):
    # the recorder of a large chunk works in blocks of members: each gets its own times
    # (accelerated: its own columns of the clock known ahead)
    import phasesweep.pipeline.train._metric_blocks as blocks_mod

    spec = validate_spec(
        {
            "name": "lin",
            "model": {"depth": 2, "width": 8},
            "data": {"kind": "teacher", "input_dim": 3, "n_train": 6, "n_test": 4},
            "train": {"lr": 0.05, "steps": 20, "log_points": 4},
            "metrics": {"probe_size": 4, "spectra": False},
            "grid": {"lr": [0.01, 0.05, 0.1]},
        }
    )
    (chunk,) = make_chunks(expand(spec), spec)
    whole = ChunkTrainer(chunk, accelerated=accelerated).run()["trajectories"].to_pandas()
    monkeypatch.setattr(blocks_mod, "METRICS_BLOCK_BYTES", 1)  # one member per block
    monkeypatch.setattr(blocks_mod, "free_device_bytes", lambda device: 1)  # and on a device
    made, for_run = [], MetricRecorder.for_run

    def spy(net, params0, batch, *args, **kwargs):
        made.append((batch.x_train.shape[0], kwargs["clock"] is not None))
        return for_run(net, params0, batch, *args, **kwargs)

    monkeypatch.setattr(MetricRecorder, "for_run", spy)
    blocked = ChunkTrainer(chunk, accelerated=accelerated).run()["trajectories"].to_pandas()
    assert made == [(1, accelerated)] * 3
    cols = ["lin_test_loss", "lin_distance", "probe_test_loss"]
    key = ["run_id", "step"]
    a, b = whole.sort_values(key), blocked.sort_values(key)
    assert a[cols].notna().all().all()
    np.testing.assert_allclose(a[cols].to_numpy(), b[cols].to_numpy(), rtol=1e-12, atol=1e-15)
