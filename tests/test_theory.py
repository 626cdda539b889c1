"""Properties from the theory (seeds/) that the metrics must reproduce, in float64.

Each test compares stored metric columns (or the metric functions) with a
closed form or an exact identity, never with numbers taken from the code's own
output:

- the ReLU NTK of a wide two-layer net tends to the arc-cosine kernels with
  error ∝ m^-1/2 (seed 003; seed 001 for the m^-1/2 rate);
- σ = 0 subspace data never moves the weights facing the codimension
  (seed 000), so a depth-1 model's transversal gradient is exactly constant;
- one GD step changes the layer balance by exactly η²(‖G_{l+1}‖² − ‖G_l‖²)
  (seed 001: balancedness; the first-order terms cancel);
- a two-layer linear net from small aligned balanced init on whitened data
  follows the sigmoid u(t) = s e^{2st} / (e^{2st} − 1 + s/u₀) (seed 004, Saxe et al.);
- a bias-free (leaky) ReLU net on symmetric data trains exactly like a linear
  net with lr scaled by 2/(1+α) and init by √(2/(1+α)) (seed 004, Theorem 8).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from calibration import two_layer_escape_time
from phasesweep.pipeline.data._datasets import DataBatch
from phasesweep.pipeline.grid import Chunk, Point, expand, make_chunks
from phasesweep.pipeline.spec import ModelConfig, validate_spec
from phasesweep.pipeline.train._init import init_params
from phasesweep.pipeline.train._models import EnsembleMLP, Params
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk
from phasesweep.pipeline.train.metrics._ntk import empirical_ntk

F64 = torch.float64


def _spec(grid=None, **sections):
    base = {"name": "theory", "grid": grid or {}}
    for key, value in sections.items():
        base[key] = value
    return validate_spec(base)


def _by(table, keys):
    return table.to_pandas().sort_values(keys).reset_index(drop=True)


# -- NTK of a wide two-layer ReLU net --------------------------------------------------------------


def relu_ntk_limit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Infinite-width NTK of f(x) = m^-1/2 Σ_j a_j relu(w_j·x / √d), a, w ~ N(0, 1).

    First layer: (x·x′/d)(π − θ)/(2π). Second layer: (‖x‖‖x′‖/(2πd))(sin θ + (π − θ)cos θ)
    (the degree-1 arc-cosine kernel). The 1/d is the NTK parameterization's c_1² = 1/fan_in.
    """
    d = x.shape[1]
    norms = x.norm(dim=1)
    outer = norms[:, None] * norms[None, :]
    cos = ((x @ x.T) / outer).clamp(-1, 1)
    theta = torch.arccos(cos)
    k1 = (x @ x.T) / d * (math.pi - theta) / (2 * math.pi)
    k2 = outer / (2 * math.pi * d) * (torch.sin(theta) + (math.pi - theta) * cos)
    return k1, k2


def test_relu_ntk_tends_to_the_arccos_kernel_like_inverse_sqrt_width():
    gen = torch.Generator().manual_seed(0)
    d, P, seeds = 5, 6, 16
    x = (
        torch.randn(P, d, generator=gen, dtype=F64)
        * torch.linspace(0.5, 2.0, P, dtype=F64)[:, None]
    )
    k1_inf, k2_inf = relu_ntk_limit(x)
    widths = [64, 256, 1024, 4096, 16384]
    err_first, err_both = [], []
    for m in widths:
        cfg = ModelConfig(depth=2, width=m, activation="relu", bias=False, parameterization="ntk")
        net = EnsembleMLP(cfg, d, 1)
        params = init_params(net, [cfg] * seeds, list(range(seeds)))
        per_layer = empirical_ntk(net, params, x.expand(seeds, P, d), per_layer=True)
        e1 = (per_layer[:, 0] - k1_inf).flatten(1).norm(dim=1) / k1_inf.norm()
        e2 = (per_layer.sum(1) - k1_inf - k2_inf).flatten(1).norm(dim=1) / (k1_inf + k2_inf).norm()
        err_first.append(float(e1.square().mean().sqrt()))
        err_both.append(float(e2.square().mean().sqrt()))
    for errs in (err_first, err_both):
        slope = np.polyfit(np.log(widths), np.log(errs), 1)[0]
        assert -0.62 < slope < -0.38, (slope, errs)
        assert errs[-1] < 0.03, errs


# -- subspace data: the codimension is frozen at σ = 0 ------------------------------------------------


def _subspace_spec(depth, activation, bias, grid):
    return _spec(
        model={"depth": depth, "width": 16, "activation": activation, "bias": bias},
        data={
            "kind": "subspace",
            "input_dim": 6,
            "subspace_dim": 2,
            "rotate": False,
            "n_train": 24,
            "n_test": 40,
        },
        train={"steps": 300, "lr": 0.2, "log_points": 20},
        grid=grid,
    )


def test_depth1_transversal_gradient_is_exactly_constant_at_zero_noise():
    spec = _subspace_spec(1, "linear", False, {"noise_sigma": [0.0, 0.3], "seed": [0, 1]})
    (chunk,) = make_chunks(expand(spec), spec)
    traj = _by(train_chunk(chunk)["trajectories"], ["run_id", "step"])
    for point in chunk.points:
        tg = traj[traj.run_id == point.run_id].transversal_grad_sq.to_numpy()
        assert len(tg) > 10 and tg[0] > 0
        if point.config.data.noise_sigma == 0:
            assert (tg == tg[0]).all()  # bit for bit
        else:
            assert tg[-1] < 0.9 * tg[0]  # noise in the codimension is fitted away


def test_two_layer_relu_codimension_weights_never_change_at_zero_noise(capture):
    spec = _subspace_spec(2, "relu", True, {"noise_sigma": [0.0, 0.3]})
    (chunk,) = make_chunks(expand(spec), spec)
    traj = _by(train_chunk(chunk)["trajectories"], ["run_id", "step"])
    (rec,) = capture.instances
    dx = 2
    for e, point in enumerate(chunk.points):
        w0 = rec.params0.weights[0][e][:, dx:]
        moved = [float((p.weights[0][e][:, dx:] - w0).abs().max()) for p in rec.seen]
        if point.config.data.noise_sigma == 0:
            assert max(moved) == 0.0
        else:
            assert moved[-1] > 1e-3
        rows = traj[traj.run_id == point.run_id]
        assert rows.train_loss.iloc[-1] < 0.5 * rows.train_loss.iloc[0]  # it did train


# -- balance after one GD step ---------------------------------------------------------------------------


def _ref_forward(ws, bs, x, act, mults):
    h = x
    for l, (w, c) in enumerate(zip(ws, mults)):
        z = c * h @ w.T + (bs[l] if bs is not None else 0)
        h = act(z) if l < len(ws) - 1 else z
    return h


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", ["relu", "leaky_relu", "linear"])
def test_one_gd_step_changes_the_balance_by_eta_squared(capture, activation, bias):
    spec = _spec(
        model={"depth": 3, "width": 10, "activation": activation, "bias": bias, "leaky_slope": 0.3},
        data={"kind": "teacher", "n_train": 20, "input_dim": 4},
        train={"steps": 1, "log_points": 2},
        grid={"lr": [0.02, 0.1, 0.5], "seed": [0, 1]},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    layers = _by(train_chunk(chunk)["layers"], ["run_id", "step", "layer"])
    (rec,) = capture.instances
    x, y = rec.batch.x_train, rec.batch.y_train
    mults = [1 / math.sqrt(n) for n in rec.net.dims[:-1]]  # ntk parameterization
    act = {
        "relu": torch.relu,
        "leaky_relu": lambda z: torch.where(z > 0, z, 0.3 * z),
        "linear": lambda z: z,
    }[activation]
    for e, point in enumerate(chunk.points):
        eta = point.config.train.lr
        ws = [w[e].clone().requires_grad_(True) for w in rec.params0.weights]
        bs = [b[e].clone().requires_grad_(True) for b in rec.params0.biases] if bias else None
        loss = 0.5 * (_ref_forward(ws, bs, x[e], act, mults) - y[e]).square().sum() / x.shape[1]
        grads = torch.autograd.grad(loss, ws + (bs or []))
        ws = [w.detach() for w in ws]
        bs = [b.detach() for b in bs] if bias else None
        gw, gb = grads[:3], grads[3:] if bias else None
        for l in range(2):
            den = float(ws[l].detach().square().sum() + ws[l + 1].detach().square().sum())
            if activation == "linear":
                dd = gw[l + 1].T @ gw[l + 1] - gw[l] @ gw[l].T
                if bias:
                    dd = dd - torch.outer(gb[l], gb[l])
                expected = eta**2 * float(dd.norm()) / den
            else:
                dc = gw[l + 1].square().sum() - gw[l].square().sum()
                if bias:
                    dc = dc - gb[l].square().sum()
                expected = eta**2 * float(dc) / den
                # the first-order terms cancel: <W_{l+1}, G_{l+1}> = <W_l, G_l> + <b_l, g_l>
                out_term = float((ws[l + 1] * gw[l + 1]).sum())
                in_term = float((ws[l] * gw[l]).sum()) + (
                    float((bs[l] * gb[l]).sum()) if bias else 0
                )
                assert abs(out_term - in_term) < 1e-10 * abs(out_term)
            rows = layers[(layers.run_id == point.run_id) & (layers.layer == l + 1)]
            assert rows[rows.step == 0].balance_defect.iloc[0] == 0
            got = rows[rows.step == 1].balance_defect.iloc[0]
            assert abs(expected) > 1e-10
            np.testing.assert_allclose(got, expected, rtol=1e-7)


# -- the sigmoid of a two-layer linear net ------------------------------------------------------------------


def _whitened(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """n points in R^d with empirical covariance exactly the identity: Xᵀ X / n = I."""
    q, _ = torch.linalg.qr(torch.randn(n, d, generator=gen, dtype=F64))
    return math.sqrt(n) * q


def test_two_layer_linear_net_follows_the_sigmoid():
    g, s, d, n = 0.01, 1.0, 4, 16
    u0 = g * g  # balanced init W_l = g u_l u_{l-1}^T: W_2 W_1 = g^2 (rank one)
    lrs = [1e-3, 5e-4]
    spec = _spec(
        model={
            "depth": 2,
            "width": 6,
            "activation": "linear",
            "bias": False,
            "parameterization": "standard",
            "init": "balanced",
            "init_scale": g,
        },
        data={"kind": "teacher", "input_dim": d, "n_train": n, "n_test": 8},
        train={"steps": 24000, "log_points": 60},
        metrics={"ntk": False, "probe_size": 8, "spectra_budget": None},
        grid={"lr": lrs},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    tr = ChunkTrainer(chunk)
    # aligned data: whitened inputs and the target s · (direction of W_2 W_1 at init)
    gen = torch.Generator().manual_seed(5)
    xs, ys, xt, yt = [], [], [], []
    for e in range(len(lrs)):
        prod = (tr.params0.weights[1][e] @ tr.params0.weights[0][e])[0]
        np.testing.assert_allclose(float(prod.norm()), u0, rtol=1e-12)
        direction = prod / prod.norm()
        x = _whitened(n, d, gen)
        x_test = torch.randn(8, d, generator=gen, dtype=F64)
        xs.append(x)
        ys.append(s * (x @ direction)[:, None])
        xt.append(x_test)
        yt.append(s * (x_test @ direction)[:, None])
    tr.batch = DataBatch(
        torch.stack(xs), torch.stack(ys), torch.stack(xt), torch.stack(yt), None, 1
    )
    tables = tr.run()
    traj = _by(tables["trajectories"], ["run_id", "step"])
    layers = _by(tables["layers"], ["run_id", "step", "layer"])
    worst = []
    for point in chunk.points:
        rows = traj[traj.run_id == point.run_id]
        lay = layers[layers.run_id == point.run_id]
        top1 = np.stack(lay[lay.layer == 1].top_sv.to_numpy())
        top2 = np.stack(lay[lay.layer == 2].top_sv.to_numpy())
        t = rows.time.to_numpy()
        assert t[-1] > 10
        u = top1[:, 0] * top2[:, 0]  # W_2 W_1 = u · direction, both layers rank one and aligned
        assert (top1[:, 1] < 1e-12 * top1[:, 0]).all()  # stays rank one
        e2st = np.exp(2 * s * t)
        closed = s * e2st / (e2st - 1 + s / u0)
        rel = np.abs(u - closed) / closed
        assert rel.max() < 0.01, rel.max()
        # the stored loss is the closed form's: L = (s - u)^2 / 2 on whitened data
        np.testing.assert_allclose(
            rows.train_loss.to_numpy(), 0.5 * (s - u) ** 2, rtol=1e-8, atol=1e-20
        )
        assert u[0] == pytest.approx(u0, rel=1e-12) and u[-1] == pytest.approx(s, rel=1e-6)
        worst.append(rel.max())
    assert worst[1] < 0.6 * worst[0]  # the gap to gradient flow shrinks like the lr


# -- Theorem 8 of seed 004: bias-free ReLU on symmetric data is a linear net -----------------------------------


def _symmetric_batch(E: int, n_pairs: int, d: int, gen: torch.Generator) -> DataBatch:
    """Every x with −x (stored as consecutive pairs), odd labels; test points arbitrary."""
    w = torch.randn(d, generator=gen, dtype=F64)
    v = torch.randn(d, generator=gen, dtype=F64) / math.sqrt(d)

    def label(x):
        return (torch.tanh(x @ w) + 0.3 * (x @ v) ** 3)[:, None]  # odd

    half = torch.randn(n_pairs, d, generator=gen, dtype=F64)
    x = torch.stack([half, -half], 1).reshape(2 * n_pairs, d)
    x_test = torch.randn(16, d, generator=gen, dtype=F64)
    rep = lambda t: t.expand(E, *t.shape).clone()  # noqa: E731
    return DataBatch(rep(x), rep(label(x)), rep(x_test), rep(label(x_test)), None, 2)


def _assumption7_params(
    E: int, m: int, d: int, scale: float, gen: torch.Generator, break_it=False
) -> Params:
    """W_1 = a vᵀ, W_2 = s aᵀ with a = [b, −b]: rank one, aligned, and equal norms of
    the positive and negative entries of W_2 (seed 004, Assumption 7)."""
    b = torch.randn(m // 2, generator=gen, dtype=F64)
    a = torch.cat([b, -(0.5 if break_it else 1.0) * b]) * 0.3
    v = torch.randn(d, generator=gen, dtype=F64) * 0.3
    w1 = scale * torch.outer(a, v)
    w2 = scale * 0.5 * a[None, :]
    return Params([w1.expand(E, m, d).clone(), w2.expand(E, 1, m).clone()], None)


def _run(
    activation: str, slopes: list[float], lrs: list[float], scales: list[float], batch, params_fn
):
    spec = _spec(
        model={
            "depth": 2,
            "width": 8,
            "activation": activation,
            "bias": False,
            "parameterization": "ntk",
        },
        data={"kind": "teacher", "input_dim": 3, "n_train": 2 * 10, "n_test": 16},
        train={"steps": 1500, "lr": 1.0, "log_points": 25},
        metrics={"probe_size": 16, "even_part": True, "spectra_budget": None},
    )
    (base,) = expand(spec)
    points = []
    for i, (slope, lr) in enumerate(zip(slopes, lrs)):
        cfg = base.config.model_copy(
            update={
                "model": base.config.model.model_copy(update={"leaky_slope": slope}),
                "train": base.config.train.model_copy(update={"lr": lr}),
            }
        )
        points.append(Point(f"{activation}-{i}", cfg, {}))
    tr = ChunkTrainer(Chunk(activation, tuple(points)))
    tr.batch = batch(len(points))
    tr.params0 = params_fn(len(points), scales)
    tables = tr.run()
    return (
        _by(tables["trajectories"], ["run_id", "step"]),
        _by(tables["layers"], ["run_id", "step", "layer"]),
    )


def test_bias_free_relu_on_symmetric_data_trains_like_a_linear_net():
    m, d, eta = 8, 3, 0.05

    def batch(E):
        return _symmetric_batch(E, 10, d, torch.Generator().manual_seed(11))

    def params(break_it=False):
        def make(E, scales):
            p = _assumption7_params(E, m, d, 1.0, torch.Generator().manual_seed(12), break_it)
            for e, sc in enumerate(scales):
                for w in p.weights:
                    w[e] *= sc
            return p

        return make

    lin_traj, lin_layers = _run("linear", [0.0], [eta], [1.0], batch, params())
    assert lin_traj.train_loss.iloc[-1] < 0.5 * lin_traj.train_loss.iloc[0]  # it learned
    assert (lin_traj.even_part_frac == 0).all()

    slopes = [0.0, 0.2, 0.6]
    kappas = [(1 + a) / 2 for a in slopes]
    cases = {
        "leaky_relu": (slopes, kappas),
        "relu": ([0.0], [0.5]),
    }
    for activation, (alphas, ks) in cases.items():
        lrs = [eta / k for k in ks]
        scales = [1 / math.sqrt(k) for k in ks]
        traj, layers = _run(activation, alphas, lrs, scales, batch, params())
        for i, k in enumerate(ks):
            rows = traj[traj.run_id == f"{activation}-{i}"]
            assert list(rows.step) == list(lin_traj.step)
            # the same function at every step: losses on train and (arbitrary) test points
            for col in ("train_loss", "test_loss", "output_norm"):
                np.testing.assert_allclose(rows[col], lin_traj[col], rtol=1e-9, err_msg=col)
            # gradient-flow time runs 1/κ = 2/(1+α) times faster for the ReLU net
            np.testing.assert_allclose(rows.time, lin_traj.time / k, rtol=1e-12)
            # the ReLU net computes an exactly linear (odd) function
            assert (rows.even_part_frac < 1e-10).all()
            # weights: W = √(2/(1+α)) · W_lin at every step
            lay = layers[layers.run_id == f"{activation}-{i}"]
            np.testing.assert_allclose(lay.fro_norm, lin_layers.fro_norm / math.sqrt(k), rtol=1e-9)
            np.testing.assert_allclose(
                [v[0] for v in lay.top_sv],
                np.array([v[0] for v in lin_layers.top_sv]) / math.sqrt(k),
                rtol=1e-9,
            )
            np.testing.assert_allclose(lay.rel_change, lin_layers.rel_change, rtol=1e-8, atol=1e-14)

    # control: without Assumption 7 (unequal positive and negative output weights) it does not hold
    traj, _ = _run("relu", [0.0], [eta / 0.5], [math.sqrt(2)], batch, params(break_it=True))
    lin_b, _ = _run("linear", [0.0], [eta], [1.0], batch, params(break_it=True))
    assert np.max(np.abs(traj.test_loss.to_numpy() / lin_b.test_loss.to_numpy() - 1)) > 1e-3
    assert traj.even_part_frac.max() > 0.1  # not a linear function (learning odd labels shrinks it)


# -- full-rank balanced init learns every mode (Saxe et al.) ----------------------------------


def _mode_times(init: str, g: float, s: list[float], seeds: list[int]) -> np.ndarray:
    """(seeds, modes) first logged t at which σ_i(W_1)² = σ_i(W_2 W_1) reaches s_i / 2 (NaN:
    never) for a two-layer linear net on whitened symmetric data with target singular
    values ``s`` (so Σ_xx = I and Σ_yx has singular values s). For a balanced net the
    product's singular values are those of W_1 squared."""
    spec = _spec(
        model={
            "depth": 2,
            "width": 8,
            "activation": "linear",
            "bias": False,
            "parameterization": "standard",
            "init": init,
            "init_scale": g,
        },
        data={
            "kind": "symmetric",
            "whiten": True,
            "teacher_singular_values": s,
            "output_dim": len(s),
            "input_dim": 5,
            "n_train": 20,
            "n_test": 6,
        },
        train={"lr": 0.01, "steps": 1500, "log_points": 300},
        metrics={"ntk": False, "probe_size": 6, "spectra_budget": None, "top_k": len(s)},
        grid={"seed": seeds},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    tables = train_chunk(chunk)
    traj = _by(tables["trajectories"], ["run_id", "step"])
    layers = _by(tables["layers"], ["run_id", "step", "layer"])
    out = np.full((len(seeds), len(s)), np.nan)
    for e, point in enumerate(chunk.points):
        t = traj[traj.run_id == point.run_id].time.to_numpy()
        lay = layers[(layers.run_id == point.run_id) & (layers.layer == 1)]
        u = np.stack(lay.top_sv.to_numpy()) ** 2
        for i, si in enumerate(s):
            hit = np.flatnonzero(u[:, i] >= si / 2)
            if len(hit):
                out[e, i] = t[hit[0]]
    return out


def test_full_rank_balanced_init_learns_every_mode_near_the_closed_form_time():
    # Saxe et al.: with Σ_xx = I each mode i of strength u_i follows du/dt = 2u(s_i - u),
    # half-way at t_i = log(s_i/u0 - 1)/(2 s_i), u0 = g²/r the product's singular values at
    # init. A random orientation only delays a mode (its initial projection is below u0):
    # every mode is learned, none before its closed-form time, within 2x of it.
    g, s = 0.01, [4.0, 2.0, 1.0]
    u0 = g * g / len(s)
    closed = np.array([two_layer_escape_time(si, u0, 0.5) for si in s])
    full = _mode_times("balanced_full", g, s, [0, 1, 2, 3])
    ratio = full / closed
    assert np.isfinite(ratio).all()
    assert (ratio > 0.97).all() and (ratio < 2.0).all()  # 0.97: the logging grid's spacing
    assert np.median(ratio) < 1.5
    # the rank-one init seeds one mode only: the other two wait on round-off
    rank_one = _mode_times("balanced", g, s, [0, 1])
    later = np.nan_to_num(rank_one[:, 1:], nan=np.inf)
    assert (later > 3 * closed[1:]).all()
