"""Gradient flow of a linear model in closed form without an eigendecomposition:
∫₀ᵗ exp(−sA)·r ds at many times t for a whole ensemble by scaling and squaring, the
accelerator's path for the kernel predictor.

Why: the predictor (:class:`pipeline.train.metrics._ntk.KernelFlow`) needs, at each logged
time t, the integral of the residual r(t) = exp(−tA) r(0) of the linearized model, with
A = K/n the scaled NTK on the training set. With LAPACK one eigendecomposition per chunk
gives every t for O(n) each; on CUDA that decomposition is one cuSOLVER call per member
above 32 × 32. Here a call is a fixed sequence of batched matmuls, and one call serves
a block of times: those of many logged steps, when the trainer's clock is known ahead
(:meth:`pipeline.train._optim.Schedule.clock`).

Method: the generator M = [[−A, r], [0, 0]] ((n + 1) × (n + 1)) has
exp(τM) e = [∫₀^τ exp(−sA) r ds; 1] with e the last unit vector, and exp(aM) exp(bM) =
exp((a + b)M). With S halvings so that h = max_j t_j / 2^S makes ‖hA‖_F ≤ :data:`THETA`
for every member, each time is t_j = h·(N_j + f_j) with an integer N_j ≤ 2^S and
f_j ∈ [0, 1): Z₀ = exp(hM) by its Taylor polynomial (Horner, degree q = :data:`DEGREE`),
Z_{s+1} = Z_s² (S squarings), and exp(t_j M) e = Π_{bits s of N_j} Z_s · exp(f_j h M) e,
the last factor by the same Taylor polynomial applied to the vectors. The block of
vectors is multiplied by Z_s at every level, and a vector keeps the product where its
bit s is set. With one time (N = 2^S, f = 0) this is the usual scaling and squaring.

Accuracy: the Taylor remainder of the integral is below THETA^q/(q + 1)! ≈ 5e-17
relative (of exp(−hA), below THETA^{q+1}/(q + 1)!); A is positive semidefinite up to
round-off, so ‖exp(−sA)‖ ≤ 1 and each squaring or product adds about n·ε to the error,
while an error δ of Z_s along an eigenvalue near 0 grows to 2^{S−s}·δ ≈ t‖A‖·ε. The
integrals are within a small multiple of (S·n + t‖A‖_F)·ε·t‖r‖ of the exact ones: the
problem's own condition, as an eigendecomposition's error ε‖A‖ in λ moves e^{−tλ} by up
to t·ε‖A‖ too (``tests/test_matmul_spectra.py`` checks it against the eigendecomposition).

Cost per call: q + S batched (n + 1)² matmuls, and q + S + 1 products of them with the
block of J vectors (J ≤ n + 1 costs at most as many matmuls again): at J = 20 logged
steps about 1/15 of one call per step. One host read (the largest t‖A‖_F, for S).
Memory: four (n + 1) × max(n + 1, J) matrices per member.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: Largest ‖hA‖_F of the Taylor step.
THETA = 0.5

#: Degree of the Taylor polynomial of exp(hM): THETA^DEGREE/(DEGREE + 1)! < ε/4.
DEGREE = 14


def halvings(bound: float) -> int:
    """Halvings S of the time so that ``bound``/2^S ≤ :data:`THETA` (``bound`` ≥ t‖A‖_F)."""
    if not bound > THETA:  # NaN included: such members are NaN whatever S is
        return 0
    return math.ceil(math.log2(bound / THETA))


def integrals(a: Tensor, norm: Tensor, times: Tensor, r: Tensor) -> Tensor:
    """∫₀^{t_j} exp(−sA) ds · r (E, n, J) for positive semidefinite A (E, n, n), its
    Frobenius norms ``norm`` (E,), ``times`` (E, J) ≥ 0 and vectors ``r`` (E, n, 1)."""
    E, n, _ = a.shape
    span = times.amax(1)  # (E,)
    s = halvings(float((span * norm).max()))
    h = span / 2**s
    whole = (times / torch.where(h > 0, h, 1.0).unsqueeze(1)).clamp_max(2**s)  # 0 where h = 0
    floor = whole.floor()
    frac, bits = whole - floor, floor.to(torch.int64)
    m = a.new_zeros(E, n + 1, n + 1)
    m[:, :n, :n] = -a
    m[:, :n, n:] = r
    e = a.new_zeros(E, n + 1, times.shape[1])
    e[:, n] = 1.0
    w = _taylor(m, e, (frac * h.unsqueeze(1)).unsqueeze(1))  # exp(f_j h M) e
    z = _taylor(m * h.view(E, 1, 1), torch.eye(n + 1, dtype=a.dtype, device=a.device))  # Z₀
    for level in range(s + 1):
        w = torch.where((bits >> level & 1).bool().unsqueeze(1), torch.bmm(z, w), w)
        if level < s:
            z = torch.bmm(z, z)
    return w[:, :n]


def _taylor(m: Tensor, v: Tensor, scale: Tensor | float = 1.0) -> Tensor:
    """Σ_{i ≤ q} (scale·m)^i v / i! by Horner: exp(scale·m)·v for ‖scale·m‖ ≤ THETA
    (``scale`` broadcast over v's columns)."""
    out = v
    for i in range(DEGREE, 0, -1):
        out = torch.matmul(m, out * (scale / i)) + v
    return out
