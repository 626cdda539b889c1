"""Fully connected nets as vectorized ensembles, with a hand-written backward pass.

Every tensor carries a leading ensemble axis ``E``: weights of layer ``l`` are
``(E, fan_out, fan_in)``, biases ``(E, fan_out)``, inputs ``(E, n, d)``. One
batched matmul advances all members, and members never mix (bmm is
block-diagonal over ``E``), so a member that blows up cannot affect the others.

Layer ``l`` (1-based) computes ``z_l = c_l · h_{l-1} W_lᵀ + b_l`` and
``h_l = φ(z_l)`` (no φ on the last layer). The forward multipliers ``c_l``
and the init std per parameterization, for fan-in ``n_{l-1}``:

=============  ========================  ===========================
name           init std of W_l entries   c_l
=============  ========================  ===========================
standard       g / √n_{l-1}              1
ntk            g                         1/√n_{l-1}
mean_field     g                         1/√n_{l-1}, last layer 1/n_{L-1}
=============  ========================  ===========================

with ``g = init_scale`` (per member). Biases start at zero, so a small init is a
small neighbourhood of the saddle at the origin.

The backward pass is written out (see :func:`loss_and_grads`) rather than
taken from autograd: it avoids building a graph every step and is checked
against autograd in the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.spec import ModelConfig

#: Activations that are positively homogeneous of degree 1 (balance is conserved per neuron).
HOMOGENEOUS = frozenset({"linear", "relu", "leaky_relu"})


@dataclass
class Params:
    """Parameters of an ensemble. ``weights[l-1]``: (E, n_l, n_{l-1}); ``biases`` likewise (E, n_l)."""

    weights: list[Tensor]
    biases: list[Tensor] | None

    def tensors(self) -> list[Tensor]:
        return self.weights + (self.biases or [])

    def clone(self) -> Params:
        return Params(
            [w.clone() for w in self.weights],
            None if self.biases is None else [b.clone() for b in self.biases],
        )

    def sq_norm(self) -> Tensor:
        """‖θ‖² per member, shape (E,)."""
        return sum(t.reshape(t.shape[0], -1).square().sum(1) for t in self.tensors())


@dataclass
class Forward:
    """Cached forward pass: ``pre[l-1]`` = z_l (E, n, n_l); ``post[l]`` = h_l, post[0] = x."""

    pre: list[Tensor]
    post: list[Tensor]

    @property
    def output(self) -> Tensor:
        return self.pre[-1]


class EnsembleMLP:
    """The architecture shared by every member of a chunk (shapes and code paths).

    ``leaky_slope`` may differ per member: a tensor of shape (E,) or a float.
    """

    def __init__(
        self,
        config: ModelConfig,
        input_dim: int,
        output_dim: int,
        leaky_slope: Tensor | float | None = None,
    ) -> None:
        self.config = config
        self.depth = config.depth
        self.dims = [input_dim] + [config.width] * (config.depth - 1) + [output_dim]
        self.activation = config.activation
        slope = config.leaky_slope if leaky_slope is None else leaky_slope
        self._slope = slope.reshape(-1, 1, 1) if isinstance(slope, Tensor) else slope
        self.multipliers = [self._multiplier(l) for l in range(1, self.depth + 1)]

    def _multiplier(self, layer: int) -> float:
        fan_in = self.dims[layer - 1]
        p = self.config.parameterization
        if p == "standard":
            return 1.0
        if p == "mean_field" and layer == self.depth and self.depth > 1:
            return 1.0 / fan_in
        return 1.0 / math.sqrt(fan_in)

    def base_std(self, layer: int) -> float:
        """Init std of the entries of W_layer for init_scale 1 (init_norm ``fan_in``)."""
        if self.config.parameterization == "standard":
            return 1.0 / math.sqrt(self.dims[layer - 1])
        return 1.0

    # -- activations -----------------------------------------------------------------
    def phi(self, z: Tensor) -> Tensor:
        a = self.activation
        if a == "linear":
            return z
        if a == "relu":
            return torch.relu(z)
        if a == "leaky_relu":
            return torch.where(z > 0, z, z * self._slope)
        return torch.tanh(z)

    def phi_prime(self, z: Tensor, h: Tensor) -> Tensor | None:
        """φ'(z) given z and h = φ(z); None for the identity."""
        a = self.activation
        if a == "linear":
            return None
        if a == "relu":
            return (z > 0).to(z.dtype)
        if a == "leaky_relu":
            one = torch.ones((), dtype=z.dtype, device=z.device)
            return torch.where(z > 0, one, self._slope * one)
        return 1.0 - h * h

    # -- forward / backward ----------------------------------------------------------
    def forward(self, params: Params, x: Tensor) -> Forward:
        """x: (E, n, n_0) → cached pre- and post-activations; output (E, n, n_L)."""
        pre: list[Tensor] = []
        post = [x]
        h = x
        for l, (w, c) in enumerate(zip(params.weights, self.multipliers)):
            if params.biases is not None:
                z = torch.baddbmm(params.biases[l].unsqueeze(1), h, w.transpose(1, 2), alpha=c)
            else:
                z = torch.bmm(h, w.transpose(1, 2))
                if c != 1.0:
                    z = z.mul_(c)
            pre.append(z)
            if l < self.depth - 1:
                h = self.phi(z)
                post.append(h)
        return Forward(pre, post)

    def __call__(self, params: Params, x: Tensor) -> Tensor:
        return self.forward(params, x).output

    def backward(self, params: Params, fwd: Forward, grad_out: Tensor) -> Params:
        """Gradients of Σ_members ⟨grad_out, f⟩ w.r.t. every parameter (member-wise).

        grad_out: (E, n, n_L) = ∂L/∂f. Returns Params of the same shapes as ``params``.
        """
        gw: list[Tensor] = [None] * self.depth  # type: ignore[list-item]
        gb: list[Tensor] | None = None if params.biases is None else [None] * self.depth  # type: ignore[list-item]
        delta = grad_out  # ∂L/∂z_l
        for l in range(self.depth - 1, -1, -1):
            c = self.multipliers[l]
            gw[l] = torch.bmm(delta.transpose(1, 2), fwd.post[l])
            if c != 1.0:
                gw[l].mul_(c)
            if gb is not None:
                gb[l] = delta.sum(1)
            if l > 0:
                back = torch.bmm(delta, params.weights[l])
                if c != 1.0:
                    back.mul_(c)
                d = self.phi_prime(fwd.pre[l - 1], fwd.post[l])
                delta = back if d is None else back.mul_(d)
        return Params(gw, gb)


def mse_loss(output: Tensor, y: Tensor) -> Tensor:
    """L = 1/(2n) Σ_i ‖f(x_i) − y_i‖² per member: (E, n, k) → (E,)."""
    return 0.5 * (output - y).square().sum((1, 2)) / output.shape[1]


def loss_and_grads(
    net: EnsembleMLP, params: Params, x: Tensor, y: Tensor
) -> tuple[Tensor, Params, Tensor]:
    """Per-member loss (E,), its gradients, and the outputs (E, n, k)."""
    fwd = net.forward(params, x)
    out = fwd.output
    resid = out - y
    loss = 0.5 * resid.square().sum((1, 2)) / x.shape[1]
    grads = net.backward(params, fwd, resid.div_(x.shape[1]))
    return loss, grads, out
