"""The empirical neural tangent kernel of an ensemble, by layerwise formula.

For a member with parameters θ and outputs f(x) ∈ R^k the (trace) NTK on inputs
x, x′ is

    K(x, x′) = Σ_o Σ_θ ∂f_o(x)/∂θ · ∂f_o(x′)/∂θ

(for k = 1 the usual scalar NTK; for k > 1 the trace of the k×k kernel
matrix). With layer ``l`` computing ``z_l = c_l · W_l h_{l−1} + b_l`` (see
:mod:`pipeline.train._models`), ∂f_o/∂W_l[j, i] = c_l δ^o_l[j] h_{l−1}[i] with
δ^o_l = ∂f_o/∂z_l, so the Jacobian never needs to be materialised:

    K = Σ_l  D_l ∘ (c_l² H_{l−1} H_{l−1}ᵀ + [bias] 1 1ᵀ),   D_l = Σ_o Δ^o_l Δ^o_lᵀ,

with H_{l−1} the (P, n_{l−1}) post-activations and Δ^o_l the (P, n_l)
sensitivities of the P inputs. Everything is batched over the ensemble (bmm);
the cost per layer is O(E·P²·n_l) plus one backward pass per output, memory
O(E·P·(P + n_l)).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from phasesweep.pipeline.train._models import EnsembleMLP, Forward, Params
from phasesweep.pipeline.train.metrics import _decay, _squaring
from phasesweep.pipeline.train.metrics._subspace import power_of_two_above
from torch import Tensor


def _gram(a: Tensor) -> Tensor:
    return torch.bmm(a, a.transpose(1, 2))


def sensitivities(net: EnsembleMLP, params: Params, fwd: Forward) -> Iterator[list[Tensor]]:
    """For each output o, the list ``[δ^o_1, …, δ^o_L]`` of ∂f_o/∂z_l, each (E, n, n_l).

    δ^o_L is e_o on every row (a broadcast view), so δ^o_{L−1} = c_L W_L[o] ⊙ φ′ needs no
    matmul. A generator over outputs: one output's sensitivities are held at a time.
    """
    E, n, k = fwd.output.shape
    L = net.depth
    for o in range(k):
        top = fwd.output.new_zeros(1, 1, k)
        top[..., o] = 1.0
        out = [top.expand(E, n, k)]
        back = params.weights[L - 1][:, o : o + 1] * net.multipliers[L - 1]  # (E, 1, n_{L−1})
        for l in range(L - 1, 0, -1):
            delta = net.act.grad(back, fwd.pre[l - 1], fwd.post[l], net.slope)  # (E, n, n_l)
            out.append(delta)
            if l > 1:
                back = torch.bmm(delta, params.weights[l - 1])
                c = net.multipliers[l - 1]
                if c != 1.0:
                    back.mul_(c)
        yield out[::-1]


def layer_inner(net: EnsembleMLP, h: Tensor, layer: int, bias: bool) -> Tensor:
    """c_l² H Hᵀ (+ 1 1ᵀ with biases): the inner product of layer ``layer``'s inputs
    (0-based) that the NTK's layer term multiplies, from its inputs h (E, P, n_{l−1}):
    (E, P, P). For the first layer h is the data, so this term never changes in
    training: :class:`pipeline.train.metrics._metrics.MetricRecorder` computes it once
    (``input_gram`` of :func:`empirical_ntk`), which saves a P × P × d gram per logged
    step (the largest of them for d = 784)."""
    c2 = net.multipliers[layer] ** 2
    if bias:  # the bias adds 1 to the inner product of inputs
        return torch.baddbmm(h.new_ones(()).expand(1, 1, 1), h, h.transpose(1, 2), alpha=c2)
    return _gram(h).mul_(c2)


def empirical_ntk(
    net: EnsembleMLP,
    params: Params,
    x: Tensor,
    per_layer: bool = False,
    fwd: Forward | None = None,
    input_gram: Tensor | None = None,
) -> Tensor:
    """The empirical (trace) NTK of every member on inputs x (E, P, d).

    Returns (E, P, P), or (E, L, P, P) with ``per_layer`` (layer l's weights and
    bias together; the sum over layers is the full kernel). ``fwd``: a cached
    forward pass of ``params`` on ``x``; ``input_gram``: the first layer's
    :func:`layer_inner` of x, cached (read, never written).

    The top layer's D_L is k·11ᵀ (every δ^o_L is e_o), so its term is k times the
    inner gram and costs no gram of sensitivities; the terms are accumulated in place.
    """
    fwd = net.forward(params, x) if fwd is None else fwd
    L, k = net.depth, fwd.output.shape[2]
    d_sum: list[Tensor | None] = [None] * (L - 1)
    for deltas in sensitivities(net, params, fwd):
        for l, delta in enumerate(deltas[:-1]):
            if d_sum[l] is None:
                d_sum[l] = _gram(delta)
            else:
                d_sum[l].baddbmm_(delta, delta.transpose(1, 2))
    terms: list[Tensor] = []
    kernel: Tensor | None = None
    bias = params.biases is not None
    for l in range(L):
        if l == 0 and input_gram is not None:  # a copy: the terms are built in place
            inner = input_gram.clone()
        else:
            inner = layer_inner(net, fwd.post[l], l, bias)
        d = d_sum[l] if l < L - 1 else None
        if per_layer:
            terms.append(inner.mul_(k) if d is None else inner.mul_(d))
        elif kernel is None:
            kernel = inner.mul_(k) if d is None else inner.mul_(d)
        elif d is None:
            kernel.add_(inner, alpha=k)
        else:
            kernel.addcmul_(inner, d)
    if per_layer:
        return torch.stack(terms, 1)
    return kernel


def frobenius(a: Tensor) -> Tensor:
    """‖a_e‖_F of each member's (…) block: (E, …) → (E,)."""
    return a.reshape(a.shape[0], -1).norm(dim=1)


class Scaled(NamedTuple):
    """A positive semidefinite kernel K (E, P, P) as ``unit`` · ``scale``: ``scale`` (E,) the
    power of two at or just above K's largest diagonal entry (1 for a zero kernel), so that
    every |unit_ij| ≤ 1 (|K_ij| ≤ max_i K_ii), and ``norm`` = ‖unit‖_F (E,).

    Why: the kernel's scalars (:func:`kernel_distance`, :func:`kernel_rel_change`,
    :func:`kernel_alignment`) are formed from squares and products of its entries, which
    underflow for a float32 NTK at a small init (entries below about 1e-19; the norm came
    out 0 and the alignment inf) and overflow for a large one. A division by a power of two
    is exact, so where K's own squares neither underflow nor overflow the scalars are those
    of K bit for bit. Cost: one pass over K and its diagonal; memory one kernel."""

    unit: Tensor
    scale: Tensor
    norm: Tensor


def scaled(k: Tensor) -> Scaled:
    """``k`` (E, P, P), positive semidefinite, as a :class:`Scaled` kernel."""
    scale = power_of_two_above(k.diagonal(dim1=1, dim2=2).amax(1))
    unit = k / scale.view(-1, 1, 1)
    return Scaled(unit, scale, frobenius(unit))


def kernel_distance(k: Scaled, k0: Scaled) -> Tensor:
    """1 − ⟨K, K0⟩_F / (‖K‖_F ‖K0‖_F) per member: (E,); NaN for a zero kernel.

    Clamped at 0 (a cosine one ulp above 1 would give −1e-16)."""
    inner = (k.unit * k0.unit).reshape(k.unit.shape[0], -1).sum(1)
    return (1.0 - inner / (k.norm * k0.norm)).clamp_(min=0.0)


def kernel_rel_change(k: Scaled, k0: Scaled) -> Tensor:
    """‖K − K0‖_F / ‖K0‖_F per member: (E,).

    First order in the kernel's movement, so in the lazy regime it shrinks like
    m^-1/2 with the width; :func:`kernel_distance` (one minus a cosine) is second
    order in the rotation and falls faster. (The difference is formed, not expanded as
    ‖K‖² + ‖K0‖² − 2⟨K, K0⟩, which cancels where K stays near K0.) It is formed over the
    larger of the two scales s, as (K − K0)/s, whose entries are at most 2 in size.
    """
    s = torch.maximum(k.scale, k0.scale)
    diff = k.unit * (k.scale / s).view(-1, 1, 1)
    diff.addcmul_(k0.unit, (-k0.scale / s).view(-1, 1, 1))
    return frobenius(diff) * (s / k0.scale) / k0.norm


def kernel_alignment(k: Scaled, y: Tensor, yy_norm: Tensor) -> Tensor:
    """⟨K, YYᵀ⟩_F / (‖K‖_F ‖YYᵀ‖_F) per member; y (E, P, k_out), ``yy_norm`` = ‖YYᵀ‖_F
    (:func:`target_norm`) (E,). The inner product as the quadratic form Σ_o y_oᵀ K y_o: no
    P × P target is formed."""
    inner = (y * torch.bmm(k.unit, y)).reshape(k.unit.shape[0], -1).sum(1)
    return inner / (k.norm * yy_norm)


def target_norm(y: Tensor) -> Tensor:
    """‖YYᵀ‖_F = ‖YᵀY‖_F per member, y (E, P, k_out): (E,) (‖y‖² for one output)."""
    return frobenius(torch.bmm(y.mT, y))


def extreme_eigenvalues(k: Tensor, accelerated: bool = False) -> tuple[Tensor, Tensor]:
    """Smallest and largest eigenvalue of each symmetric (E, P, P) kernel; NaN for a
    member whose kernel is not finite (it does not stop the others).

    LAPACK: a finite total means every entry is finite (NaN and ±inf propagate through a
    sum), so the usual case costs one reduction and one host read, not a mask and a
    masked copy. ``accelerated``: by repeated squaring
    (:func:`pipeline.train.metrics._squaring.extreme_eigenvalues`: batched matmuls, within a
    small multiple of P·ε·‖K‖_F as LAPACK), always masked (no host read)."""
    if not accelerated and bool(torch.isfinite(k.sum()).item()):
        ev = torch.linalg.eigvalsh(k)
        return ev[:, 0], ev[:, -1]
    ok = torch.isfinite(k).reshape(k.shape[0], -1).all(1)
    safe = torch.where(ok.view(-1, 1, 1), k, torch.zeros((), dtype=k.dtype, device=k.device))
    if accelerated:
        low, high = _squaring.extreme_eigenvalues(safe)
    else:
        ev = torch.linalg.eigvalsh(safe)
        low, high = ev[:, 0], ev[:, -1]
    nan = torch.full_like(low, float("nan"))
    return torch.where(ok, low, nan), torch.where(ok, high, nan)


class KernelFlow:
    """The linearized model at θ(0) trained by gradient flow, in closed form.

    With the loss ``1/(2n) Σ (f − y)²`` (one output) the linearization
    ``f_lin(θ) = f_0 + J_0 (θ − θ_0)`` evolves by ``df/dt = −(1/n) K r``, ``r = f_X − y``,
    K = J_0 J_0ᵀ the NTK at init on the n training points X, so

        r(t)        = e^{−tK/n} r(0)
        f_lin(x, t) = f_0(x) − (1/n) K_xX ∫₀ᵗ r(s) ds.

    LAPACK: with K = V Λ Vᵀ and a = Vᵀ r(0), ∫₀ᵗ r = V diag(n(1 − e^{−tλ/n})/λ) a (t where
    λ = 0; λ < 0 from round-off is taken as 0): one eigendecomposition per chunk, then
    O(E·P·n) per call. ``accelerated``: by scaling and squaring
    (:func:`pipeline.train.metrics._decay.integrals`: batched matmuls, no
    eigendecomposition), at each call's time, or, given the trainer's ``clock`` ahead
    (E, J) (:meth:`pipeline.train._optim.Schedule.clock`), at the clock's times in blocks
    of n + 1 logged steps: one call per block instead of one per step (at 20 logged steps,
    1/15 of the matmuls and one host read instead of 20), its probe outputs kept until
    the next block's. Built once per chunk from the kernel on [X; P] (P the probe
    inputs); members ``(E, …)`` throughout.
    """

    def __init__(
        self,
        k_all: Tensor,
        f0: Tensor,
        y_train: Tensor,
        accelerated: bool = False,
        clock: Tensor | None = None,
    ) -> None:
        """``k_all`` (E, n + P, n + P): the NTK at init on [X; P]; ``f0`` (E, n + P, 1) the
        outputs at init there; ``y_train`` (E, n, 1); ``clock`` (E, J): the times of the
        logged steps, ascending (read on the accelerated path only)."""
        n = y_train.shape[1]
        self.n = n
        self.accelerated = accelerated
        k_xx = k_all[:, :n, :n]
        r0 = f0[:, :n] - y_train
        self.f0_probe = f0[:, n:]
        if accelerated:
            self.a = k_xx / n  # (E, n, n)
            self.a_norm = torch.linalg.vector_norm(self.a, dim=(1, 2))
            self.kx = k_all[:, n:, :n]  # (E, P, n)
            self.r0 = r0
            self.clock = clock
            #: (first column, probe outputs (E, P, ≤ n + 1)) of the clock's current block
            self._block: tuple[int, Tensor] | None = None
            return
        lam, v = torch.linalg.eigh(k_xx)
        self.lam = lam.clamp(min=0.0)
        self.kx_v = torch.bmm(k_all[:, n:, :n], v)  # (E, P, n)
        self.coef = torch.bmm(v.transpose(1, 2), r0)  # (E, n, 1)

    def probe_outputs(self, t: Tensor, column: int | None = None) -> Tensor:
        """f_lin at gradient-flow times ``t`` (E,) on the probe inputs: (E, P, 1).
        ``column``: the logged step's column of the clock, whose times are then used (equal
        to ``t`` while a member lives) if the flow was given one."""
        if not self.accelerated:
            x = t.unsqueeze(1) * self.lam / self.n  # (E, n): tλ/n
            safe = torch.where(self.lam > 0, self.lam, torch.ones_like(self.lam))
            gain = torch.where(self.lam > 0, -torch.expm1(-x) / safe, t.unsqueeze(1) / self.n)
            return self.f0_probe - torch.bmm(self.kx_v, gain.unsqueeze(2) * self.coef)
        if self.clock is None or column is None:
            return self._probe_at(t.unsqueeze(1))
        first = column - column % (self.n + 1)
        if self._block is None or self._block[0] != first:
            self._block = (first, self._probe_at(self.clock[:, first : first + self.n + 1]))
        return self._block[1][:, :, column - first, None]

    def _probe_at(self, times: Tensor) -> Tensor:
        """f_lin on the probe inputs at ``times`` (E, J): (E, P, J)."""
        integral = _decay.integrals(self.a, self.a_norm, times, self.r0)
        return self.f0_probe - torch.bmm(self.kx, integral) / self.n
