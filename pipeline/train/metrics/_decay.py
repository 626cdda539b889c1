"""Gradient flow of a linear model in closed form without an eigendecomposition:
exp(−tA)·r and ∫₀ᵗ exp(−sA)·r ds for a whole ensemble by scaling and squaring, the
accelerator's path for the kernel predictor.

Why: the predictor (:class:`pipeline.train.metrics._ntk.KernelFlow`) needs, at each logged
time t, the residual r(t) = exp(−tA) r(0) of the linearized model and its integral, with
A = K/n the scaled NTK on the training set. With LAPACK one eigendecomposition per chunk
gives every t for O(n) each; on CUDA that decomposition is one cuSOLVER call per member
above 32 × 32. Here each call is a fixed sequence of batched matmuls.

Method: with S halvings so that h = t/2^S makes ‖hA‖_F ≤ :data:`THETA` for every member,
φ(B) = Σ_{j ≤ q} B^j/(j + 1)! with B = −hA (Horner, q = :data:`DEGREE`) gives
X = exp(−hA) = I + Bφ(B) and Y = hφ(B) = ∫₀ʰ exp(−sA) ds; then S doublings
X ← X², y ← y + Xy (from y = Y r) give X = exp(−tA) and y = ∫₀ᵗ exp(−sA) ds·r, since
∫₀^{2h} = (I + exp(−hA))∫₀ʰ. Only the vector y is doubled, not Y.

Accuracy: the Taylor remainder is below THETA^{q+1}/(q + 2)! ≈ 5e-17 relative; A is
positive semidefinite up to round-off, so ‖X‖ ≤ 1 and each squaring adds about n·ε to
its error, while an error δ of X along an eigenvalue near 0 grows to 2^S·δ ≈ t‖A‖·ε.
Both results are within a small multiple of (S·n + t‖A‖_F)·ε of the exact ones,
relative to ‖r‖ and t‖r‖: the problem's own condition, as an eigendecomposition's error
ε‖A‖ in λ moves e^{−tλ} by up to t·ε‖A‖ too (``tests/test_matmul_spectra.py`` checks
both against the eigendecomposition).

Cost: q + S batched n × n matmuls and S + 2 matrix-vector products per call, S about
log2(t‖A‖_F) + 1; memory three n × n matrices per member.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: Largest ‖hA‖_F of the Taylor step.
THETA = 0.5

#: Degree of the Taylor polynomial of φ: THETA^{DEGREE+1}/(DEGREE + 2)! < ε/4.
DEGREE = 13


def halvings(bound: float) -> int:
    """Halvings S of the time so that ``bound``/2^S ≤ :data:`THETA` (``bound`` ≥ t‖A‖_F)."""
    if not bound > THETA:  # NaN included: such members are NaN whatever S is
        return 0
    return math.ceil(math.log2(bound / THETA))


def decay(a: Tensor, norm: Tensor, t: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """(exp(−tA) r, ∫₀ᵗ exp(−sA) ds · r) for positive semidefinite A (E, n, n), its
    Frobenius norms ``norm`` (E,), times ``t`` (E,) ≥ 0 and vectors ``r`` (E, n, k).

    One host read (the largest t‖A‖_F, for the number of halvings)."""
    E, n, _ = a.shape
    s = halvings(float((t * norm).max()))
    h = (t / 2**s).view(E, 1, 1)
    b = a * -h
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    phi = (eye / math.factorial(DEGREE + 1)).expand(E, n, n)
    for j in range(DEGREE - 1, -1, -1):
        phi = torch.baddbmm(eye / math.factorial(j + 1), b, phi)
    x = torch.baddbmm(eye, b, phi)  # exp(−hA)
    y = torch.bmm(phi, r) * h  # ∫₀ʰ exp(−sA) ds · r
    for _ in range(s):
        y = torch.baddbmm(y, x, y)
        x = torch.bmm(x, x)
    return torch.bmm(x, r), y
