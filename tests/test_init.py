"""Init schemes against independent properties: realised Frobenius norms, entry std within
sampling error, exact balance, antisymmetric output 0 (to rounding), per-layer scales,
reproducibility from seeds, member independence, and runs.init_fro_norms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import ModelConfig, SpecError, validate_spec
from phasesweep.pipeline.train._init import init_params
from phasesweep.pipeline.train._models import EnsembleMLP
from phasesweep.pipeline.train._trainer import ChunkTrainer, train_chunk

U = torch.finfo(torch.float64).eps / 2  # unit roundoff


def _init(cfg: ModelConfig, seeds=(0,), d_in=7, d_out=3):
    net = EnsembleMLP(cfg, d_in, d_out)
    return net, init_params(net, [cfg] * len(seeds), list(seeds))


def _spec(model: dict, grid: dict | None = None, data: dict | None = None):
    return validate_spec(
        {
            "name": "init",
            "model": model,
            "data": data or {"kind": "teacher", "n_train": 16, "n_test": 8, "input_dim": 7},
            "train": {"steps": 1, "lr": 0.01, "log_points": 2},
            "metrics": {"probe_size": 4, "ntk": False},
            "grid": grid or {},
        }
    )


@pytest.mark.parametrize("init", ["gaussian", "antisymmetric"])
@pytest.mark.parametrize("param", ["standard", "ntk", "mean_field"])
def test_frobenius_sets_every_layer_norm(init, param):
    cfg = ModelConfig(
        depth=4, width=16, init=init, init_norm="frobenius", init_scale=0.37, parameterization=param
    )
    _, params = _init(cfg, seeds=(0, 1))
    for w in params.weights:
        norms = w.reshape(2, -1).norm(dim=1)
        assert torch.allclose(norms, torch.full((2,), 0.37, dtype=torch.float64), rtol=1e-14)


def test_layer_scales_multiply_layer_norms():
    cfg = ModelConfig(
        depth=3, width=10, init_norm="frobenius", init_scale=2.0, layer_scales=[1.0, 0.1, 5.0]
    )
    _, params = _init(cfg)
    norms = [float(w.norm()) for w in params.weights]
    assert norms == pytest.approx([2.0, 0.2, 10.0], rel=1e-14)
    with pytest.raises(SpecError) as e:
        _spec({"depth": 3, "layer_scales": [1.0, 2.0]})
    assert "layer_scales" in e.value.reason


@pytest.mark.parametrize("param", ["standard", "ntk"])
def test_entry_std_within_sampling_error(param):
    g = 0.05
    cfg = ModelConfig(
        depth=3, width=200, init_norm="entry_std", init_scale=g, parameterization=param
    )
    _, params = _init(cfg, d_in=50, d_out=20)
    for w in params.weights:
        n = w.numel()
        # the sample std of n Gaussian entries has relative standard error 1/sqrt(2n)
        assert abs(float(w.std()) / g - 1) < 5 / math.sqrt(2 * n)
        assert abs(float(w.mean())) < 5 * g / math.sqrt(n)


def test_fan_in_std_follows_the_parameterization():
    g = 1.7
    for param, fan_in_std in [("standard", True), ("ntk", False), ("mean_field", False)]:
        cfg = ModelConfig(depth=2, width=400, init_scale=g, parameterization=param)
        _, params = _init(cfg, d_in=100, d_out=30)
        for w, fan_in in zip(params.weights, (100, 400)):
            want = g / math.sqrt(fan_in) if fan_in_std else g
            assert abs(float(w.std()) / want - 1) < 5 / math.sqrt(2 * w.numel()), param


@pytest.mark.parametrize("depth", [2, 3, 5])
def test_balanced_init_is_exactly_balanced_rank_one(depth):
    g = 0.3
    cfg = ModelConfig(depth=depth, width=12, init="balanced", init_scale=g, activation="linear")
    _, params = _init(cfg, seeds=(4,))
    ws = [w[0] for w in params.weights]
    for l in range(depth - 1):
        d = ws[l + 1].T @ ws[l + 1] - ws[l] @ ws[l].T
        assert d.abs().max() < 8 * U * g * g
    for w in ws:
        sv = torch.linalg.svdvals(w)
        assert float(sv[0]) == pytest.approx(g, rel=1e-13)
        if len(sv) > 1:
            assert float(sv[1]) < 1e-14
        assert float(w.norm()) == pytest.approx(g, rel=1e-14)


def _dot_error(n: int) -> float:
    """γ_n = n·u/(1 − n·u): |fl(Σ_i a_i b_i) − Σ_i a_i b_i| ≤ γ_n Σ_i |a_i b_i| for every
    summation order (Higham, Accuracy and Stability, §3.1), so for any BLAS blocking."""
    return n * U / (1 - n * U)


@pytest.mark.parametrize(
    "depth,act,width", [(2, "relu", 64), (3, "tanh", 32), (4, "leaky_relu", 256), (3, "relu", 64)]
)
def test_antisymmetric_output_is_zero_to_rounding(depth, act, width):
    cfg = ModelConfig(
        depth=depth, width=width, init="antisymmetric", activation=act, init_scale=2.0
    )
    net, params = _init(cfg, seeds=(0, 1, 2), d_in=10, d_out=2)
    x = torch.randn(3, 50, 10, dtype=torch.float64)
    fwd = net.forward(params, x)
    h = fwd.post[-1]  # last hidden activations (E, n, m)
    half = width // 2
    # The mirrored units of the last hidden layer compute the same dot product over the
    # same inputs, but a GEMM may sum the two in different orders. Each preactivation errs
    # by at most γ_n Σ_i |c w_i h_i| (+ u|z| for the multiplier); φ is 1-Lipschitz and
    # correctly rounded to a few ulps, so the two copies differ by at most `delta`.
    h_in, w_in, c_in = fwd.post[-2], params.weights[-2], abs(net.multipliers[-2])
    abs_pre = c_in * torch.bmm(h_in.abs(), w_in.abs().transpose(1, 2))
    delta = 2 * (_dot_error(h_in.shape[-1]) + 2 * U) * abs_pre + 8 * U * h.abs()
    delta = torch.maximum(delta[..., :half], delta[..., half:])
    assert ((h[..., half:] - h[..., :half]).abs() <= delta).all()
    # output = c Σ_j a_j h_j with a_{j+m/2} = −a_j: exactly c Σ_{j<m/2} a_j (h_j − h_{j+m/2})
    # for the computed h, which the sum of m terms computes with error ≤ γ_m Σ_j |a_j h_j|
    a = params.weights[-1]  # (E, k, m)
    c_out = abs(net.multipliers[-1])
    terms = c_out * torch.einsum("enm,ekm->enk", h.abs(), a.abs())
    mirror = c_out * torch.einsum("enm,ekm->enk", delta, a[..., :half].abs())
    bound = (mirror + (_dot_error(width) + 2 * U) * terms) * (1 + 4 * U)
    assert (fwd.output.abs() <= bound).all()
    assert bound.max() < 1e-9 * terms.max()  # a genuine cancellation, far below O(1)
    assert terms.min() > 0  # ... of a live net
    # without the mirroring the output is O(1)
    plain = init_params(net, [cfg.model_copy(update={"init": "gaussian"})] * 3, [0, 1, 2])
    assert net(plain, x).abs().max() > 0.1


def test_antisymmetric_initial_loss_is_the_label_energy():
    spec = _spec({"depth": 2, "width": 64, "init": "antisymmetric", "init_scale": 3.0})
    (chunk,) = make_chunks(expand(spec), spec)
    trainer = ChunkTrainer(chunk)
    y = trainer.batch.y_train
    runs = train_chunk(chunk)["runs"].to_pandas()
    want = float(0.5 * y.square().sum() / y.shape[1])
    assert runs.initial_train_loss[0] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("init", ["gaussian", "balanced", "balanced_full", "antisymmetric"])
def test_reproducible_from_the_seed(init):
    cfg = ModelConfig(depth=3, width=8, init=init)
    _, a = _init(cfg, seeds=(5, 6))
    _, b = _init(cfg, seeds=(5, 6))
    for wa, wb in zip(a.weights, b.weights):
        assert torch.equal(wa, wb)
        assert not torch.equal(wa[0], wa[1])


def test_member_init_independent_of_chunk_composition():
    spec = _spec(
        {"depth": 3, "width": 8, "bias": True},
        grid={
            "init_scale": [0.01, 1.0],
            "seed": [0, 1, 2],
            "model.layer_scales": [[1, 1, 1], [2, 1, 0.5]],
        },
    )
    points = expand(spec)
    (chunk,) = make_chunks(points, spec)
    together = ChunkTrainer(chunk).params0
    for i, p in enumerate(points):
        alone = ChunkTrainer(make_chunks([p], spec)[0]).params0
        for wt, wa in zip(together.tensors(), alone.tensors()):
            assert torch.equal(wt[i], wa[0]), p.coords


@pytest.mark.parametrize(
    "model,expected",
    [
        (
            {"init_norm": "frobenius", "init_scale": 0.5, "layer_scales": [1.0, 2.0, 4.0]},
            [0.5, 1.0, 2.0],
        ),
        ({"init": "balanced", "init_scale": 0.25}, [0.25, 0.25, 0.25]),
    ],
)
def test_runs_store_the_realised_init_fro_norms(model, expected):
    spec = _spec({"depth": 3, "width": 6, **model}, grid={"seed": [0, 1]})
    (chunk,) = make_chunks(expand(spec), spec)
    runs = train_chunk(chunk)["runs"].to_pandas()
    for norms in runs.init_fro_norms:
        np.testing.assert_allclose(list(norms), expected, rtol=1e-13)


def test_runs_fro_norms_of_fan_in_init_match_the_weights():
    spec = _spec({"depth": 3, "width": 20, "init_scale": 0.1}, grid={"seed": [0, 1]})
    (chunk,) = make_chunks(expand(spec), spec)
    trainer = ChunkTrainer(chunk)
    want = np.stack([w.reshape(2, -1).norm(dim=1).numpy() for w in trainer.params0.weights], 1)
    runs = train_chunk(chunk)["runs"].to_pandas()
    np.testing.assert_allclose(np.stack(runs.init_fro_norms.to_numpy()), want, rtol=1e-14)
    # NTK param, entries ~ N(0, 0.1²): ||W_l||_F ≈ 0.1·sqrt(fan_in·fan_out)
    np.testing.assert_allclose(want[0], 0.1 * np.sqrt([20 * 7, 20 * 20, 1 * 20]), rtol=0.25)


@pytest.mark.parametrize("depth,width,d_in,d_out", [(2, 12, 7, 3), (3, 6, 7, 5), (4, 9, 4, 4)])
def test_balanced_full_is_exactly_balanced_with_full_rank(depth, width, d_in, d_out):
    g = 0.3
    cfg = ModelConfig(
        depth=depth, width=width, init="balanced_full", init_scale=g, activation="linear"
    )
    _, params = _init(cfg, seeds=(0, 3), d_in=d_in, d_out=d_out)
    r = min(width, d_in, d_out)
    n = max(width, d_in, d_out)
    # W = (U σ) Vᵀ with r-term dot products: |ΔW| ≤ γ_r σ |U||V|ᵀ, ‖ΔW‖_F ≤ γ_r g √r; the
    # grams add γ_n ‖W‖_F² each: |D_ij| ≤ 2 (γ_n + 3 √r γ_r) g², any summation order
    bound = 2.02 * (_dot_error(n) + 3 * math.sqrt(r) * _dot_error(r)) * g * g
    for e in range(2):
        ws = [w[e] for w in params.weights]
        for l in range(depth - 1):
            d = ws[l + 1].T @ ws[l + 1] - ws[l] @ ws[l].T
            assert float(d.abs().max()) <= bound
        for w in ws:
            sv = torch.linalg.svdvals(w)
            # full rank r (the narrowest layer), r equal singular values g/√r, the rest 0
            assert sv[:r].numpy() == pytest.approx([g / math.sqrt(r)] * r, rel=1e-13)
            assert float(sv[r:].abs().sum()) < 1e-14 * g
            assert float(w.norm()) == pytest.approx(g, rel=1e-13)
    # members differ (their own seeds), so the frames are random
    assert not torch.equal(params.weights[0][0], params.weights[0][1])


def test_balanced_rank_one_is_the_balanced_init():
    a = ModelConfig(depth=3, width=8, init="balanced", init_scale=0.2, activation="linear")
    b = a.model_copy(update={"init": "balanced_rank_one"})
    _, pa_ = _init(a, seeds=(5,))
    _, pb = _init(b, seeds=(5,))
    for wa, wb in zip(pa_.weights, pb.weights):
        assert torch.equal(wa, wb)


def _naive_member(net, cfg: ModelConfig, seed: int) -> list[torch.Tensor]:
    """One member's initial weights drawn alone from its own generator, as the module's
    docstring says, with the float64 operations a member alone takes (torch's ``g / ‖W‖``
    for ``frobenius``)."""
    from phasesweep.pipeline.data._seeding import generator

    gen = generator(seed, "init")
    dims, g = net.dims, cfg.init_scale
    if cfg.init == "balanced":
        units = [torch.randn(n, generator=gen, dtype=torch.float64) for n in dims]
        units = [u / u.norm() for u in units]
        weights = [g * torch.outer(units[l], units[l - 1]) for l in range(1, len(dims))]
    else:
        weights = [
            torch.randn(dims[l], dims[l - 1], generator=gen, dtype=torch.float64)
            for l in range(1, len(dims))
        ]
        for l, w in enumerate(weights, start=1):
            if cfg.init_norm == "fan_in":
                w *= g * (1 / math.sqrt(dims[l - 1]) if cfg.parameterization == "standard" else 1)
            elif cfg.init_norm == "entry_std":
                w *= g
            else:
                w *= g / w.norm()
    if cfg.layer_scales is not None:
        weights = [w * s for w, s in zip(weights, cfg.layer_scales)]
    return weights


@pytest.mark.parametrize(
    "init, norm",
    [
        ("gaussian", "fan_in"),
        ("gaussian", "entry_std"),
        ("gaussian", "frobenius"),
        ("balanced", "fan_in"),
    ],
)
def test_one_draw_per_seed_gathered_and_scaled_equals_each_member_drawing_its_own(init, norm):
    """The ensemble draws once per seed and scales the gathered draws per member: every
    member's weights equal, bit for bit, those it draws alone (members in any order,
    seeds repeated and interleaved, init scales and layer scales differing)."""
    base = ModelConfig(depth=3, width=6, init=init, init_norm=norm, parameterization="standard")
    models = [
        base.model_copy(update={"init_scale": g, "layer_scales": ls})
        for g in (0.1, 2.5)
        for ls in (None, [1.0, 3.0, 0.5])
    ]
    configs = [m for m in models for _ in range(3)]
    seeds = [s for _ in models for s in (5, 1, 5)]
    net = EnsembleMLP(base, 4, 2)
    params = init_params(net, configs, seeds)
    for e, (cfg, seed) in enumerate(zip(configs, seeds)):
        for layer, w in zip(params.weights, _naive_member(net, cfg, seed)):
            assert torch.equal(layer[e], w)
