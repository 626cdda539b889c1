"""The training step of bias-free linear nets, in factored form.

A bias-free net whose activation is the identity (or any net of depth 1) is the
linear map f(x) = P x, with ``P = M_L ⋯ M_1`` (k × d) and ``M_l = c_l W_l``. For the
loss ``L = 1/(2n) Σ_i ‖f(x_i) − y_i‖²`` and residuals ``R = X Pᵀ − Y`` (n × k):

    ∂L/∂W_l = c_l S_lᵀ T_l,   S_l = M_L ⋯ M_{l+1}  (k × n_l; the identity for l = L),
                              T_l = G M_1ᵀ ⋯ M_{l−1}ᵀ (k × n_{l−1}),  G = Rᵀ X / n  (k × d).

Every factor has k rows, so a step costs about ``4·n·k·d + 6·k·W`` flops per member
(W the number of weights) where backpropagation through the n hidden activations
costs ``6·n·W``: for one output, the data enter only through two passes over X
(f = X Pᵀ and G = Rᵀ X), and the weights through rank-k products and a rank-k update.
The FLOPs fall by about n/k (hundreds of times for one output); the step then
streams the weights from memory a few times, so its time falls less (16-27× a
backpropagating numpy loop on the linear shapes of ``benchmarks/shapes.py``). The
residuals are formed explicitly, so the loss keeps full relative precision as it
falls (a loss from the covariances XᵀX and XᵀY would lose it to cancellation).

Equal to :func:`pipeline.train._models.loss_and_grads` up to round-off: the products are
associated differently, which moves results by a few ulps of the terms' sizes.
Members never mix: every product is batched over the ensemble axis or, where the
members share their input (:func:`pipeline.train._models.shares_input`), is one GEMM whose
rows (f) or columns (G) belong to one member each, so a member that is not finite
cannot reach another.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from phasesweep.pipeline.grid import step_flops
from phasesweep.pipeline.train._models import EnsembleMLP, Params, member_sq_norm, shares_input
from torch import Tensor


def factored_flops(dims: Sequence[int], n_rows: int) -> float:
    """Flops per member-step of :class:`LinearStep` (estimate; see the module docstring)."""
    k, weights = dims[-1], sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    return 4.0 * n_rows * k * dims[0] + 6.0 * k * weights


def linear_step_applies(net: EnsembleMLP, biased: bool, n_rows: int) -> bool:
    """Whether :class:`LinearStep` trains this net, and does so with fewer flops than
    backpropagation (6·n·W) on batches of ``n_rows``: the net is bias-free and linear
    (identity activation, or depth 1)."""
    if biased or not (net.act.identity or net.depth == 1):
        return False
    return factored_flops(net.dims, n_rows) < step_flops(net.dims, n_rows)


class LinearStep:
    """Loss, gradients and gradient steps of a bias-free linear ensemble (see the module
    docstring); the interface of :class:`pipeline.train._models.EnsembleStep`.

    Parameters are updated in place. Temporaries have k rows per member, so the whole
    ensemble is one block: no cache blocking is needed.
    """

    def __init__(self, net: EnsembleMLP, n_members: int) -> None:
        self.net = net
        self.E = n_members
        self._c = tuple(net.multipliers)

    def block_size(self, x: Tensor) -> int:
        """Members per block: the whole ensemble (for reports alike with EnsembleStep)."""
        return self.E

    def reset(self) -> None:
        """Nothing cached to drop (the interface of EnsembleStep)."""

    def _suffixes(self, weights: list[Tensor]) -> list[Tensor | None]:
        """S_l = M_L ⋯ M_{l+1} for l = 1 … L, each (E, k, n_l); None for the identity."""
        c, L = self._c, len(weights)
        s: list[Tensor | None] = [None] * L
        for l in range(L - 2, -1, -1):
            above = s[l + 1]
            w = weights[l + 1]
            s[l] = w * c[l + 1] if above is None else torch.bmm(above, w).mul_(c[l + 1])
        return s

    def _residual_t(self, p: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Rᵀ = P Xᵀ − Yᵀ (E, k, n), P (E, k, d)."""
        E, k = p.shape[0], p.shape[1]
        if shares_input(x):  # one GEMM: every member's rows of P against the one X
            f_t = (p.reshape(E * k, -1) @ x[0].T).view(E, k, -1)
        else:
            f_t = torch.bmm(p, x.transpose(1, 2))
        return f_t.sub_(y.transpose(1, 2))

    def _forward(
        self, params: Params, x: Tensor, y: Tensor
    ) -> tuple[list[Tensor | None], Tensor, Tensor]:
        """The suffixes S_l, the residuals Rᵀ (E, k, n) and the loss (E,) at θ."""
        w = params.weights
        s = self._suffixes(w)
        top = s[0]
        p = w[0] * self._c[0] if top is None else torch.bmm(top, w[0]).mul_(self._c[0])
        r_t = self._residual_t(p, x, y)
        loss = member_sq_norm(r_t).mul_(0.5 / x.shape[1])
        return s, r_t, loss

    def _factors(self, params: Params, x: Tensor, r_t: Tensor, scale: Tensor) -> list[Tensor]:
        """T_l (E, k, n_{l−1}) for every layer, the residual scaled per member by ``scale``
        (E,): η/n for a step, 1/n for ∇L. All from the weights as they are now."""
        E, k = r_t.shape[0], r_t.shape[1]
        r_t = r_t.mul_(scale.view(-1, 1, 1))
        if shares_input(x):  # G = Rᵀ X: one GEMM, a member's rows of Rᵀ against X
            t = (r_t.reshape(E * k, -1) @ x[0]).view(E, k, -1)
        else:
            t = torch.bmm(r_t, x)
        w, c = params.weights, self._c
        ts = [t]
        for l in range(1, len(w)):
            ts.append(torch.bmm(ts[-1], w[l - 1].transpose(1, 2)).mul_(c[l - 1]))
        return ts

    def loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        """Per-member loss (E,) at θ for inputs x (E, n, d) and targets y (E, n, k)."""
        return self._forward(params, x, y)[2]

    def loss_and_grads(
        self, params: Params, x: Tensor, y: Tensor, grads: Params | None = None
    ) -> tuple[Tensor, Params]:
        """Per-member loss (E,) and gradients at θ; ``grads``: Params to write them into."""
        s, r_t, loss = self._forward(params, x, y)
        scale = torch.full((self.E,), 1.0 / x.shape[1], dtype=r_t.dtype, device=r_t.device)
        ts = self._factors(params, x, r_t, scale)
        if grads is None:
            grads = Params([torch.empty_like(w) for w in params.weights], None)
        for l, (out, t) in enumerate(zip(grads.weights, ts)):
            if s[l] is None:
                torch.mul(t, self._c[l], out=out)
            else:
                torch.baddbmm(out, s[l].transpose(1, 2), t, beta=0.0, alpha=self._c[l], out=out)
        return loss, grads

    def step(self, params: Params, x: Tensor, y: Tensor, eta: Tensor) -> Tensor:
        """One gradient step in place, θ ← θ − η ∇L(θ), η (E,) per member; returns the
        per-member loss (E,) at θ before the update. Every factor is formed from the old
        weights before any layer moves; each layer then takes one rank-k update."""
        s, r_t, loss = self._forward(params, x, y)
        ts = self._factors(params, x, r_t, eta / x.shape[1])
        for l, (w, t) in enumerate(zip(params.weights, ts)):
            if s[l] is None:
                w.sub_(t, alpha=self._c[l])
            else:
                w.baddbmm_(s[l].transpose(1, 2), t, alpha=-self._c[l])
        return loss
