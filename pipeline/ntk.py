"""The empirical neural tangent kernel of an ensemble, by layerwise formula.

For a member with parameters θ and outputs f(x) ∈ R^k the (trace) NTK on inputs
x, x′ is

    K(x, x′) = Σ_o Σ_θ ∂f_o(x)/∂θ · ∂f_o(x′)/∂θ

(for k = 1 the usual scalar NTK; for k > 1 the trace of the k×k kernel
matrix). With layer ``l`` computing ``z_l = c_l · W_l h_{l−1} + b_l`` (see
:mod:`pipeline.models`), ∂f_o/∂W_l[j, i] = c_l δ^o_l[j] h_{l−1}[i] with
δ^o_l = ∂f_o/∂z_l, so the Jacobian never needs to be materialised:

    K = Σ_l  D_l ∘ (c_l² H_{l−1} H_{l−1}ᵀ + [bias] 1 1ᵀ),   D_l = Σ_o Δ^o_l Δ^o_lᵀ,

with H_{l−1} the (P, n_{l−1}) post-activations and Δ^o_l the (P, n_l)
sensitivities of the P inputs. Everything is batched over the ensemble (bmm);
the cost per layer is O(E·P²·n_l) plus one backward pass per output, memory
O(E·P·(P + n_l)).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from pipeline.models import EnsembleMLP, Forward, Params


def sensitivities(net: EnsembleMLP, params: Params, fwd: Forward) -> Iterator[list[Tensor]]:
    """For each output o, the list ``[δ^o_1, …, δ^o_L]`` of ∂f_o/∂z_l, each (E, n, n_l).

    A generator over outputs, so only one output's sensitivities are held at a time.
    """
    E, n, k = fwd.output.shape
    for o in range(k):
        delta = fwd.output.new_zeros(E, n, k)
        delta[..., o] = 1.0
        out = [delta]
        for l in range(net.depth - 1, 0, -1):
            back = torch.bmm(delta, params.weights[l])
            c = net.multipliers[l]
            if c != 1.0:
                back = back.mul_(c)
            d = net.phi_prime(fwd.pre[l - 1], fwd.post[l])
            delta = back if d is None else back.mul_(d)
            out.append(delta)
        yield out[::-1]


def _gram(a: Tensor) -> Tensor:
    return torch.bmm(a, a.transpose(1, 2))


def empirical_ntk(
    net: EnsembleMLP,
    params: Params,
    x: Tensor,
    per_layer: bool = False,
    fwd: Forward | None = None,
) -> Tensor:
    """The empirical (trace) NTK of every member on inputs x (E, P, d).

    Returns (E, P, P), or (E, L, P, P) with ``per_layer`` (layer l's weights and
    bias together; the sum over layers is the full kernel). ``fwd``: a cached
    forward pass of ``params`` on ``x``.
    """
    fwd = net.forward(params, x) if fwd is None else fwd
    d_sum: list[Tensor | None] = [None] * net.depth
    for deltas in sensitivities(net, params, fwd):
        for l, delta in enumerate(deltas):
            g = _gram(delta)
            d_sum[l] = g if d_sum[l] is None else d_sum[l].add_(g)
    layers = []
    for l in range(net.depth):
        c = net.multipliers[l]
        inner = _gram(fwd.post[l]).mul_(c * c)
        if params.biases is not None:
            inner.add_(1.0)
        layers.append(inner.mul_(d_sum[l]))
    if per_layer:
        return torch.stack(layers, 1)
    return torch.stack(layers, 0).sum(0)


def _fro(a: Tensor) -> Tensor:
    return a.reshape(a.shape[0], -1).norm(dim=1)


def kernel_distance(k: Tensor, k0: Tensor) -> Tensor:
    """1 − ⟨K, K0⟩_F / (‖K‖_F ‖K0‖_F) per member: (E, P, P) → (E,); NaN for a zero kernel.

    Clamped at 0 (a cosine one ulp above 1 would give −1e-16)."""
    inner = (k * k0).reshape(k.shape[0], -1).sum(1)
    return (1.0 - inner / (_fro(k) * _fro(k0))).clamp_(min=0.0)


def kernel_rel_change(k: Tensor, k0: Tensor) -> Tensor:
    """‖K − K0‖_F / ‖K0‖_F per member: (E, P, P) → (E,).

    First order in the kernel's movement, so in the lazy regime it shrinks like
    m^-1/2 with the width; :func:`kernel_distance` (one minus a cosine) is second
    order in the rotation and falls faster.
    """
    return _fro(k - k0) / _fro(k0)


def kernel_alignment(k: Tensor, y: Tensor) -> Tensor:
    """⟨K, YYᵀ⟩_F / (‖K‖_F ‖YYᵀ‖_F) per member; y (E, P, k_out). For k_out = 1 the
    denominator is ‖K‖_F ‖y‖²."""
    target = _gram(y)
    inner = (k * target).reshape(k.shape[0], -1).sum(1)
    return inner / (_fro(k) * _fro(target))


def extreme_eigenvalues(k: Tensor) -> tuple[Tensor, Tensor]:
    """Smallest and largest eigenvalue of each symmetric (E, P, P) kernel; NaN for a
    member whose kernel is not finite (it does not stop the others)."""
    ok = torch.isfinite(k).reshape(k.shape[0], -1).all(1)
    safe = torch.where(ok.view(-1, 1, 1), k, torch.zeros((), dtype=k.dtype, device=k.device))
    ev = torch.linalg.eigvalsh(safe)
    nan = torch.full_like(ev[:, 0], float("nan"))
    return torch.where(ok, ev[:, 0], nan), torch.where(ok, ev[:, -1], nan)
