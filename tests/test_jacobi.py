"""The batched Jacobi eigen- and singular-value solvers (pipeline.train.metrics._jacobi) against LAPACK.

The accelerator's metrics take their spectra from these instead of one cuSOLVER call per
member, so they must agree with LAPACK to working precision on every kind of matrix the
metrics see: random, graded over many decades (kernels), clustered, rank-deficient
(kernels of linear nets, W − W(0) early in training), zero, and of odd order. The bound
is what backward stability gives any method: a few ulps of ‖A‖ times the order.
"""

from __future__ import annotations

import math

import pytest
import torch
from phasesweep.pipeline.train.metrics import _jacobi

torch.set_num_threads(1)

EPS = torch.finfo(torch.float64).eps
E = 6


def _symmetric(kind: str, n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q = torch.linalg.qr(randn(E, n, n)).Q
    spectrum = {
        "random": lambda: None,
        "graded": lambda: torch.logspace(0, -14, n, dtype=torch.float64),
        "graded_beyond_eps": lambda: torch.logspace(0, -30, n, dtype=torch.float64),
        "power_law": lambda: torch.arange(1, n + 1, dtype=torch.float64) ** -2.0,
        "clustered": lambda: 1.0 + 1e-10 * randn(n),
    }
    if kind == "random":
        a = randn(E, n, n)
        return a + a.mT
    if kind == "rank3":
        x = randn(E, n, 3)
        return x @ x.mT
    if kind == "zero":
        return torch.zeros(E, n, n, dtype=torch.float64)
    return q @ torch.diag_embed(spectrum[kind]().expand(E, n)) @ q.mT


KINDS = ["random", "graded", "graded_beyond_eps", "power_law", "clustered", "rank3", "zero"]


def _bound(n: int, scale: torch.Tensor) -> torch.Tensor:
    """Backward-stable accuracy: a small multiple of n·ε‖A‖ per member (E,)."""
    return 8 * n * EPS * scale + 1e-300


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_eigh_equals_lapack_and_its_vectors_diagonalise(kind, n):
    k = _symmetric(kind, n, seed=n)
    values, vectors = _jacobi.eigh(k, vectors=True)
    ref = torch.linalg.eigvalsh(k)
    scale = torch.linalg.matrix_norm(k)
    bound = _bound(n, scale)
    assert (values - ref).abs().amax(1).le(bound).all()
    assert values.diff(dim=1).ge(0).all()  # ascending, as torch.linalg.eigh
    eye = torch.eye(n, dtype=torch.float64)
    assert (vectors.mT @ vectors - eye).abs().amax((1, 2)).le(8 * n * EPS).all()
    rebuilt = vectors @ torch.diag_embed(values) @ vectors.mT
    assert torch.linalg.matrix_norm(rebuilt - k).le(bound).all()
    assert _jacobi.eigh(k)[1] is None


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [2, 9, 16])
def test_svdvals_of_symmetric_matrices_equal_lapack(kind, n):
    k = _symmetric(kind, n, seed=100 + n)
    got, ref = _jacobi.svdvals(k), torch.linalg.svdvals(k)
    assert (got - ref).abs().amax(1).le(_bound(n, torch.linalg.matrix_norm(k))).all()


@pytest.mark.parametrize("shape", [(10, 24), (24, 10), (1, 16), (16, 1), (5, 5), (13, 13)])
def test_svdvals_of_rectangular_and_low_rank_matrices_equal_lapack(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(E, *shape, generator=gen, dtype=torch.float64)
    # a rank-1 update of a tiny matrix: W − W(0) after a first step of rich training
    u, v = (torch.randn(E, s, 1, generator=gen, dtype=torch.float64) for s in shape)
    low = u @ v.mT + 1e-9 * a
    for m in (a, low):
        got, ref = _jacobi.svdvals(m), torch.linalg.svdvals(m)
        assert got.shape == ref.shape == (E, min(shape))
        assert got.diff(dim=1).le(0).all()  # descending
        assert (got - ref).abs().amax(1).le(_bound(max(shape), ref[:, 0])).all()


def test_members_never_mix_and_each_is_solved_alone():
    """A batch's results are each member's own: solving one member alone gives its values
    to working precision (the sweep count is the batch's, so not bit for bit)."""
    k = _symmetric("graded", 12)
    together = _jacobi.eigh(k)[0]
    for e in range(E):
        alone = _jacobi.eigh(k[e : e + 1])[0][0]
        assert (alone - together[e]).abs().max() <= 8 * 12 * EPS * k[e].norm()


def test_a_member_that_has_not_converged_gets_nan_not_a_value(monkeypatch):
    """Members still moving when the sweeps run out are NaN (stored as NULL)."""
    monkeypatch.setattr(_jacobi, "MAX_SWEEPS", 1)
    monkeypatch.setattr(_jacobi, "MIN_SWEEPS", 1)
    k = _symmetric("random", 16)
    k[0] = torch.diag(torch.arange(16, dtype=torch.float64))  # already diagonal: converged
    values = _jacobi.eigh(k)[0]
    assert torch.equal(values[0], torch.arange(16, dtype=torch.float64))
    assert values[1:].isnan().all()
    assert _jacobi.svdvals(k)[1:].isnan().all()


def test_tournament_pairs_every_two_rows_once_per_sweep_and_returns_to_the_start():
    for n in (1, 2, 3, 8, 11):
        big, gathers = _jacobi.tournament(n)
        assert big == n + n % 2 and len(gathers) == big - 1
        order, met = list(range(big)), set()
        for gather in gathers:
            met |= {frozenset(order[i : i + 2]) for i in range(0, big, 2)}
            order = [order[g] for g in gather]
        assert order == list(range(big))
        assert len(met) == math.comb(big, 2)
