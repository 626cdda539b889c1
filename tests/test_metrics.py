"""Metrics against independent references: autograd Jacobians, numpy linear algebra,
per-member loops, and the stored columns of real training runs.

The references here never use the code under test: the forward pass is rewritten
from the definitions (z_l = c_l W_l h_{l-1} + b_l), Jacobians come from
torch.func, spectra from numpy.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from phasesweep.pipeline.data._datasets import data_seed, make_dataset
from phasesweep.pipeline.grid import Chunk, expand, make_chunks
from phasesweep.pipeline.spec import ModelConfig, validate_spec
from phasesweep.pipeline.train._init import init_params
from phasesweep.pipeline.train._models import EnsembleMLP, Params
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk
from phasesweep.pipeline.train.metrics._metrics import MetricRecorder
from phasesweep.pipeline.train.metrics._ntk import (
    empirical_ntk,
    kernel_alignment,
    kernel_distance,
    kernel_rel_change,
    layer_inner,
    scaled,
    target_norm,
)
from phasesweep.storage.schema import CROSSING_COLUMNS, CROSSING_FRACTIONS

F64 = torch.float64


# -- independent reference implementations ---------------------------------------------------


def ref_multipliers(parameterization: str, dims: list[int]) -> list[float]:
    L = len(dims) - 1
    out = []
    for l in range(1, L + 1):
        fan_in = dims[l - 1]
        if parameterization == "standard":
            out.append(1.0)
        elif parameterization == "mean_field" and l == L and L > 1:
            out.append(1.0 / fan_in)
        else:
            out.append(fan_in**-0.5)
    return out


def ref_act(name: str, slope: float):
    return {
        "linear": lambda z: z,
        "relu": torch.relu,
        "leaky_relu": lambda z: torch.where(z > 0, z, slope * z),
        "tanh": torch.tanh,
    }[name]


def ref_forward(ws, bs, x, act, mults):
    """One member: ws[l] (n_l, n_{l-1}), bs[l] (n_l,) or None, x (n, d) -> (n, k)."""
    h = x
    for l, (w, c) in enumerate(zip(ws, mults)):
        z = c * h @ w.T
        if bs is not None:
            z = z + bs[l]
        h = act(z) if l < len(ws) - 1 else z
    return h


def ref_ntk(ws, bs, x, act, mults) -> torch.Tensor:
    """Trace NTK Σ_o J_o J_oᵀ from full autograd Jacobians (torch.func.jacrev)."""
    flat = tuple(ws) + (tuple(bs) if bs is not None else ())
    L = len(ws)

    def f(*theta):
        return ref_forward(theta[:L], theta[L:] if bs is not None else None, x, act, mults)

    jac = torch.func.jacrev(f, argnums=tuple(range(len(flat))))(*flat)
    n, k = x.shape[0], ws[-1].shape[0]
    J = torch.cat([j.reshape(n, k, -1) for j in jac], 2)  # (n, k, #params)
    return torch.einsum("aop,bop->ab", J, J)


def member(params: Params, e: int):
    ws = [w[e] for w in params.weights]
    bs = None if params.biases is None else [b[e] for b in params.biases]
    return ws, bs


def random_params(dims, E, bias, gen, scale=1.0) -> Params:
    ws = [
        scale * torch.randn(E, b, a, generator=gen, dtype=F64) for a, b in zip(dims[:-1], dims[1:])
    ]
    bs = [0.5 * torch.randn(E, b, generator=gen, dtype=F64) for b in dims[1:]] if bias else None
    return Params(ws, bs)


def _spec(grid=None, **sections):
    base = {
        "name": "m",
        "model": {"depth": 3, "width": 12, "activation": "relu", "bias": True},
        "data": {
            "kind": "subspace",
            "n_train": 16,
            "n_test": 20,
            "input_dim": 5,
            "subspace_dim": 2,
        },
        "train": {"steps": 60, "lr": 0.1, "log_points": 8},
        "metrics": {"probe_size": 8, "top_k": 3, "spectra_budget": None},
        "grid": grid or {},
    }
    for key, value in sections.items():
        base.setdefault(key, {}).update(value)
    return validate_spec(base)


def _by(table, keys):
    return table.to_pandas().sort_values(keys).reset_index(drop=True)


# -- the NTK ------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("activation", ["linear", "relu", "leaky_relu", "tanh"])
@pytest.mark.parametrize("parameterization", ["standard", "ntk", "mean_field"])
def test_ntk_equals_autograd_jacobian_gram(parameterization, activation, bias):
    gen = torch.Generator().manual_seed(7)
    E, d, width, k, n = 3, 4, 5, 2, 6
    cfg = ModelConfig(
        depth=3, width=width, activation=activation, bias=bias, parameterization=parameterization
    )
    slopes = torch.tensor([0.0, 0.1, 0.3], dtype=F64)
    for out_dim in (1, k):
        net = EnsembleMLP(cfg, d, out_dim, leaky_slope=slopes)
        dims = [d, width, width, out_dim]
        params = random_params(dims, E, bias, gen)
        x = torch.randn(E, n, d, generator=gen, dtype=F64)
        K = empirical_ntk(net, params, x)
        per_layer = empirical_ntk(net, params, x, per_layer=True)
        assert K.shape == (E, n, n) and per_layer.shape == (E, 3, n, n)
        torch.testing.assert_close(per_layer.sum(1), K, rtol=1e-12, atol=1e-12)
        # the first layer's inner product cached (as the recorder does): read, never written
        gram = layer_inner(net, x, 0, bias)
        kept = gram.clone()
        cached = empirical_ntk(net, params, x, input_gram=gram)
        cached_layers = empirical_ntk(net, params, x, per_layer=True, input_gram=gram)
        torch.testing.assert_close(cached, K, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(cached_layers, per_layer, rtol=1e-12, atol=1e-12)
        assert torch.equal(gram, kept)
        mults = ref_multipliers(parameterization, dims)
        for e in range(E):
            ws, bs = member(params, e)
            ref = ref_ntk(ws, bs, x[e], ref_act(activation, float(slopes[e])), mults)
            torch.testing.assert_close(K[e], ref, rtol=1e-11, atol=1e-12)


def test_ntk_per_layer_is_the_jacobian_of_that_layer():
    gen = torch.Generator().manual_seed(1)
    cfg = ModelConfig(depth=3, width=6, activation="tanh", bias=True, parameterization="ntk")
    net = EnsembleMLP(cfg, 3, 1)
    params = random_params(net.dims, 2, True, gen)
    x = torch.randn(2, 5, 3, generator=gen, dtype=F64)
    per_layer = empirical_ntk(net, params, x, per_layer=True)
    mults = ref_multipliers("ntk", net.dims)
    act = ref_act("tanh", 0.0)
    for e in range(2):
        ws, bs = member(params, e)
        for l in range(3):

            def f(w, b, l=l, ws=ws, bs=bs, xe=x[e]):
                ws2 = list(ws)
                bs2 = list(bs)
                ws2[l], bs2[l] = w, b
                return ref_forward(ws2, bs2, xe, act, mults)

            jw, jb = torch.func.jacrev(f, argnums=(0, 1))(ws[l], bs[l])
            J = torch.cat([jw.reshape(5, 1, -1), jb.reshape(5, 1, -1)], 2)
            torch.testing.assert_close(
                per_layer[e, l], torch.einsum("aop,bop->ab", J, J), rtol=1e-11, atol=1e-12
            )


# -- stored columns of a real run against references ------------------------------------------------


def _ref_trajectory(cfg, net_dims, ws, bs, ws0, bs0, probe, probe_y, x_test, basis, slope):
    """Reference values of the per-member trajectory metrics from the definitions."""
    act = ref_act(cfg.model.activation, slope)
    mults = ref_multipliers(cfg.model.parameterization, net_dims)
    K = ref_ntk(ws, bs, probe, act, mults).numpy()
    K0 = ref_ntk(ws0, bs0, probe, act, mults).numpy()
    y = probe_y.numpy()
    out = {
        "kernel_distance": 1 - np.sum(K * K0) / (np.linalg.norm(K) * np.linalg.norm(K0)),
        "kernel_rel_change": np.linalg.norm(K - K0) / np.linalg.norm(K0),
        "kernel_alignment": float(y[:, 0] @ K @ y[:, 0])
        / (np.linalg.norm(K) * float(y[:, 0] @ y[:, 0])),
        "ntk_eig_min": np.linalg.eigvalsh(K)[0],
        "ntk_eig_max": np.linalg.eigvalsh(K)[-1],
    }

    def pre_acts(ws_, bs_):
        h, zs = probe, []
        for l, (w, c) in enumerate(zip(ws_, mults)):
            z = c * h @ w.T + (bs_[l] if bs_ is not None else 0)
            zs.append(z)
            h = act(z)
        return zs[:-1]

    flips = total = dead = units = 0
    for z, z0 in zip(pre_acts(ws, bs), pre_acts(ws0, bs0)):
        for p in range(z.shape[0]):
            for j in range(z.shape[1]):
                flips += bool(z[p, j] > 0) != bool(z0[p, j] > 0)
                total += 1
        for j in range(z.shape[1]):
            dead += bool((z[:, j] <= 0).all())
            units += 1
    out["act_flip_frac"] = flips / total
    out["dead_frac"] = dead / units
    f = ref_forward(ws, bs, probe, act, mults)
    out["output_norm"] = math.sqrt(float(f.square().mean()))
    # transversal: autograd input gradients of every test point, projected
    xg = x_test.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(ref_forward(ws, bs, xg, act, mults).sum(), xg)
    P = basis @ basis.T
    out["transversal_grad_sq"] = float((gx @ P).square().sum(1).mean())
    fm = ref_forward(ws, bs, -probe, act, mults)
    even, odd = (f + fm) / 2, (f - fm) / 2
    out["even_part_frac"] = math.sqrt(
        float(even.square().sum() / (even.square().sum() + odd.square().sum()))
    )
    return out


@pytest.mark.parametrize(
    "activation,parameterization",
    [("relu", "ntk"), ("leaky_relu", "standard"), ("tanh", "mean_field")],
)
def test_stored_trajectory_metrics_match_references(capture, activation, parameterization):
    spec = _spec(
        model={"activation": activation, "parameterization": parameterization, "leaky_slope": 0.2},
        data={"noise_sigma": 0.1},
        train={"lr": 0.5 if parameterization != "standard" else 0.2},
        metrics={"even_part": True},
        grid={"seed": [0, 1], "init_scale": [0.5, 1.5]},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    tables = train_chunk(chunk)
    traj = tables["trajectories"].to_pandas()
    (rec,) = capture.instances
    b = rec.batch
    cfg = chunk.points[0].config
    steps = sorted(traj.step.unique())
    assert len(rec.seen) == len(steps)
    checked = 0
    for e, point in enumerate(chunk.points):
        rows = traj[traj.run_id == point.run_id].set_index("step")
        ws0, bs0 = member(rec.params0, e)
        for i, step in enumerate(steps):
            ws, bs = member(rec.seen[i], e)
            ref = _ref_trajectory(
                cfg,
                rec.net.dims,
                ws,
                bs,
                ws0,
                bs0,
                b.x_test[e, :8],
                b.y_test[e, :8],
                b.x_test[e],
                b.codim_basis[e],
                0.2,
            )
            if activation != "relu":  # leaky with slope > 0 and tanh have no dead units
                assert np.isnan(rows.loc[step, "dead_frac"])
                ref.pop("dead_frac")
            for name, value in ref.items():
                np.testing.assert_allclose(
                    rows.loc[step, name],
                    value,
                    rtol=1e-8,
                    atol=1e-11,
                    err_msg=f"{name} step {step} member {e}",
                )
                checked += 1
    assert checked > 50
    # the run moved: the kernel changed and some activations flipped
    last = traj[traj.step == steps[-1]]
    assert (last.kernel_distance > 1e-9).all() and (last.act_flip_frac > 0).any()


def _balance(ws, bs, l):
    return np.sum(ws[l + 1] ** 2) - np.sum(ws[l] ** 2) - np.sum(bs[l] ** 2)


def test_stored_layer_metrics_match_numpy(capture):
    spec = _spec(
        model={"activation": "relu", "width": 7, "depth": 3},
        data={"input_dim": 9},
        train={"lr": 0.3},
        metrics={"top_k": 4, "spectra_budget": None},
        grid={"seed": [0, 1]},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    layers = _by(train_chunk(chunk)["layers"], ["run_id", "step", "layer"])
    (rec,) = capture.instances
    steps = sorted(layers.step.unique())
    for e, point in enumerate(chunk.points):
        rows = layers[layers.run_id == point.run_id]
        for i, step in enumerate(steps):
            ws = [w[e].numpy() for w in rec.seen[i].weights]
            ws0 = [w[e].numpy() for w in rec.params0.weights]
            bs = [b[e].numpy() for b in rec.seen[i].biases]
            for l in range(3):
                row = rows[(rows.step == step) & (rows.layer == l + 1)].iloc[0]
                sv = np.linalg.svd(ws[l], compute_uv=False)
                dsv = np.linalg.svd(ws[l] - ws0[l], compute_uv=False)
                top = np.asarray(row.top_sv, dtype=float)
                m = min(4, len(sv))
                np.testing.assert_allclose(top[:m], sv[:m], rtol=1e-10)
                assert len(top) == m  # only the singular values that exist
                np.testing.assert_allclose(
                    np.asarray(row.delta_top_sv, dtype=float)[:m], dsv[:m], rtol=1e-8, atol=1e-13
                )
                np.testing.assert_allclose(row.fro_norm, np.linalg.norm(ws[l]), rtol=1e-12)
                np.testing.assert_allclose(row.stable_rank, np.sum(sv**2) / sv[0] ** 2, rtol=1e-10)
                np.testing.assert_allclose(
                    row.rel_change,
                    np.linalg.norm(ws[l] - ws0[l]) / np.linalg.norm(ws0[l]),
                    rtol=1e-10,
                    atol=1e-15,
                )
                if l == 2:
                    assert np.isnan(row.balance_defect)
                else:
                    bs0 = [np.zeros_like(x) for x in bs]
                    ref = (_balance(ws, bs, l) - _balance(ws0, bs0, l)) / (
                        np.sum(ws0[l] ** 2) + np.sum(ws0[l + 1] ** 2)
                    )
                    np.testing.assert_allclose(row.balance_defect, ref, rtol=1e-6, atol=1e-14)


def test_top_sv_lists_are_as_long_as_the_layer_has_values():
    spec = _spec(
        model={"depth": 2, "width": 6}, metrics={"top_k": 3}, train={"steps": 3, "log_points": 2}
    )
    (chunk,) = make_chunks(expand(spec), spec)
    layers = train_chunk(chunk)["layers"].to_pandas()
    # layer 1 is (6, 5): top 3 of 5 values; layer 2 is (1, 6): one value, no padding
    lengths = layers.groupby("layer").top_sv.apply(lambda s: {len(v) for v in s})
    assert lengths.to_dict() == {1: {3}, 2: {1}}
    assert all(x is not None for v in layers.top_sv for x in v)


def test_linear_matrix_balance_matches_numpy(capture):
    spec = _spec(
        model={"activation": "linear", "width": 6, "depth": 3, "bias": True},
        train={"lr": 0.2},
        grid={"seed": [3]},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    layers = _by(train_chunk(chunk)["layers"], ["step", "layer"])
    (rec,) = capture.instances
    steps = sorted(layers.step.unique())

    def D(ws, bs, l):
        return ws[l + 1].T @ ws[l + 1] - ws[l] @ ws[l].T - np.outer(bs[l], bs[l])

    ws0 = [w[0].numpy() for w in rec.params0.weights]
    bs0 = [b[0].numpy() for b in rec.params0.biases]
    defects = []
    for i, step in enumerate(steps):
        ws = [w[0].numpy() for w in rec.seen[i].weights]
        bs = [b[0].numpy() for b in rec.seen[i].biases]
        for l in range(2):
            ref = np.linalg.norm(D(ws, bs, l) - D(ws0, bs0, l)) / (
                np.sum(ws0[l] ** 2) + np.sum(ws0[l + 1] ** 2)
            )
            got = layers[(layers.step == step) & (layers.layer == l + 1)].balance_defect.iloc[0]
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-15)
            defects.append(got)
    assert max(defects) > 0


# -- activation patterns ----------------------------------------------------------------------------


def test_dead_units_on_positive_inputs():
    """Bias-free ReLU on all-positive inputs: a unit with all-negative incoming weights is dead."""
    E, d, m = 2, 4, 10
    gen = torch.Generator().manual_seed(0)
    cfg = ModelConfig(depth=2, width=m, activation="relu", bias=False, parameterization="ntk")
    net = EnsembleMLP(cfg, d, 1)
    w1 = torch.randn(E, m, d, generator=gen, dtype=F64).abs()
    n_dead = [3, 7]
    for e, k in enumerate(n_dead):
        w1[e, :k] *= -1
    params = Params([w1, torch.randn(E, 1, m, generator=gen, dtype=F64)], None)
    x = torch.rand(E, 30, d, generator=gen, dtype=F64) + 0.1
    from phasesweep.pipeline.data._datasets import DataBatch

    batch = DataBatch(x, x[..., :1], x, x[..., :1], None, 1)
    rec = MetricRecorder(net, params, batch, validate_spec({"name": "x"}).metrics)
    out = rec.record(params, params)[0]
    np.testing.assert_allclose(out["dead_frac"].numpy(), np.array(n_dead) / m)
    assert (out["act_flip_frac"] == 0).all()
    # flipping the sign of one alive unit's weights flips its pattern on every probe input
    moved = params.clone()
    moved.weights[0][:, -1] *= -1
    out = rec.record(moved, params)[0]
    np.testing.assert_allclose(out["act_flip_frac"].numpy(), [1 / m, 1 / m])
    np.testing.assert_allclose(out["dead_frac"].numpy(), (np.array(n_dead) + 1) / m)


def test_references_at_step_0_come_from_its_own_forward():
    """Step 0 recorded first (θ_0 = θ(0)): the references at θ(0) (sign pattern, kernel) are
    taken from that step's probe forward, one forward per record; a later step's values
    are those of a recorder that computes its references from θ(0) itself."""
    from phasesweep.pipeline.data._datasets import DataBatch

    E, d, m, n = 3, 4, 8, 12
    gen = torch.Generator().manual_seed(1)
    cfg = ModelConfig(depth=3, width=m, activation="relu", bias=False, parameterization="ntk")
    net = EnsembleMLP(cfg, d, 1)
    params0 = init_params(net, [cfg] * E, list(range(E)))
    x = torch.randn(E, n, d, generator=gen, dtype=F64)
    batch = DataBatch(x, x[..., :1].sin(), x, x[..., :1].sin(), None, 1)
    moved = params0.clone()
    for w in moved.weights:
        w.add_(0.3 * torch.randn(w.shape, generator=gen, dtype=F64))
    metrics = validate_spec({"name": "x"}).metrics
    forwards = []

    def recorder() -> MetricRecorder:
        rec = MetricRecorder(net, params0, batch, metrics)
        forward = rec.net.forward
        rec.net = copy.copy(net)
        rec.net.forward = lambda *a, **k: forwards.append(1) or forward(*a, **k)
        return rec

    first = recorder()
    forwards.clear()
    at0 = first.record(params0.clone(), params0, step=0)[0]
    assert len(forwards) == 1
    assert (at0["act_flip_frac"] == 0).all() and (at0["kernel_rel_change"] == 0).all()
    later = first.record(moved, moved, step=5)[0]
    assert len(forwards) == 2
    reference = recorder().record(moved, moved, step=5)[0]
    assert len(forwards) == 4  # its references at θ(0), then the step
    assert later.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(later[key], value, rtol=0, atol=0, equal_nan=True, msg=key)


@pytest.mark.parametrize("power", [-80, 0, 70])
def test_kernel_scalars_of_float32_kernels_do_not_depend_on_their_scale(power):
    """Float32 kernels times 2^power: at 2^-80 (entries near 1e-23, a float32 NTK at a small
    init) their squares underflow, at 2^70 they overflow. The distance, relative change and
    alignment are those of the definitions in float64, within what float32 sums of P²
    products can be off by in any order (3·P²·ε of the Cauchy-Schwarz bound)."""
    gen = torch.Generator().manual_seed(5)
    E, P = 3, 24
    g = torch.randn(E, P, 30, generator=gen, dtype=F64)
    g0 = g + 0.5 * torch.randn(E, P, 30, generator=gen, dtype=F64)
    y = torch.randn(E, P, 1, generator=gen, dtype=F64)
    K, K0, Y = (g @ g.mT).numpy(), (g0 @ g0.mT).numpy(), y[..., 0].numpy()
    k, k0 = (scaled((a * 2.0**power).float()) for a in (g @ g.mT, g0 @ g0.mT))
    y32 = y.float()
    got = {
        "kernel_distance": kernel_distance(k, k0),
        "kernel_rel_change": kernel_rel_change(k, k0),
        "kernel_alignment": kernel_alignment(k, y32, target_norm(y32)),
    }
    bound = 3 * P * P * torch.finfo(torch.float32).eps
    for e in range(E):
        ref = {
            "kernel_distance": 1
            - np.sum(K[e] * K0[e]) / (np.linalg.norm(K[e]) * np.linalg.norm(K0[e])),
            "kernel_rel_change": np.linalg.norm(K[e] - K0[e]) / np.linalg.norm(K0[e]),
            "kernel_alignment": Y[e] @ K[e] @ Y[e] / (np.linalg.norm(K[e]) * (Y[e] @ Y[e])),
        }
        for name, value in ref.items():
            assert abs(float(got[name][e]) - value) <= bound * max(abs(value), 1.0), (name, e)


def test_float32_kernel_columns_at_a_small_init_are_finite():
    """A deep float32 net at init 1e-3 (its NTK near 1e-24): the stored kernel columns at
    step 0 are those of the float64 run to float32's resolution (the alignment was inf and
    the distance NaN while the kernel's squares underflowed)."""
    tables = {}
    for dtype in ("float32", "float64"):
        spec = _spec(
            model={"depth": 5, "width": 16, "bias": False},
            train={"steps": 4, "log_points": 2, "dtype": dtype},
            grid={"init_scale": [1e-3, 1.0]},
        )
        chunk = make_chunks(expand(spec), spec)[0]
        traj = train_chunk(chunk)["trajectories"].to_pandas()
        tables[dtype] = traj[traj.step == 0].sort_values("run_id").reset_index(drop=True)
    f32, f64 = tables["float32"], tables["float64"]
    assert f64.ntk_eig_max.min() < 1e-20  # the small init's kernel
    eps = torch.finfo(torch.float32).eps
    np.testing.assert_allclose(f32.kernel_alignment, f64.kernel_alignment, rtol=1e-4)
    assert (f32.kernel_distance.abs() <= 100 * eps).all()
    assert (f32.kernel_rel_change == 0).all()


@pytest.mark.parametrize("activation,depth", [("linear", 3), ("relu", 1), ("tanh", 2)])
def test_metrics_that_do_not_apply_are_null(activation, depth):
    spec = _spec(
        model={"activation": activation, "depth": depth},
        data={"kind": "teacher"},
        train={"steps": 5},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    tables = train_chunk(chunk)
    traj, layers = tables["trajectories"], tables["layers"]
    assert traj.column("transversal_grad_sq").null_count == traj.num_rows  # no codimension
    assert traj.column("even_part_frac").null_count == traj.num_rows  # not symmetric data
    assert traj.column("dead_frac").null_count == traj.num_rows  # not relu, or no hidden layer
    assert traj.column("kernel_distance").null_count == 0
    if activation == "linear" or depth == 1:
        assert traj.column("act_flip_frac").null_count == traj.num_rows
    bd = _by(layers, ["run_id", "step", "layer"])
    assert bd[bd.layer == depth].balance_defect.isna().all()  # last layer
    if activation == "tanh":
        assert bd.balance_defect.isna().all()
    elif depth > 1:
        assert bd[bd.layer < depth].balance_defect.notna().all()


def test_metric_switches():
    spec = _spec(metrics={"ntk": False, "spectra": False, "transversal": False}, train={"steps": 5})
    (chunk,) = make_chunks(expand(spec), spec)
    tables = train_chunk(chunk)
    traj, layers = tables["trajectories"], tables["layers"]
    for name in ("kernel_distance", "kernel_alignment", "ntk_eig_min", "transversal_grad_sq"):
        assert traj.column(name).null_count == traj.num_rows, name
    for name in ("top_sv", "delta_top_sv", "stable_rank"):
        assert layers.column(name).null_count == layers.num_rows, name
    assert layers.column("balance_defect").null_count < layers.num_rows


def test_even_part_of_a_bias_free_linear_net_is_zero_and_of_relu_is_not():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 5, generator=gen, dtype=F64)
    for act, expect_zero in (("linear", True), ("relu", False)):
        cfg = ModelConfig(depth=3, width=8, activation=act, bias=False)
        net = EnsembleMLP(cfg, 5, 1)
        params = random_params(net.dims, 2, False, gen)
        from phasesweep.pipeline.train.metrics._metrics import even_part_frac

        frac = even_part_frac(net, params, x)
        if expect_zero:
            assert (frac == 0).all()
        else:
            assert (frac > 0.05).all() and (frac < 1).all()
    # an even function (relu of |x|-like construction): f(x) = relu(w.x) + relu(-w.x) = |w.x|
    cfg = ModelConfig(depth=2, width=2, activation="relu", bias=False, parameterization="standard")
    net = EnsembleMLP(cfg, 5, 1)
    w = torch.randn(1, 1, 5, generator=gen, dtype=F64)
    params = Params([torch.cat([w, -w], 1), torch.ones(1, 1, 2, dtype=F64)], None)
    torch.testing.assert_close(even_part_frac(net, params, x[:1]), torch.ones(1, dtype=F64))


def test_non_finite_member_does_not_break_the_others():
    """A member with NaN weights (e.g. diverged) gets NaN metrics; the others are unchanged."""
    spec = _spec(grid={"seed": [0, 1, 2]})
    (chunk,) = make_chunks(expand(spec), spec)
    tr = ChunkTrainer(chunk)
    b = tr.batch
    rec = MetricRecorder(tr.net, tr.params0, b, spec.metrics)
    bad = tr.params0.clone()
    for w in bad.weights:
        w[1] = w[1] * 1.1
    ref_traj, ref_layers = rec.record(bad, bad)
    bad.weights[1][1, 0, 0] = float("nan")
    traj, layers = rec.record(bad, bad)
    for out, ref in ((traj, ref_traj), (layers, ref_layers)):
        for name, v in out.items():
            keep = [0, 2]
            torch.testing.assert_close(v[keep], ref[name][keep], equal_nan=True, msg=name)
    for name in ("kernel_distance", "ntk_eig_min", "ntk_eig_max", "output_norm"):
        assert torch.isnan(traj[name][1]), name
    assert torch.isnan(layers["top_sv"][1, 1]).all()  # the layer holding the NaN
    assert torch.isfinite(layers["top_sv"][1, 0]).all()  # the member's other layers are fine


# -- events --------------------------------------------------------------------------------------------


def test_loss_crossing_times_match_a_naive_loop():
    """runs.t_cross_* against a plain per-step autograd loop with the same init and data."""
    spec = _spec(
        model={"activation": "tanh", "depth": 2, "width": 16, "bias": False, "init_scale": 0.5},
        data={"kind": "teacher"},
        train={"steps": 400, "lr": 0.3, "log_points": 5},
        grid={"seed": [4]},
    )
    (point,) = expand(spec)
    runs = train_chunk(Chunk("ev", (point,)))["runs"].to_pandas().iloc[0]
    cfg = point.config
    ds = make_dataset(cfg.data, data_seed(cfg.data, cfg.train.seed))
    net = EnsembleMLP(cfg.model, ds.x_train.shape[1], ds.y_train.shape[1])
    p0 = init_params(net, [cfg.model], [cfg.train.seed])
    ws = [w[0].clone().requires_grad_(True) for w in p0.weights]
    act, mults = torch.tanh, ref_multipliers(cfg.model.parameterization, net.dims)
    losses = []
    for _ in range(cfg.train.steps + 1):
        loss = (
            0.5
            * (ref_forward(ws, None, ds.x_train, act, mults) - ds.y_train).square().sum()
            / ds.x_train.shape[0]
        )
        grads = torch.autograd.grad(loss, ws)
        losses.append(loss.item())
        with torch.no_grad():
            for w, g in zip(ws, grads):
                w -= cfg.train.lr * g
    losses = np.array(losses)
    times = cfg.train.lr * np.arange(len(losses))
    reached = 0
    for frac, col in zip(CROSSING_FRACTIONS, CROSSING_COLUMNS):
        target = frac * losses[0]
        below = np.nonzero(losses < target)[0]
        if len(below) == 0:
            assert np.isnan(runs[col]), col
            continue
        k = below[0]
        w = (losses[k - 1] - target) / (losses[k - 1] - losses[k])
        expected = times[k - 1] + w * (times[k] - times[k - 1])
        np.testing.assert_allclose(runs[col], expected, rtol=1e-9, err_msg=col)
        reached += 1
    assert reached >= 3


@pytest.mark.parametrize("ntk", [True, False])
def test_spectra_budget_leaves_out_logged_steps_but_keeps_first_and_last(ntk):
    """Wide square layers and a short run: the SVD and kernel-eigenvalue work would
    exceed the budget."""
    spec = _spec(
        model={"depth": 3, "width": 96},
        train={"steps": 1000, "log_points": 30, "lr": 0.02},
        metrics={"spectra_budget": 0.45, "ntk": ntk, "probe_size": 16},
    )
    (chunk,) = make_chunks(expand(spec), spec)
    tables = train_chunk(chunk)
    layers = _by(tables["layers"], ["step", "layer"])
    traj = _by(tables["trajectories"], ["step"])
    steps = sorted(layers.step.unique())
    # a step whose spectra were skipped stores a NULL list
    has = [
        layers[(layers.step == k) & (layers.layer == 2)].top_sv.iloc[0] is not None for k in steps
    ]
    # the estimate: 2 SVDs (W and ΔW) of ~36 m²M each and the eigenvalues of the 16 × 16
    # kernel (~24·16³), against 6·n·Σ ab flops per step
    dims = [5, 96, 96, 1]
    per_log = 2 * sum(36 * min(a, b) ** 2 * max(a, b) for a, b in zip(dims[:-1], dims[1:]))
    per_log += 24 * 16**3 if ntk else 0
    train = 6 * 16 * sum(a * b for a, b in zip(dims[:-1], dims[1:])) * 1000
    assert 2 < sum(has) == int(0.45 * train // per_log) < len(steps)
    assert has[0] and has[-1]
    chosen = [k for k, h in zip(steps, has) if h]
    spectral = layers[layers.step.isin(chosen)]
    other = layers[~layers.step.isin(chosen)]
    assert spectral.stable_rank.notna().all() and other.stable_rank.isna().all()
    assert other.balance_defect.notna().any() and other.fro_norm.notna().all()
    eig = traj[["ntk_eig_min", "ntk_eig_max"]].notna().all(axis=1)
    assert list(eig) == ([k in chosen for k in traj.step] if ntk else [False] * len(traj))
    if ntk:
        assert traj.kernel_distance.notna().all()


def test_a_run_too_short_for_two_steps_of_spectra_keeps_the_last_svd_and_two_eigenvalues():
    """Fewer than 2 logged steps of spectra fit the budget: the singular values are kept
    at the last logged step only, the kernel's eigenvalues at the first and the last."""
    spec = _spec(
        model={"depth": 3, "width": 96},
        train={"steps": 30, "log_points": 6, "lr": 0.02},
        metrics={"spectra_budget": 0.1, "probe_size": 16},
    )
    dims = [5, 96, 96, 1]
    per_log = 2 * sum(36 * min(a, b) ** 2 * max(a, b) for a, b in zip(dims[:-1], dims[1:]))
    per_log += 24 * 16**3
    train = 6 * 16 * sum(a * b for a, b in zip(dims[:-1], dims[1:])) * 30
    assert 0.1 * train // per_log < 2
    (chunk,) = make_chunks(expand(spec), spec)
    tables = train_chunk(chunk)
    layers = _by(tables["layers"], ["step", "layer"])
    traj = _by(tables["trajectories"], ["step"])
    steps = sorted(traj.step)
    assert len(steps) > 2
    svd = layers.groupby("step").stable_rank.apply(lambda s: s.notna().all())
    assert list(svd.index[svd]) == [steps[-1]]
    assert layers[layers.step < steps[-1]].top_sv.isna().all()
    eig = traj[["ntk_eig_min", "ntk_eig_max"]].notna().all(axis=1)
    assert list(traj.step[eig]) == [steps[0], steps[-1]]


@pytest.mark.parametrize("activation", ["linear", "relu"])
def test_even_part_is_recorded_for_symmetric_data_by_default(activation):
    spec = _spec(
        model={"activation": activation, "bias": False, "depth": 2},
        data={"kind": "symmetric", "n_train": 16, "n_test": 20, "input_dim": 4},
        train={"steps": 40},
    )
    assert spec.metrics.even_part is None
    (chunk,) = make_chunks(expand(spec), spec)
    frac = train_chunk(chunk)["trajectories"].column("even_part_frac").to_numpy()
    assert not np.isnan(frac).any()
    if activation == "linear":
        assert (frac == 0).all()
    else:
        assert (frac > 0).all() and (frac < 1).all()
