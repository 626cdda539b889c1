"""The largest singular values of many matrices at once by block subspace iteration: a
fixed number of batched matmuls, the accelerator's path for the layer spectra.

Why: on CUDA, ``torch.linalg.svdvals`` runs one cuSOLVER call per matrix above 32 × 32
(about 10 ms for a 256 × 256 layer on an H200): hours for the layers of a chunk. The
layer metrics keep only the ``k`` largest singular values (``metrics.top_k``, 5 by
default) and the largest one (for the stable rank).

Method: two-sided block subspace iteration on W itself (m × n, m the shorter side; no
Gram, whose forming would square the condition): from b = :func:`block_size` random
vectors U (32 for k ≤ 24), :data:`ITERATIONS` times V ← orth(WᵀU), U ← orth(WV), each
orth by shifted Cholesky QR (:func:`_orthonormalise`: b × b Choleskys and triangular
solves, batched, defined for rank-deficient blocks). The estimates are the singular
values of the b × b matrix UᵀWV (Rayleigh-Ritz), by ``svdvals``, which cuSOLVER batches
up to 32 × 32. Where m ≤ b the block is the whole row space: the values are those of
W·orth(Wᵀ), an m × m matrix.

Accuracy: Ritz values never exceed the true ones; σᵢ converges like
(σ_{b+1}/σᵢ)^{2·ITERATIONS}. With b = 32 and 48 iterations the top 5 singular values of
256 × 256 Gaussian matrices (the flattest spectra a layer has: those at initialisation)
come within 3e-15·σ₁ of LAPACK's (b = 16 would need about 128 iterations); values near
0 (those of W − W(0) early in training, or beyond the rank) within a few ε·σ₁, as
LAPACK's. A spectrum whose values k and b + 1 differ by less than about 0.5 % would
converge more slowly. ``tests/test_matmul_spectra.py`` checks the bound 4·m·ε·σ₁
against LAPACK on Gaussian, low-rank-plus-noise, rank-deficient, rectangular,
orthogonal and zero layers and on the shipped sweeps' layers.

Cost: per iteration 4·m·n·b flops (two products) and a few b × b operations: 48
iterations at b = 32, m = n = 256 cost about 6·m²·n, three m × m Gram products' worth.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: Products with W and Wᵀ (see the module docstring for the accuracy they buy).
ITERATIONS = 48

#: Block size: cuSOLVER batches singular value problems up to 32 × 32.
BLOCK = 32

#: Fewest vectors in the block beyond the k values wanted (for k > BLOCK - OVERSAMPLE):
#: the convergence rate of value i is set by σ_{b+1} / σ_i.
OVERSAMPLE = 8

#: Most matrices per batched solver call (cuSOLVER's batched symmetric eigensolver failed
#: on 65,536 matrices of 32 × 32 at once on an H200; blocks of this size ran).
SOLVER_BATCH = 8192


def block_size(m: int, k: int) -> int:
    """Vectors in the block for the k largest singular values of matrices with shorter
    side m."""
    return min(m, max(BLOCK, k + OVERSAMPLE))


def _orthonormalise(v: Tensor) -> Tensor:
    """The columns of ``v`` (E, m, b) made orthonormal by shifted Cholesky QR, twice: R =
    chol(VᵀV + sI), V ← V R⁻¹. The first shift, 11(mb + b²)·ε·max‖vᵢ‖², lets the Cholesky
    factor exist for any V, rank-deficient included (Fukaya et al., SIAM J. Sci. Comput.
    2020); it leaves VᵀV = I − O(s), which the second pass, shifted only by 4m·ε, makes
    I − O(mε); the columns are then scaled to unit norm, which takes that last O(mε) off
    (to second order). Columns that a rank-deficient V cannot fill stay near zero (they add
    values near 0, not spurious ones).

    V is first scaled to its largest entry (:func:`by_largest`), so that max‖vᵢ‖² ∈ [1/4, m]
    and every shift is a normal number: a shift of zero or a subnormal, as a zero V
    (W − W(0) at the first step) would get, makes LAPACK's Cholesky return NaN."""
    eps = torch.finfo(v.dtype).eps
    eye = torch.eye(v.shape[2], dtype=v.dtype, device=v.device)
    m, b = v.shape[1:]
    v = by_largest(v)[0]
    for shift in (11 * (m * b + b * b) * eps, 4 * m * eps):
        gram = v.mT @ v
        scale = gram.diagonal(dim1=1, dim2=2).amax(1)
        scale = torch.where(scale > 0, scale, 1.0)  # 1 for a zero V
        r = torch.linalg.cholesky_ex(gram + (shift * scale).view(-1, 1, 1) * eye)[0]
        v = torch.linalg.solve_triangular(r.mT, v, upper=True, left=False)
    norms = torch.linalg.vector_norm(v, dim=1, keepdim=True)
    return v / torch.where(norms > 0.5, norms, 1.0)


def power_of_two_above(x: Tensor) -> Tensor:
    """2^e for each x ∈ [2^(e−1), 2^e) (1 where x is 0): a divisor that rounds nothing."""
    return torch.ldexp(torch.ones_like(x), torch.frexp(x).exponent)


def by_largest(a: Tensor) -> tuple[Tensor, Tensor]:
    """Each member of ``a`` (E, …) divided by the power of two at or just above its largest
    |entry| (:func:`power_of_two_above`: 1 where it is zero), and those divisors (E,).
    Singular values and eigenvalues scale with it, exactly; with the largest entry in
    [1/2, 1), the squares and products that set them cannot underflow, where those of
    entries below about 1e-19 (float32; 1e-154 in float64) would lose their precision, or
    vanish on a device that flushes subnormals to zero (as a GPU may). Cost: two passes
    over ``a`` and one new tensor, the result (the largest |entry| is reduced without an
    |a| temporary)."""
    largest = power_of_two_above(torch.linalg.vector_norm(a, math.inf, tuple(range(1, a.dim()))))
    return a / largest.view(-1, *[1] * (a.dim() - 1)), largest


def _svdvals(a: Tensor) -> Tensor:
    """``torch.linalg.svdvals`` of (E, b, b) matrices in batches of :data:`SOLVER_BATCH`."""
    return torch.cat([torch.linalg.svdvals(part) for part in a.split(SOLVER_BATCH)])


def top_singular_values(
    w: Tensor, k: int, generator: torch.Generator | None = None, finite: Tensor | None = None
) -> Tensor:
    """The k largest singular values (E, min(k, m)) of each (E, rows, cols) ``w``,
    descending, m = min(rows, cols) (module docstring for the accuracy). ``generator``: the
    random start block's (default: a fixed seed, so that a chunk's values do not depend on
    the global random state). ``finite``: (E,) bool, the members whose entries are all
    finite (default: all must be); the others are read as zero matrices (values 0), zeroed
    in the scaled copy that the method makes anyway, not in a masked copy of ``w`` (at
    width 256 a copy is 0.5 MB per member and matrix)."""
    w, largest = by_largest(w)
    if finite is not None:
        w.masked_fill_(~finite.view(-1, 1, 1), 0.0)
        # their divisor is 2 to frexp's exponent of inf or NaN: 0 on the CPU, unspecified
        # for NaN in CUDA's frexp (a huge one would turn the values 0 · 2^e into NaN)
        largest = largest.masked_fill(~finite, 1.0)
    E, rows, cols = w.shape
    if rows > cols:
        w = w.mT  # (E, m, n): the shorter side first
    m = w.shape[1]
    b = block_size(m, k)
    if b == m:  # the block is the whole space: the values of the m × n matrix itself
        values = _svdvals(w @ _orthonormalise(w.mT)) if w.shape[2] > m else _svdvals(w)
    else:
        if generator is None:
            generator = torch.Generator(device=w.device).manual_seed(0)
        u = torch.randn(E, m, b, dtype=w.dtype, device=w.device, generator=generator)
        u = _orthonormalise(u)
        for _ in range(ITERATIONS):
            v = _orthonormalise(w.mT @ u)  # (E, n, b)
            u = _orthonormalise(w @ v)  # (E, m, b)
        values = _svdvals(u.mT @ w @ v)
    return values[:, : min(k, m)] * largest.unsqueeze(1)
