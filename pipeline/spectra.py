"""Per-layer weight metrics: singular values, stable rank and the balance defect.

All functions are batched over the ensemble axis; a member whose weights are
not finite gets NaN and never stops the others (batched LAPACK calls fail on
non-finite input, so such members are replaced by zeros before the call).

Cost: the singular values of a (fan_out, fan_in) layer cost O(E·m²·M) with
m = min(fan_out, fan_in), M = max; the matrix balance of a linear net forms
(E, n_l, n_l) matrices, evaluated in blocks of members to bound memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.models import Params

#: Most elements of one (members × n × n) temporary of the matrix balance.
_BLOCK_ELEMENTS = 1 << 24


def _finite_rows(t: Tensor) -> Tensor:
    return torch.isfinite(t.reshape(t.shape[0], -1)).all(1)


def top_singular_values(w: Tensor, k: int) -> Tensor:
    """The k largest singular values of each (E, a, b) matrix, descending: (E, k).

    Entries beyond min(a, b) are NaN (stored as NULL); NaN rows for non-finite members.
    """
    ok = _finite_rows(w)
    safe = torch.where(ok.view(-1, 1, 1), w, torch.zeros((), dtype=w.dtype, device=w.device))
    sv = torch.linalg.svdvals(safe)[:, :k]
    sv = torch.where(ok.unsqueeze(1), sv, torch.full_like(sv, float("nan")))
    if sv.shape[1] < k:
        pad = sv.new_full((sv.shape[0], k - sv.shape[1]), float("nan"))
        sv = torch.cat([sv, pad], 1)
    return sv


def stable_rank(fro: Tensor, top: Tensor) -> Tensor:
    """‖W‖_F² / ‖W‖_2² from the Frobenius norms (E,) and largest singular values (E,)."""
    return fro.square() / top.square()


def _sq(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], -1).square().sum(1)


def balance_scalar(params: Params) -> Tensor:
    """c_l = ‖W_{l+1}‖_F² − ‖W_l‖_F² − ‖b_l‖² for l = 1 … L−1: (E, L−1).

    Conserved by gradient flow for positively homogeneous activations (biases
    are incoming weights of the units they feed).
    """
    w = params.weights
    cols = []
    for l in range(len(w) - 1):
        c = _sq(w[l + 1]) - _sq(w[l])
        if params.biases is not None:
            c = c - params.biases[l].square().sum(1)
        cols.append(c)
    if not cols:
        return w[0].new_zeros(w[0].shape[0], 0)
    return torch.stack(cols, 1)


def _matrix_drift(w_in, w_out, b, w_in0, w_out0, b0) -> Tensor:
    """‖D(t) − D(0)‖_F with D = W_outᵀW_out − W_in W_inᵀ − b bᵀ, for a block of members."""
    d = torch.bmm(w_out.transpose(1, 2), w_out) - torch.bmm(w_out0.transpose(1, 2), w_out0)
    d -= torch.bmm(w_in, w_in.transpose(1, 2)) - torch.bmm(w_in0, w_in0.transpose(1, 2))
    if b is not None:
        d -= b.unsqueeze(2) * b.unsqueeze(1) - b0.unsqueeze(2) * b0.unsqueeze(1)
    return d.reshape(d.shape[0], -1).norm(dim=1)


def balance_matrix_drift(params: Params, params0: Params) -> Tensor:
    """‖D_l(t) − D_l(0)‖_F for l = 1 … L−1 (linear nets): (E, L−1).

    D_l = W_{l+1}ᵀW_{l+1} − W_l W_lᵀ − b_l b_lᵀ is conserved by gradient flow between
    linear layers. The difference is taken entrywise in (n_l, n_l) matrices, not via
    traces of products, so a drift far below ‖W‖² is not lost to cancellation.
    """
    w, w0 = params.weights, params0.weights
    E = w[0].shape[0]
    cols = []
    for l in range(len(w) - 1):
        n = w[l].shape[1]
        block = max(1, _BLOCK_ELEMENTS // (n * n))
        parts = []
        for s in range(0, E, block):
            sl = slice(s, s + block)
            b = b0 = None
            if params.biases is not None:
                b, b0 = params.biases[l][sl], params0.biases[l][sl]
            parts.append(_matrix_drift(w[l][sl], w[l + 1][sl], b, w0[l][sl], w0[l + 1][sl], b0))
        cols.append(torch.cat(parts))
    if not cols:
        return w[0].new_zeros(E, 0)
    return torch.stack(cols, 1)
