"""The activation registry: every record against autograd, and a new activation added in a
test alone (registered, validated by the spec, trained) as a new one would be."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from phasesweep.pipeline import activations
from phasesweep.pipeline.activations import Activation
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import ModelConfig, SpecError, validate_spec
from phasesweep.pipeline.train._models import EnsembleMLP, EnsembleStep, Params, loss_and_grads
from phasesweep.pipeline.train._trainer import train_chunk
from phasesweep.pipeline.train.metrics._spectra import balance_scalar

E, N, W = 3, 5, 4
SOFTPLUS = Activation(
    "softplus",
    lambda z, a: torch.nn.functional.softplus(z),
    lambda z, h, a: torch.sigmoid(z),
)
# squared ReLU: homogeneous of degree 2, and its units die like ReLU's
RELU2 = Activation(
    "relu2",
    lambda z, a: z.relu().square(),
    lambda z, h, a: 2 * z.relu(),
    degree=2.0,
    dead=lambda a: True,
)


@pytest.fixture
def registered():
    """SOFTPLUS and RELU2 in the registry for one test."""
    for act in (SOFTPLUS, RELU2):
        activations.register(act)
    yield
    for act in (SOFTPLUS, RELU2):
        activations.unregister(act.name)


def _slopes():
    return [0.0, 0.3, torch.tensor([0.0, 0.1, 0.5], dtype=torch.float64).view(E, 1, 1)]


def _check_record(act: Activation, a) -> None:
    """φ' against autograd, every fast path against back ⊙ φ', homogeneity, dead units."""
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(E, N, W, generator=gen, dtype=torch.float64)
    back = torch.randn(E, N, W, generator=gen, dtype=torch.float64)
    leaf = z.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(act.phi(leaf, a).sum(), leaf)  # φ'(z) elementwise
    h = act.phi(z, a)
    d = torch.ones_like(z) if act.dphi is None else act.dphi(z, h, a)
    torch.testing.assert_close(d, auto, rtol=1e-12, atol=1e-15)
    expected = back * auto
    torch.testing.assert_close(act.grad(back, z, h, a), expected, rtol=1e-12, atol=1e-15)
    row = back[:, :1]  # the NTK's first sensitivity broadcasts over rows
    torch.testing.assert_close(act.grad(row, z, h, a), row * auto, rtol=1e-12, atol=1e-15)
    zb = z.clone()  # the blocked step: φ in place where it can, δ from h (and z's buffer)
    hb = act.phi_(zb, a)
    torch.testing.assert_close(hb, h, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(act.grad_(back.clone(), zb, hb, a), expected, rtol=1e-12, atol=0)
    if act.degree is not None:
        c = 2.5
        torch.testing.assert_close(act.phi(c * z, a), c**act.degree * h, rtol=1e-12, atol=1e-15)
    if act.dead is not None:
        dead = torch.as_tensor(act.dead(a)).expand(E, 1, 1)
        for e in range(E):  # φ' = 0 where z ≤ 0 iff a unit can die
            assert bool((auto[e][z[e] <= 0] == 0).all()) == bool(dead[e, 0, 0]), e


@pytest.mark.parametrize("name", activations.names())
@pytest.mark.parametrize("a", _slopes(), ids=["0", "0.3", "per-member"])
def test_every_builtin_record_against_autograd(name, a):
    _check_record(activations.get(name), a)


def test_a_registered_activation_is_checked_validated_and_trained(registered):
    for act in (SOFTPLUS, RELU2):
        _check_record(act, 0.1)
    # the spec knows it now: a typo suggests it, and a grid of it validates
    with pytest.raises(SpecError, match=r"did you mean softplus\?.*softplus"):
        validate_spec({"name": "t", "model": {"activation": "sofplus"}})
    spec = validate_spec(
        {
            "name": "t",
            "model": {"depth": 3, "width": 8, "activation": "softplus", "bias": True},
            "data": {"kind": "teacher", "n_train": 12, "n_test": 10, "input_dim": 3},
            "train": {"steps": 80, "lr": 0.2, "log_points": 8},
            "metrics": {"probe_size": 6},
            "grid": {"seed": [0, 1]},
        }
    )
    tables = train_chunk(make_chunks(expand(spec), spec)[0])
    runs, traj = tables["runs"].to_pandas(), tables["trajectories"].to_pandas()
    assert (runs["activation"] == "softplus").all() and (runs["status"] == "completed").all()
    assert (runs["final_train_loss"] < runs["initial_train_loss"]).all()
    # pattern metrics apply, dead units and balance do not (not homogeneous, never dead)
    assert traj["act_flip_frac"].notna().all() and traj["dead_frac"].isna().all()
    assert tables["layers"].to_pandas()["balance_defect"].isna().all()


@pytest.mark.parametrize("name", ["softplus", "relu2"])
def test_registered_activation_backward_and_blocked_step_match_autograd(registered, name):
    """The default fast paths (out-of-place φ, δ = φ'·back) in the hand-written backward
    and the blocked step."""
    gen = torch.Generator().manual_seed(2)
    cfg = ModelConfig(depth=3, width=W, activation=name, bias=True)
    net = EnsembleMLP(cfg, 3, 2)
    params = Params(
        [
            torch.randn(E, o, i, generator=gen, dtype=torch.float64)
            for i, o in [(3, W), (W, W), (W, 2)]
        ],
        [torch.randn(E, o, generator=gen, dtype=torch.float64) for o in (W, W, 2)],
    )
    x = torch.randn(E, N, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(E, N, 2, generator=gen, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in params.tensors()]
    ref = 0.5 * (net(Params(leaves[:3], leaves[3:]), x) - y).square().sum((1, 2)) / N
    auto = torch.autograd.grad(ref.sum(), leaves)
    _, grads, _ = loss_and_grads(net, params, x, y)
    _, blocked = EnsembleStep(net, E, 2).loss_and_grads(params, x, y)
    for g, b, r in zip(grads.tensors(), blocked.tensors(), auto):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(b, r, rtol=1e-10, atol=1e-14)


def test_balance_of_degree_k_is_conserved_by_gradient_flow(registered):
    """For φ homogeneous of degree k, c_l = k‖W_{l+1}‖² − ‖W_l‖² − ‖b_l‖² has zero
    derivative along −∇L: its linear term ⟨∇c, G⟩ vanishes at any θ. The quadratic c
    gives it exactly by polarization, ⟨∇c(θ), G⟩ = (c(θ + G) − c(θ − G)) / 2."""
    gen = torch.Generator().manual_seed(3)
    cfg = ModelConfig(depth=3, width=W, activation="relu2", bias=True)
    net = EnsembleMLP(cfg, 3, 1)
    dims = [(3, W), (W, W), (W, 1)]
    params = Params(
        [0.5 * torch.randn(E, o, i, generator=gen, dtype=torch.float64) for i, o in dims],
        [0.5 * torch.randn(E, o, generator=gen, dtype=torch.float64) for o in (W, W, 1)],
    )
    x = torch.randn(E, N, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(E, N, 1, generator=gen, dtype=torch.float64)
    _, g, _ = loss_and_grads(net, params, x, y)

    def shifted(sign):
        return Params(
            [w + sign * gw for w, gw in zip(params.weights, g.weights)],
            [b + sign * gb for b, gb in zip(params.biases, g.biases)],
        )

    # every term of c(θ ± G) is at most the squared norms: bound the round-off by them
    scale = 4 * (params.sq_norm() + g.sq_norm()).max()
    for k, conserved in ((2.0, True), (1.0, False)):
        linear = (balance_scalar(shifted(1), k) - balance_scalar(shifted(-1), k)) / 2
        if conserved:
            assert linear.abs().max() <= 1e-12 * scale
        else:  # the wrong degree: the term is of the order of the gradient
            assert linear.abs().max() > 1e-3 * g.sq_norm().max()


@pytest.mark.process
def test_the_spec_reads_the_registry_without_torch():
    """The CLI validates specs before any training: the registry must not import torch."""
    code = (
        "import sys\n"
        "from phasesweep.pipeline.spec import validate_spec\n"
        "validate_spec({'name': 't', 'grid': {'activation': ['tanh', 'leaky_relu']}})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
