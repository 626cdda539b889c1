"""The smallest and largest eigenvalues of symmetric matrices, for a whole ensemble at
once, by repeated squaring: a fixed number of batched matmuls, the accelerator's path.

Why: on CUDA, ``torch.linalg.eigvalsh`` runs one cuSOLVER call per matrix above 32 × 32
(its batched Jacobi stops there) and reads every call's error code on the host; the
batched Cholesky that bisection would need runs about 50 times below the matmul rate
(H200, 8,192 matrices 64 × 64: ``cholesky_ex`` 0.57 TFLOP/s, ``bmm`` 26 TFLOP/s). The
NTK's extreme eigenvalues are wanted for every member at a logged step; here they cost
:func:`squarings` matmuls of the whole ensemble, whatever its size and its spectra,
and nothing is read on the host.

Method: with c = ‖K‖_F ≥ max |λ|, both M₊ = K + cI and M₋ = cI − K are positive
semidefinite with spectra in [0, 2c], and their largest eigenvalues μ are λ_max + c and
c − λ_min. B = M^N, N = 2^m, is formed by m squarings (each renormalised to trace 1:
B stays PSD, so its trace bounds its entries and cannot underflow), and the Rayleigh
quotient of M at B's column b of largest norm estimates μ. Gap-free bound: with
M = Σ μᵢ vᵢvᵢᵀ and b = B e_j, μ − bᵀMb/bᵀb = Σᵢ (μ − μᵢ) μᵢ^{2N} v_{ij}² / ‖b‖²; the
largest column has ‖b‖² ≥ ‖B‖_F²/n ≥ μ^{2N}/n and each term is at most
max_x (μ − x) x^{2N} ≤ μ^{2N+1}/(2N + 1), so the error is at most n·μ/(2N + 1) ≤ n·2c/N,
for clustered, graded and degenerate spectra alike. :func:`squarings` picks the
smallest m with n·2/N ≤ ε: about 58 for n = 64, 61 for n = 512.

Accuracy: the quotient of the computed b is evaluated with M itself, so round-off in
the squarings only perturbs the vector (second order in the quotient); the results are
within a small multiple of n·ε·‖K‖_F of LAPACK's, the same bound as a backward-stable
solver's (``tests/test_matmul_spectra.py`` checks it on random, graded, clustered, rank-
deficient and zero matrices, and on kernels that the shipped sweeps produce). Like
LAPACK's, the smallest eigenvalue of a kernel graded over many decades is known only to
that absolute accuracy, not relative to itself.

Cost: 2·m batched n × n matmuls for both eigenvalues of each member (2n³ flops each),
memory four n × n matrices per member.
"""

from __future__ import annotations

import math

import torch
from phasesweep.pipeline.train.metrics._subspace import by_largest
from torch import Tensor


def squarings(n: int, dtype: torch.dtype = torch.float64) -> int:
    """The squarings m whose gap-free bound 2·n·c/2^m (module docstring) is at most ε·c."""
    return max(1, math.ceil(math.log2(2 * n / torch.finfo(dtype).eps)))


def _normalise(b: Tensor) -> Tensor:
    """``b`` (E, n, n) PSD divided by its trace in place; a zero matrix stays zero."""
    trace = b.diagonal(dim1=1, dim2=2).sum(-1).clamp_min(torch.finfo(b.dtype).tiny)
    return b.div_(trace.view(-1, 1, 1))


def top_eigenvalue(m: Tensor) -> Tensor:
    """The largest eigenvalue (E,) of each positive semidefinite (E, n, n) ``m`` (both
    triangles read), within 2·n·ε·‖m‖ (module docstring)."""
    E, n, _ = m.shape
    b = _normalise(m.clone())
    spare = torch.empty_like(b)
    for _ in range(squarings(n, m.dtype)):
        torch.bmm(b, b, out=spare)
        b, spare = _normalise(spare), b
    column = b.square().sum(1).argmax(1)  # (E,): the column of largest norm
    v = b.gather(2, column.view(E, 1, 1).expand(E, n, 1))  # (E, n, 1)
    mv = torch.bmm(m, v)
    return (v * mv).sum((1, 2)) / v.square().sum((1, 2)).clamp_min(torch.finfo(m.dtype).tiny)


def extreme_eigenvalues(k: Tensor) -> tuple[Tensor, Tensor]:
    """The smallest and largest eigenvalues (E,), (E,) of each symmetric (E, n, n) ``k``
    (its symmetric part is read), within a small multiple of n·ε·‖k‖_F of the exact ones.
    Entries must be finite. Each k is scaled to its largest entry first
    (:func:`~pipeline.train.metrics._subspace.by_largest`): were c to underflow to 0 (a
    tiny kernel), M₋ = −K would not be semidefinite, and λ_min would come out as −λ_max."""
    k, largest = by_largest((k + k.mT) / 2)
    c = torch.linalg.vector_norm(k, dim=(1, 2)).view(-1, 1, 1)
    eye = torch.eye(k.shape[1], dtype=k.dtype, device=k.device)
    shifted = torch.cat([k + c * eye, c * eye - k])  # (2E, n, n): M₊ then M₋
    top_plus, top_minus = top_eigenvalue(shifted).chunk(2)
    c = c.view(-1)
    return (c - top_minus) * largest, (top_plus - c) * largest
