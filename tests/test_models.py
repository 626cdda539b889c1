"""The hand-written ensemble forward/backward against autograd and a plain per-model loop."""

from __future__ import annotations

import itertools

import pytest
import torch
from phasesweep.pipeline import activations
from phasesweep.pipeline.spec import ModelConfig
from phasesweep.pipeline.train._models import EnsembleMLP, Params, loss_and_grads


def _random_params(net: EnsembleMLP, E: int, bias: bool, gen: torch.Generator) -> Params:
    ws = [
        torch.randn(E, o, i, generator=gen, dtype=torch.float64)
        for i, o in zip(net.dims[:-1], net.dims[1:])
    ]
    bs = (
        [torch.randn(E, o, generator=gen, dtype=torch.float64) for o in net.dims[1:]]
        if bias
        else None
    )
    return Params(ws, bs)


@pytest.mark.parametrize(
    "activation,parameterization,bias,depth",
    list(
        itertools.product(
            activations.names(),  # every registered activation
            ["standard", "ntk", "mean_field"],
            [False, True],
            [1, 3],
        )
    ),
)
def test_backward_matches_autograd(activation, parameterization, bias, depth):
    gen = torch.Generator().manual_seed(0)
    E, n, d, k = 3, 7, 5, 2
    cfg = ModelConfig(
        depth=depth, width=6, activation=activation, parameterization=parameterization, bias=bias
    )
    slope = torch.tensor([0.1, 0.3, 0.5], dtype=torch.float64)
    net = EnsembleMLP(cfg, d, k, leaky_slope=slope)
    params = _random_params(net, E, bias, gen)
    x = torch.randn(E, n, d, generator=gen, dtype=torch.float64)
    y = torch.randn(E, n, k, generator=gen, dtype=torch.float64)

    loss, grads, _ = loss_and_grads(net, params, x, y)

    leaves = [t.clone().requires_grad_(True) for t in params.tensors()]
    ref_params = Params(leaves[:depth], leaves[depth:] if bias else None)
    ref_loss = 0.5 * (net(ref_params, x) - y).square().sum((1, 2)) / n
    ref_grads = torch.autograd.grad(ref_loss.sum(), leaves)
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-12, atol=0)
    for g, r in zip(grads.tensors(), ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-14)


def test_forward_matches_per_member_torch_modules():
    """Member e of the ensemble is the plain nn.Sequential with member e's weights."""
    gen = torch.Generator().manual_seed(1)
    E, n, d, width = 4, 9, 3, 8
    cfg = ModelConfig(depth=3, width=width, activation="tanh", parameterization="ntk", bias=True)
    net = EnsembleMLP(cfg, d, 1)
    params = _random_params(net, E, True, gen)
    x = torch.randn(E, n, d, generator=gen, dtype=torch.float64)
    out = net(params, x)
    for e in range(E):
        h = x[e]
        for l in range(3):
            w, b = params.weights[l][e], params.biases[l][e]
            h = torch.nn.functional.linear(h, w / net.dims[l] ** 0.5, b)
            if l < 2:
                h = torch.tanh(h)
        torch.testing.assert_close(out[e], h, rtol=1e-12, atol=1e-14)
