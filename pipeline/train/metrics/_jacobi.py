"""Eigenvalues of symmetric matrices and singular values, for a whole ensemble at once, by
the cyclic Jacobi method in batched kernels.

Why: on CUDA, ``torch.linalg.eigvalsh``/``eigh``/``svdvals`` run one cuSOLVER call per
matrix above 32 × 32 (its batched Jacobi routines stop there), and check every call's
error code on the host. The metrics need the spectra of every member's kernel and layers
at a logged step: thousands of solver calls. Here every round of rotations is a handful
of kernels over the whole ensemble, whatever its size, and nothing is read on the host
but one convergence flag per sweep.

Method: the n columns (rows) are paired by a round-robin tournament (the circle method):
n − 1 rounds of n/2 disjoint pairs make a sweep, in which every pair meets once. A round
stores its pairs next to each other, so that all rotations are one batched 2 × 2 matmul,
and a gather reorders the rows for the next round; after a sweep the order is the
original one. An odd n gets a zero row and column that no rotation touches.

- :func:`eigh`: two-sided Jacobi, K ← R K Rᵀ with R the round's rotations, each of which
  zeroes the off-diagonal entry of its pair; the diagonal converges to the eigenvalues.
- :func:`svdvals`: one-sided (Hestenes) Jacobi on the rows of A (the shorter side):
  rotations make the rows orthogonal, and their norms converge to the singular values.

Accuracy: every rotation is orthogonal to working precision, so the results are backward
stable, as LAPACK's: eigenvalues and singular values within a few ulps of ‖A‖ times a
small multiple of n (``tests/test_jacobi.py`` checks them against LAPACK on random,
graded, clustered and rank-deficient matrices). A rotation is skipped where its pair is
already orthogonal to working precision (|g| ≤ √M·ε·√(|a b|)). Iteration stops after the
first sweep, from :data:`MIN_SWEEPS` on, in which no rotation moved an eigenvalue or
singular value estimate by more than n·ε‖A‖_F: Jacobi converges quadratically, but
graded spectra (eigenvalues over many decades, as kernels have) take up to about twice
the sweeps of random ones, so the count is read from the data (one host read per sweep)
rather than fixed. Members still moving after :data:`MAX_SWEEPS` get NaN (stored as
NULL), never a value that has not converged.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

#: Sweeps before the first convergence check: random matrices of order 16-256 need 6-12.
MIN_SWEEPS = 4

#: Most sweeps; members whose estimates still move after them get NaN.
MAX_SWEEPS = 40


@functools.lru_cache(maxsize=64)
def tournament(n: int) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """(N, gathers): N = n rounded up to even, and for each of the N − 1 rounds of a sweep
    the row order that the round after it needs: ``rows[gathers[r]]`` turns round r's
    order (pairs at positions 2i, 2i + 1) into round r + 1's; the last returns to the start.

    Circle method: player 0 stays, the others move one seat round a ring each round."""
    big = n + n % 2
    top, bottom = list(range(0, big, 2)), list(range(1, big, 2))
    orders = []
    for _ in range(big - 1):
        orders.append([p for pair in zip(top, bottom) for p in pair])
        ring = top[1:] + bottom[::-1]
        ring = ring[-1:] + ring[:-1]
        top = [top[0]] + ring[: big // 2 - 1]
        bottom = ring[big // 2 - 1 :][::-1]
    orders.append(orders[0])
    gathers = []
    for now, then in zip(orders[:-1], orders[1:]):
        seat = {p: i for i, p in enumerate(now)}
        gathers.append(tuple(seat[p] for p in then))
    return big, tuple(gathers)


@functools.lru_cache(maxsize=64)
def _gathers(n: int, device: torch.device) -> Tensor:
    """:func:`tournament`'s gathers as one (rounds, N) index tensor on ``device``, made
    once per order and device: a tensor built from a list is a host-to-device copy, which
    waits for the device."""
    return torch.tensor(tournament(n)[1], device=device)


def _rotation(a: Tensor, b: Tensor, g: Tensor, tol: float) -> tuple[Tensor, Tensor]:
    """The rotation (t = tan θ, and R = [[c, −s], [s, c]] as (…, 2, 2)) that zeroes g of the
    symmetric [[a, g], [g, b]] by R (·) Rᵀ; t = 0 (R = I exactly) where |g| ≤ tol·√|ab|,
    g = 0 included. The smaller of the two angles, so nothing swaps."""
    zeta = (b - a) / (2 * g)
    one = torch.ones_like(zeta)
    t = torch.copysign(one, zeta) / (zeta.abs() + torch.hypot(one, zeta))
    t = torch.where(g.abs() <= tol * (a * b).abs().sqrt(), 0.0, t)
    c = torch.rsqrt(1 + t * t)
    s = c * t
    return t, torch.stack([c, -s, s, c], -1).unflatten(-1, (2, 2))


class _Sweeps:
    """The sweep loop shared by both methods: ``round(r)`` does round r and returns the
    largest change (E,) it made to an estimate; stops as the module docstring says."""

    def __init__(self, n: int, scale: Tensor, device: torch.device) -> None:
        self.big = tournament(n)[0]
        self.gathers = _gathers(n, device)
        self.limit = n * torch.finfo(scale.dtype).eps * scale  # (E,)

    def run(self, round_) -> Tensor:
        """Sweeps until converged; returns (E,) bool: the members that converged."""
        for sweep in range(MAX_SWEEPS):
            moved = torch.zeros_like(self.limit)
            for r in range(self.big - 1):
                moved = torch.maximum(moved, round_(r, self.gathers[r]))
            still = moved > self.limit
            if sweep + 1 >= MIN_SWEEPS and not bool(still.any()):
                break
        return ~still


def eigh(k: Tensor, vectors: bool = False) -> tuple[Tensor, Tensor | None]:
    """Eigenvalues (E, n), ascending, of the symmetric (E, n, n) ``k`` (read: its upper
    and lower triangles both, as given), and with ``vectors`` the eigenvectors (E, n, n)
    as columns, as :func:`torch.linalg.eigh`. Entries must be finite."""
    E, n, _ = k.shape
    dtype, device = k.dtype, k.device
    sweeps = _Sweeps(n, torch.linalg.vector_norm(k.reshape(E, -1), dim=1), device)
    big = sweeps.big
    a = k.new_zeros(E, big, big)
    a[:, :n, :n] = k
    v = torch.eye(big, dtype=dtype, device=device).expand(E, big, big).contiguous()
    tol = math.sqrt(n) * torch.finfo(dtype).eps
    half = big // 2

    def round_(r: int, gather: Tensor) -> Tensor:
        nonlocal a, v
        pairs = a.view(E, half, 2, half, 2).diagonal(dim1=1, dim2=3)  # (E, 2, 2, half)
        t, rot = _rotation(pairs[:, 0, 0], pairs[:, 1, 1], pairs[:, 0, 1], tol)
        # |g| of the pairs rotated: what K still lacks of diagonal (and V of its vectors)
        moved = torch.where(t == 0, 0.0, pairs[:, 0, 1].abs()).amax(1)
        rows = torch.matmul(rot, a.view(E, half, 2, big))  # R K
        a = torch.matmul(rot, rows.view(E, big, big).mT.contiguous().view(E, half, 2, big))
        a = a.view(E, big, big).index_select(1, gather).index_select(2, gather)
        if vectors:  # the rows of Vᵀ rotate with the rows of K
            v = torch.matmul(rot, v.view(E, half, 2, big)).view(E, big, big)
            v = v.index_select(1, gather)
        return moved

    done = sweeps.run(round_)
    values = a.diagonal(dim1=1, dim2=2)[:, :n]
    values = torch.where(done.unsqueeze(1), values, torch.full_like(values, math.nan))
    order = values.argsort(1)
    values = values.gather(1, order)
    if not vectors:
        return values, None
    vt = v[:, :n, :n].gather(1, order.unsqueeze(2).expand(E, n, n))
    return values, vt.mT


def svdvals(a: Tensor) -> Tensor:
    """Singular values (E, min(p, q)), descending, of each (E, p, q) matrix, as
    :func:`torch.linalg.svdvals`. Entries must be finite."""
    E, p, q = a.shape
    rows, length = min(p, q), max(p, q)
    b = a if p <= q else a.mT
    scale = torch.linalg.vector_norm(a.reshape(E, -1), dim=1)
    sweeps = _Sweeps(rows, scale, a.device)
    big = sweeps.big
    x = a.new_zeros(E, big, length)
    x[:, :rows] = b
    tol = math.sqrt(length) * torch.finfo(a.dtype).eps
    half = big // 2

    def round_(r: int, gather: Tensor) -> Tensor:
        nonlocal x
        pairs = x.view(E * half, 2, length)
        gram = torch.bmm(pairs, pairs.mT)  # (E·half, 2, 2): ‖x‖², ‖y‖², xᵀy
        norm2 = gram.diagonal(dim1=1, dim2=2)
        t, rot = _rotation(gram[:, 0, 0], gram[:, 1, 1], gram[:, 0, 1], tol)
        # a row's norm moves by |t xᵀy| / (its norm + the new one) ≤ |t xᵀy| / max norm
        top = norm2.amax(1).sqrt().clamp_min(torch.finfo(a.dtype).tiny)
        moved = (t * gram[:, 0, 1]).abs().div_(top).view(E, half).amax(1)
        x = torch.bmm(rot, pairs).view(E, big, length).index_select(1, gather)
        return moved

    done = sweeps.run(round_)
    values = torch.linalg.vector_norm(x[:, :rows], dim=2).sort(1, descending=True).values
    return torch.where(done.unsqueeze(1), values, torch.full_like(values, math.nan))
