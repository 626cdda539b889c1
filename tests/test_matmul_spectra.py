"""The accelerator's spectra and kernel predictor (fixed sequences of batched matmuls:
``_squaring``, ``_subspace``, ``_decay``) against LAPACK, on random, graded, clustered,
rank-deficient and zero matrices and on the kernels and layers the shipped sweeps make.
Bounds hold for any summation order: they are multiples of n·ε·‖A‖."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from host_reads import Launches
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import validate_spec
from phasesweep.pipeline.train._trainer import ChunkTrainer
from phasesweep.pipeline.train.metrics import _decay, _spectra, _squaring, _subspace
from phasesweep.pipeline.train.metrics._ntk import empirical_ntk

F64 = torch.float64
EPS = torch.finfo(F64).eps
SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"


def _rng(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _with_spectrum(values: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Symmetric (E, n, n) matrices Q diag(values) Qᵀ with random orthogonal Q."""
    E, n = values.shape
    q = torch.linalg.qr(torch.randn(E, n, n, dtype=F64, generator=_rng(seed)))[0]
    return q @ torch.diag_embed(values) @ q.mT


def _symmetric_cases(E: int = 16, n: int = 48) -> dict[str, torch.Tensor]:
    g = torch.randn(E, n, n, dtype=F64, generator=_rng(1))
    low = torch.randn(E, n, 3, dtype=F64, generator=_rng(2))
    clustered = torch.ones(E, n, dtype=F64)
    clustered[:, -2:] += torch.tensor([1e-10, 2e-10], dtype=F64)
    clustered[:, :3] -= 1e-9
    return {
        "random symmetric": g + g.mT,
        "wishart": g @ g.mT,
        "graded over 16 decades": _with_spectrum(
            (10.0 ** torch.linspace(-14, 2, n, dtype=F64)).expand(E, n).clone()
        ),
        "clustered": _with_spectrum(clustered),
        "negative definite": -(g @ g.mT),
        "rank 3": low @ low.mT,
        "zero": torch.zeros(E, n, n, dtype=F64),
        "order 1": torch.randn(E, 1, 1, dtype=F64, generator=_rng(3)),
    }


def _shipped_trainer(name: str) -> ChunkTrainer:
    """The first chunk of a shipped sweep with each grid axis cut to its first two values."""
    raw = yaml.safe_load((SWEEPS / f"{name}.yaml").read_text())
    raw["grid"] = {axis: values[:2] if isinstance(values, list) else values
                   for axis, values in raw["grid"].items()}  # fmt: skip
    spec = validate_spec(raw)
    return ChunkTrainer(make_chunks(expand(spec), spec)[0])


def _shipped_kernels() -> dict[str, torch.Tensor]:
    """NTKs at init on the probe set of the shipped sweeps' nets."""
    out = {}
    for name in ("quickstart", "lazy_rich", "biasfree_linear", "saddle_escape"):
        tr = _shipped_trainer(name)
        probe = tr.batch.x_test[:, : tr.base.metrics.probe_size]
        out[name] = empirical_ntk(tr.net, tr.params0, probe)
    return out


# -- extreme eigenvalues by repeated squaring --------------------------------------------------


@pytest.fixture(params=[False, True], ids=["subnormals kept", "subnormals flushed"])
def flush_subnormals(request):
    """Both ways a device treats subnormal numbers: kept (IEEE, the CPU's default) or
    flushed to zero, as a GPU's kernels may; the CPU flushes them where it can."""
    if request.param and not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        yield request.param
    finally:
        torch.set_flush_denormal(False)


def _assert_extremes(k: torch.Tensor, factor: float = 4.0) -> None:
    low, high = _squaring.extreme_eigenvalues(k)
    ev = torch.linalg.eigvalsh(k)
    bound = factor * k.shape[1] * EPS * torch.linalg.vector_norm(k, dim=(1, 2))
    assert ((low - ev[:, 0]).abs() <= bound).all(), (low - ev[:, 0]).abs().max()
    assert ((high - ev[:, -1]).abs() <= bound).all(), (high - ev[:, -1]).abs().max()


@pytest.mark.parametrize("case", list(_symmetric_cases()))
def test_extreme_eigenvalues_within_n_eps_of_lapack(case):
    _assert_extremes(_symmetric_cases()[case])


def test_extreme_eigenvalues_of_the_shipped_sweeps_kernels():
    for k in _shipped_kernels().values():
        _assert_extremes(k)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_extreme_eigenvalues_of_tiny_kernels_scale_with_them(dtype, flush_subnormals):
    """A kernel times 2^-p (exact) has its eigenvalues times 2^-p, also where its squares
    and its Frobenius norm underflow (a float32 NTK at a small init): were the shift c to
    underflow to 0, λ_min would come out as −λ_max. Whether subnormals are kept or flushed."""
    cases = _symmetric_cases()
    k = torch.cat([cases["wishart"], cases["graded over 16 decades"], cases["zero"]]).to(dtype)
    tiny = 2.0 ** (-90 if dtype == torch.float32 else -700)  # k · tiny stays normal
    low, high = _squaring.extreme_eigenvalues(k)
    low_tiny, high_tiny = _squaring.extreme_eigenvalues(k * tiny)
    bound = 4 * k.shape[1] * torch.finfo(dtype).eps * torch.linalg.vector_norm(k, dim=(1, 2))
    assert ((low_tiny - low * tiny).abs() <= bound * tiny).all()
    assert ((high_tiny - high * tiny).abs() <= bound * tiny).all()
    ev = torch.linalg.eigvalsh(k.to(F64))
    assert ((low.to(F64) - ev[:, 0]).abs() <= bound.to(F64)).all()


def test_extreme_eigenvalues_of_each_member_do_not_depend_on_the_others():
    k = _symmetric_cases()["wishart"]
    low, high = _squaring.extreme_eigenvalues(k)
    for e in (0, 7):
        alone = _squaring.extreme_eigenvalues(k[e : e + 1])
        assert alone[0][0] == low[e] and alone[1][0] == high[e]


def test_the_squarings_make_the_gap_free_bound_eps():
    for n in (1, 8, 64, 512):
        m = _squaring.squarings(n)
        assert 2 * n / 2**m <= EPS < 2 * n / 2 ** (m - 1)


def test_a_wrong_count_of_squarings_is_seen(monkeypatch):
    """The check above can fail: with too few squarings a flat spectrum is not resolved."""
    monkeypatch.setattr(_squaring, "squarings", lambda n, dtype=F64: 3)
    with pytest.raises(AssertionError):
        _assert_extremes(_symmetric_cases()["wishart"])


# -- top singular values by block subspace iteration -----------------------------------------


def _layer_cases(E: int = 6) -> dict[str, torch.Tensor]:
    def r(*shape, seed):  # noqa: ANN002, ANN202
        return torch.randn(*shape, dtype=F64, generator=_rng(seed))

    n = 128
    return {
        "gaussian square (init)": r(E, n, n, seed=4) / n**0.5,
        "gaussian plus rank one": r(E, n, n, seed=5) / n**0.5
        + 3 * r(E, n, 1, seed=6) @ r(E, 1, n, seed=7) / n,
        "rank 3": r(E, n, 3, seed=8) @ r(E, 3, n, seed=9),
        "rank 3 plus noise": r(E, n, 3, seed=8) @ r(E, 3, n, seed=9) + 1e-4 * r(E, n, n, seed=10),
        "tall (first layer)": r(E, n, 10, seed=11),
        "one row (last layer)": r(E, 1, n, seed=12),
        "wide rectangle": r(E, 40, n, seed=13),
        "orthogonal": torch.linalg.qr(r(E, n, n, seed=14))[0],
        "zero": torch.zeros(E, n, n, dtype=F64),
    }


@pytest.mark.parametrize("case", list(_layer_cases()))
def test_top_singular_values_against_lapack(case):
    w = _layer_cases()[case]
    got = _subspace.top_singular_values(w, 5)
    ref = torch.linalg.svdvals(w)[:, : got.shape[1]]
    _assert_top(got, ref, w.shape[1])


def _assert_top(got: torch.Tensor, ref: torch.Tensor, m: int) -> None:
    """The docstring's bound: within 4·m·ε·σ₁ of LAPACK's (convergence included, at the
    flattest spectra a layer has)."""
    assert ((got - ref).abs() <= 4 * m * EPS * ref[:, :1]).all(), (
        (got - ref).abs() / ref[:, :1]
    ).max()


def test_top_singular_values_of_the_shipped_sweeps_layers():
    for name in ("width_laziness", "quickstart", "balancedness"):
        for w in _shipped_trainer(name).params0.weights:
            got = _subspace.top_singular_values(w, 5)
            _assert_top(got, torch.linalg.svdvals(w)[:, : got.shape[1]], min(w.shape[1:]))


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("shape", [(128, 10), (10, 128), (64, 64)])
def test_zero_and_underflowing_layers_in_either_precision(dtype, shape, flush_subnormals):
    """W − W(0) is exactly zero at the first step, and a layer may be so small that its
    squares underflow. Beside an ordinary member in the same batch, each gets finite values
    within the bound, of its own size, whether subnormals are kept or flushed; both the
    Rayleigh-Ritz path (64 × 64) and the whole-row-space one (a side ≤ 32) are covered."""
    underflowing = 1e-20 if dtype == torch.float32 else 1e-160
    members = torch.randn(4, *shape, dtype=F64, generator=_rng(20))
    members[0] = 0.0
    members[1] *= underflowing
    members[2] *= torch.finfo(dtype).tiny  # entries about half subnormal
    w = members.to(dtype)
    got = _subspace.top_singular_values(w, 5).to(F64)
    ref = torch.linalg.svdvals(w.to(F64))[:, : got.shape[1]]
    assert torch.isfinite(got).all()
    assert (got[0] == 0).all()
    eps = torch.finfo(dtype).eps
    assert ((got - ref).abs() <= 4 * min(shape) * eps * ref[:, :1]).all(), (got, ref)


@pytest.mark.parametrize("shape", [(128, 10), (64, 64)])
def test_non_finite_members_are_read_as_zero_without_touching_the_layers(shape):
    """A diverged member's layer (an inf or a NaN entry) beside ordinary ones: the subspace
    method, told which are finite, gives exactly what it gives the batch with those layers
    zeroed (values 0 for them) and leaves the caller's tensor as it was; the layer metric
    then stores NaN for them on both paths, and LAPACK's values for the others."""
    w = torch.randn(4, *shape, dtype=F64, generator=_rng(21))
    w[1, 3, 2] = float("inf")
    w[2, 0, 0] = float("nan")
    given = w.clone()
    finite = torch.tensor([True, False, False, True])
    got = _subspace.top_singular_values(w, 5, finite=finite)
    torch.testing.assert_close(w, given, rtol=0, atol=0, equal_nan=True)
    zeroed = torch.where(finite.view(-1, 1, 1), w, 0.0)
    assert torch.equal(got, _subspace.top_singular_values(zeroed, 5))
    assert (got[1:3] == 0).all()
    lapack = _spectra.top_singular_values(w, 5)
    accelerated = _spectra.top_singular_values(w, 5, accelerated=True)
    assert lapack[1:3].isnan().all() and accelerated[1:3].isnan().all()
    _assert_top(accelerated[finite], lapack[finite], min(shape))


def test_non_finite_members_read_as_zero_whatever_divisor_a_device_gives_them(monkeypatch):
    """The divisor of a member with an inf or a NaN entry is 2 to frexp's exponent of it:
    0 on the CPU, unspecified for NaN on CUDA. With an infinite one (what an exponent past
    the range would give) those members still get values 0, and the others are as before."""
    w = torch.randn(4, 64, 64, dtype=F64, generator=_rng(22))
    w[1, 3, 2] = float("inf")
    w[2, 0, 0] = float("nan")
    finite = torch.tensor([True, False, False, True])
    expected = _subspace.top_singular_values(w, 5, finite=finite)
    above = _subspace.power_of_two_above
    monkeypatch.setattr(
        _subspace,
        "power_of_two_above",
        lambda x: torch.where(x.isfinite(), above(x), torch.inf),
    )
    got = _subspace.top_singular_values(w, 5, finite=finite)
    assert (got[1:3] == 0).all(), got
    assert torch.equal(got, expected)


def test_too_few_iterations_are_seen(monkeypatch):
    monkeypatch.setattr(_subspace, "ITERATIONS", 4)
    with pytest.raises(AssertionError):
        test_top_singular_values_against_lapack("gaussian square (init)")


# -- ∫₀ᵗ exp(−sA)r ds by scaling and squaring, at many times at once -------------------------


def _integral_by_eigh(a: torch.Tensor, t: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """∫₀ᵗ exp(−sA) ds · r (E, n, k) at one time t (E,) per member, from A = V Λ Vᵀ."""
    lam, v = torch.linalg.eigh(a)
    lam = lam.clamp_min(0.0)
    x = t.unsqueeze(1) * lam
    gain = torch.where(lam > 0, -torch.expm1(-x) / torch.where(lam > 0, lam, 1.0), t.unsqueeze(1))
    return v @ (gain.unsqueeze(2) * (v.mT @ r))


@pytest.mark.parametrize("case", ["wishart", "graded over 16 decades", "rank 3", "zero"])
@pytest.mark.parametrize("t_max", [0.0, 1e-3, 1.0, 1e4])
@pytest.mark.parametrize("times", [1, 30], ids=["one time", "30 times"])
def test_integrals_against_the_eigendecomposition(case, t_max, times):
    """One time per member (N = 2^S: plain scaling and squaring) and 30 (0, t_max and
    random ones between: every bit pattern and fraction), each member its own span."""
    a = _symmetric_cases()[case]
    a = a / torch.linalg.vector_norm(a, dim=(1, 2)).clamp_min(1e-300).view(-1, 1, 1) * 3.0
    E, n, _ = a.shape
    span = torch.linspace(0, t_max, E, dtype=F64).view(E, 1)
    t = span * torch.rand(E, times, dtype=F64, generator=_rng(5))
    t[:, -1:] = span
    t[:, :1] = 0.0 if times > 1 else span
    r = torch.randn(E, n, 1, dtype=F64, generator=_rng(20))
    norm = torch.linalg.vector_norm(a, dim=(1, 2))
    got = _decay.integrals(a, norm, t, r)
    assert got.shape == (E, n, times)
    steps = _decay.halvings(float((span.view(-1) * norm).max())) + 1
    scale = r.norm(dim=(1, 2)).view(-1, 1)
    for j in range(times):
        want = _integral_by_eigh(a, t[:, j], r)[..., 0]
        # the docstring's bound: both methods move e^{−tλ} by t·ε‖A‖ (the problem's
        # condition), relative to t‖r‖ (1 + t: the bound of t = 0 is 0)
        tj = t[:, j : j + 1]
        bound = 8 * (steps * n + tj * norm.view(-1, 1)) * EPS * scale * (1 + tj)
        assert ((got[..., j] - want).abs() <= bound).all(), ((got[..., j] - want) / bound).max()


def test_integrals_of_a_block_equal_those_of_each_time_alone():
    """A block of times against one call per time: the same to round-off (the block's
    levels are those of its largest time)."""
    a = _symmetric_cases()["wishart"]
    a = a / torch.linalg.vector_norm(a, dim=(1, 2)).view(-1, 1, 1) * 3.0
    E, n, _ = a.shape
    t = torch.rand(E, 12, dtype=F64, generator=_rng(6)).cumsum(1) * 5.0
    r = torch.randn(E, n, 1, dtype=F64, generator=_rng(7))
    norm = torch.linalg.vector_norm(a, dim=(1, 2))
    block = _decay.integrals(a, norm, t, r)
    alone = torch.cat([_decay.integrals(a, norm, t[:, j : j + 1], r) for j in range(12)], 2)
    # each side within the bound of test_integrals_against_the_eigendecomposition
    steps = _decay.halvings(float((t.amax(1) * norm).max())) + 1
    tn = (t * norm.view(-1, 1)).unsqueeze(1)
    bound = 16 * (steps * n + tn) * EPS * r.norm(dim=(1, 2)).view(-1, 1, 1) * (1 + t.unsqueeze(1))
    assert ((block - alone).abs() <= bound).all()


def test_the_taylor_degree_reaches_eps():
    import math

    theta, q = _decay.THETA, _decay.DEGREE
    # the integral's column of exp(hM) is h·Σ (−hA)^i/(i + 1)!, cut after i = q − 1
    assert theta**q / math.factorial(q + 1) < EPS / 4


# -- launches fixed in advance --------------------------------------------------------------


def _launches(fn, *args, **kwargs) -> int:
    with Launches() as launches:
        fn(*args, **kwargs)
    return launches.count


def test_the_accelerated_methods_launch_a_count_fixed_in_advance():
    """What a logged step launches on a GPU does not depend on the ensemble's size or on
    its values (no count that depends on convergence, no call per member): for each method
    one count per shape (and, for the integrals, per number of halvings, the one value the
    host reads), over every test case and two ensemble sizes. The kernel's extreme
    eigenvalues and the predictor's integrals take a few hundred operators; the layers'
    subspace iteration a few thousand (its 48 iterations, the same for every layer)."""
    squaring = {
        (k.shape[1], _launches(_squaring.extreme_eigenvalues, part))
        for k in _symmetric_cases().values()
        for part in (k, k[:3])
    }
    assert len({n for n, _ in squaring}) == len(squaring)  # one count per order n
    assert all(count <= 5 * _squaring.squarings(n) for n, count in squaring)

    subspace = {
        (w.shape[1:], _launches(_subspace.top_singular_values, part, 5))
        for w in _layer_cases().values()
        for part in (w, w[:1])
    }
    assert len({shape for shape, _ in subspace}) == len(subspace)

    integrals = set()
    for name in ("wishart", "graded over 16 decades", "rank 3"):
        a = _symmetric_cases()[name]
        a = a / torch.linalg.vector_norm(a, dim=(1, 2)).view(-1, 1, 1) * 3.0
        norm = torch.linalg.vector_norm(a, dim=(1, 2))
        r = torch.randn(a.shape[0], a.shape[1], 1, dtype=F64, generator=_rng(7))
        for span in (1.0, 1e3, 1e5):
            t = torch.rand(a.shape[0], 12, dtype=F64, generator=_rng(6)) * span
            t[:, -1] = span
            s = _decay.halvings(float((t.amax(1) * norm).max()))
            for e in (a.shape[0], 3):
                count = _launches(_decay.integrals, a[:e], norm[:e], t[:e], r[:e])
                integrals.add((s, count))
    assert len({s for s, _ in integrals}) == len(integrals) == 3
    assert all(count <= 300 for _, count in integrals)


def test_a_count_that_depends_on_the_values_is_seen(monkeypatch):
    """The check above fails on a method that stops when it has converged."""
    top = _squaring.top_eigenvalue

    def until_converged(m):
        b = m / m.diagonal(dim1=1, dim2=2).sum(-1).clamp_min(1e-300).view(-1, 1, 1)
        for _ in range(_squaring.squarings(m.shape[1])):
            power = torch.bmm(b, b)
            power = power / power.diagonal(dim1=1, dim2=2).sum(-1).clamp_min(1e-300).view(-1, 1, 1)
            if torch.allclose(power, b):  # a host read deciding the work
                break
            b = power
        return top(m)

    monkeypatch.setattr(_squaring, "top_eigenvalue", until_converged)
    with pytest.raises(AssertionError):
        test_the_accelerated_methods_launch_a_count_fixed_in_advance()
