"""Per-layer weight metrics: singular values, stable rank and the balance defect.

All functions are batched over the ensemble axis; a member whose weights are
not finite gets NaN and never stops the others (batched LAPACK calls fail on
non-finite input, so such members are replaced by zeros before the call).

Singular values come from LAPACK (``torch.linalg.svdvals``, to working precision) or,
with ``accelerated``, from block subspace iteration
(:mod:`pipeline.train.metrics._subspace`: batched matmuls, no solver call per member; its
docstring gives its accuracy).

Cost: the singular values of a (fan_out, fan_in) layer cost O(E·m²·M) with
m = min(fan_out, fan_in), M = max — for wide square layers more than many
training steps, hence :func:`spectra_schedule`, with the cost of each method
(:func:`svd_work`, :func:`eig_work`); the matrix balance of a linear
net forms (E, n_l, n_l) matrices (D_l(0) cached when small, else recomputed in
blocks of members to bound memory).
"""

from __future__ import annotations

import numpy as np
import torch
from phasesweep.pipeline.train._models import Params, member_sq_norm
from phasesweep.pipeline.train.metrics import _squaring, _subspace
from torch import Tensor

#: Most elements of one (members × n × n) temporary of the matrix balance.
_BLOCK_ELEMENTS = 1 << 24


def _finite_rows(t: Tensor) -> Tensor:
    return torch.isfinite(t.reshape(t.shape[0], -1)).all(1)


def top_singular_values(
    w: Tensor, k: int, finite: Tensor | None = None, accelerated: bool = False
) -> Tensor:
    """The k largest singular values of each (E, a, b) matrix, descending: (E, k).

    Entries beyond min(a, b) are NaN (stored as NULL); NaN rows for non-finite members.
    ``finite``: (E,) bool, whether each member's matrix is finite, if already known.
    ``accelerated``: by :func:`pipeline.train.metrics._subspace.top_singular_values`
    instead of LAPACK.
    """
    ok = _finite_rows(w) if finite is None else finite
    if accelerated:  # zeroes the non-finite members in its own scaled copy
        sv = _subspace.top_singular_values(w, k, finite=ok)
    else:
        zero = torch.zeros((), dtype=w.dtype, device=w.device)
        sv = torch.linalg.svdvals(torch.where(ok.view(-1, 1, 1), w, zero))[:, :k]
    sv = torch.where(ok.unsqueeze(1), sv, torch.full_like(sv, float("nan")))
    if sv.shape[1] < k:
        pad = sv.new_full((sv.shape[0], k - sv.shape[1]), float("nan"))
        sv = torch.cat([sv, pad], 1)
    return sv


def stable_rank(fro: Tensor, top: Tensor) -> Tensor:
    """‖W‖_F² / ‖W‖_2² from the Frobenius norms (E,) and largest singular values (E,)."""
    return fro.square() / top.square()


def balance_scalar(params: Params, degree: float = 1.0) -> Tensor:
    """c_l = k‖W_{l+1}‖_F² − ‖W_l‖_F² − ‖b_l‖² for l = 1 … L−1: (E, L−1).

    Conserved by gradient flow for activations positively homogeneous of degree k
    (z φ'(z) = k φ(z); biases are incoming weights of the units they feed).
    """
    w = params.weights
    cols = []
    for l in range(len(w) - 1):
        c = degree * member_sq_norm(w[l + 1]) - member_sq_norm(w[l])
        if params.biases is not None:
            c = c - member_sq_norm(params.biases[l])
        cols.append(c)
    if not cols:
        return w[0].new_zeros(w[0].shape[0], 0)
    return torch.stack(cols, 1)


def balance_matrix(w_in: Tensor, w_out: Tensor, b: Tensor | None) -> Tensor:
    """D = W_outᵀW_out − W_in W_inᵀ − b bᵀ for a block of members: (E, n, n)."""
    d = torch.bmm(w_out.transpose(1, 2), w_out)
    d -= torch.bmm(w_in, w_in.transpose(1, 2))
    if b is not None:
        d -= b.unsqueeze(2) * b.unsqueeze(1)
    return d


def _bias(params: Params, l: int, sl: slice) -> Tensor | None:
    return None if params.biases is None else params.biases[l][sl]


def initial_balance_matrices(
    params0: Params, max_elements: int = _BLOCK_ELEMENTS
) -> list[Tensor] | None:
    """D_l(0) for l = 1 … L−1, or None if they would hold more than ``max_elements``."""
    w = params0.weights
    E = w[0].shape[0]
    if E * sum(x.shape[1] ** 2 for x in w[1:]) > max_elements:
        return None
    sl = slice(None)
    return [
        balance_matrix(w[l][sl], w[l + 1][sl], _bias(params0, l, sl)) for l in range(len(w) - 1)
    ]


def balance_matrix_drift(params: Params, params0: Params, d0: list[Tensor] | None = None) -> Tensor:
    """‖D_l(t) − D_l(0)‖_F for l = 1 … L−1 (linear nets): (E, L−1).

    D_l = W_{l+1}ᵀW_{l+1} − W_l W_lᵀ − b_l b_lᵀ is conserved by gradient flow between
    linear layers. The difference is taken entrywise in (n_l, n_l) matrices, not via
    traces of products, so a drift far below ‖W‖² is not lost to cancellation.
    ``d0``: the D_l(0) if cached (:func:`initial_balance_matrices`); else they are
    recomputed, in blocks of members that bound the memory.
    """
    w, w0 = params.weights, params0.weights
    E = w[0].shape[0]
    cols = []
    for l in range(len(w) - 1):
        n = w[l].shape[1]
        block = E if d0 is not None else max(1, _BLOCK_ELEMENTS // (n * n))
        parts = []
        for s in range(0, E, block):
            sl = slice(s, s + block)
            d = balance_matrix(w[l][sl], w[l + 1][sl], _bias(params, l, sl))
            d -= (
                d0[l]
                if d0 is not None
                else balance_matrix(w0[l][sl], w0[l + 1][sl], _bias(params0, l, sl))
            )
            parts.append(d.reshape(d.shape[0], -1).norm(dim=1))
        cols.append(torch.cat(parts))
    if not cols:
        return w[0].new_zeros(E, 0)
    return torch.stack(cols, 1)


def svd_work(dims: list[int], accelerated: bool = False, k: int = 5) -> float:
    """Estimated work of the singular values of one member's layers, in training-flop
    units: ~36 m²M per (M × m) matrix. LAPACK's bidiagonalisation costs 8/3 m²M flops
    for a square matrix, but batched ``svdvals`` of small matrices runs far below the
    training's matmul rate: measured on a 2-core CPU at 256 members of width 64,
    about 1/13 of it (98 ms per logged step where 8 m²M at that rate predicted 22 ms).
    ``accelerated``: block subspace iteration's for the ``k`` largest (:func:`subspace_work`)."""
    total = 0.0
    for a, b in zip(dims[:-1], dims[1:]):
        m, big = min(a, b), max(a, b)
        total += subspace_work(m, big, k) if accelerated else SVD_COST * m * m * big
    return total


#: Training-flop equivalents per m²M of a singular-value computation (see :func:`svd_work`).
SVD_COST = 36.0


def eig_work(size: int, accelerated: bool = False) -> float:
    """Estimated work of the extreme eigenvalues of one member's (size × size) symmetric
    kernel, in training-flop units: ~24 size³. Measured beside :data:`SVD_COST`: batched
    ``eigvalsh`` of 256 kernels of size 64 took 24 ms where ``svdvals`` of 256 matrices
    64 × 64 took 38 ms (LAPACK's tridiagonalisation, like the bidiagonalisation, runs far
    below the matmul rate). ``accelerated``: repeated squaring's, both eigenvalues:
    2·m matmuls of 2·size³ flops (:func:`pipeline.train.metrics._squaring.squarings`), at
    about the training's rate (batched 64 × 64 float64 matmuls run at 26 TFLOP/s on an
    H200, the training of width 256 at about 20)."""
    if accelerated:
        return 2 * _squaring.squarings(size) * 2.0 * size**3
    return EIG_COST * size**3


#: Training-flop equivalents per size³ of a symmetric eigenvalue computation (see :func:`eig_work`).
EIG_COST = 24.0


def subspace_work(m: int, length: int, k: int = 5) -> float:
    """Estimated work of :func:`pipeline.train.metrics._subspace.top_singular_values` on one
    member's m × ``length`` matrix (m the shorter side), in training-flop units: per
    iteration two products with it (4·m·length·b flops) and the re-orthonormalisations
    (two passes of 4·(m + length)·b² each), counted at the training's rate; the b × b
    Choleskys and the final b × b singular values are negligible."""
    b = _subspace.block_size(m, k)
    if b == m:
        return 4.0 * m * m * length
    return _subspace.ITERATIONS * (4.0 * m * length * b + 8.0 * (m + length) * b * b)


def spectra_schedule(
    logged_steps: list[int],
    per_log: float,
    train_total: float,
    budget: float,
    least: tuple[int, ...] = (0, -1),
) -> set[int]:
    """The logged steps at which the spectra are computed: all of them if
    ``len(logged_steps) · per_log ≤ budget · train_total``, else as many as fit, evenly
    spaced in the (log-spaced) logged-step index (the first and the last among them);
    where fewer than 2 fit, the logged steps at the positions ``least`` (by default the
    first and the last), over the budget: what analysis reads of a run however short."""
    n = len(logged_steps)
    fit = int(budget * train_total // per_log) if per_log > 0 else n
    if fit >= n:
        return set(logged_steps)
    if fit < 2:
        return {logged_steps[i] for i in least}
    idx = np.unique(np.round(np.linspace(0, n - 1, fit)).astype(np.int64))
    return {logged_steps[i] for i in idx}
