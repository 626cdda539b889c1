"""The seeds' gallery (issue 34): its fits against closed forms, its registry and command,
and, marked slow, each result's pass criterion on a sweep trained in-process (no Ray) at a
size that keeps all of them together under 3 minutes on 2 cores."""

from __future__ import annotations

import numpy as np
import pytest
from phasesweep.storage import Store, open_catalog
from scipy import stats
from sweep_runner import store_sweep

from phasesweep._config import SpecError
from phasesweep._gallery import RESULTS, Check, Fit, evaluate, listing, select
from phasesweep._gallery._fit import loglog_fit, mean_interval, slope_interval


def test_slope_interval_is_the_ols_slope_with_its_student_t_interval():
    rng = np.random.default_rng(0)
    x = np.linspace(0, 3, 12)
    y = 1.5 - 0.7 * x + 0.1 * rng.standard_normal(12)
    fit = slope_interval(x, y)
    # closed forms: slope Sxy/Sxx, its standard error sqrt(RSS/(n-2)/Sxx)
    dx, dy = x - x.mean(), y - y.mean()
    slope = (dx @ dy) / (dx @ dx)
    rss = np.sum((dy - slope * dx) ** 2)
    half = stats.t.ppf(0.975, 10) * np.sqrt(rss / 10 / (dx @ dx))
    assert fit.estimate == pytest.approx(slope, rel=1e-12)
    assert (fit.low, fit.high) == pytest.approx((slope - half, slope + half), rel=1e-10)
    assert fit.intercept == pytest.approx(y.mean() - slope * x.mean(), rel=1e-12)


def test_loglog_fit_recovers_an_exact_power_law_and_drops_non_positive_values():
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 0.0])
    y = np.where(x > 0, 3.0 * np.maximum(x, 1.0) ** -0.5, 1.0)
    fit = loglog_fit(x, y)
    assert fit.n == 5
    assert fit.estimate == pytest.approx(-0.5, abs=1e-12)
    assert fit.high - fit.low < 1e-9


def test_a_grouped_slope_is_the_dummy_variable_least_squares_slope_and_interval():
    rng = np.random.default_rng(1)
    groups = np.repeat([0, 1, 2], 5)
    x = np.tile(np.linspace(-1, 1, 5), 3) + 0.1 * rng.standard_normal(15)
    y = np.array([3.0, -1.0, 0.5])[groups] + 0.8 * x + 0.05 * rng.standard_normal(15)
    fit = slope_interval(x, y, groups.astype(str))
    # closed form: one intercept column per group and x; the slope's variance from LAPACK
    design = np.column_stack([groups == 0, groups == 1, groups == 2, x]).astype(float)
    coef, rss, *_ = np.linalg.lstsq(design, y, rcond=None)
    dof = 15 - 4
    var = rss[0] / dof * np.linalg.inv(design.T @ design)[3, 3]
    half = stats.t.ppf(0.975, dof) * np.sqrt(var)
    assert fit.estimate == pytest.approx(coef[3], rel=1e-10)
    assert (fit.low, fit.high) == pytest.approx((coef[3] - half, coef[3] + half), rel=1e-10)
    assert fit.intercept == pytest.approx(coef[:3].mean(), rel=1e-10)
    # one group per point leaves no degree of freedom
    with pytest.raises(ValueError, match="degree of freedom"):
        slope_interval(x[:4], y[:4], np.arange(4))


def test_mean_interval_is_the_student_t_interval_of_the_mean():
    v = np.array([1.0, 2.0, 4.0, 7.0])
    fit = mean_interval([*v, np.nan])
    half = stats.t.ppf(0.975, 3) * v.std(ddof=1) / 2
    assert (fit.estimate, fit.n) == (3.5, 4)
    assert (fit.low, fit.high) == pytest.approx((3.5 - half, 3.5 + half))
    with pytest.raises(ValueError, match="≥ 2 values"):
        mean_interval([1.0, np.nan])


def test_a_slope_needs_three_points_at_two_x_values():
    with pytest.raises(ValueError, match="≥ 3 points"):
        slope_interval([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    "low, high, bound, passed",
    [
        (-2.2, -2.15, "equal", False),  # misses -2 ± 0.1
        (-2.12, -2.05, "equal", True),  # within the tolerance
        (-1.5, -1.2, "equal", False),
        (-0.8, -0.3, "upper", True),  # a bound: only the low end counts
        (-0.4, -0.3, "upper", False),
        (-0.1, 0.04, "below", True),  # the whole interval under the bound
        (0.01, 0.2, "below", False),  # its high end over it
    ],
)
def test_a_check_passes_when_its_interval_reaches_the_tolerance_band(low, high, bound, passed):
    theory = {"upper": -0.5, "equal": -2.0, "below": 0.0}[bound]
    check = Check(
        "x",
        Fit((low + high) / 2, low, high, 0.0, 5),
        theory,
        {"upper": 0.0, "equal": 0.1, "below": 0.05}[bound],
        "why",
        bound,
    )
    assert check.passed is passed
    assert check.line().endswith("pass" if passed else "FAIL")


def test_the_limit_kernel_is_the_mean_of_a_wide_two_layer_relu_nets_tangent_kernel():
    from phasesweep._gallery.results.ntk_gram import limit_kernel

    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 4))
    m, d = 400_000, 4
    w, a = rng.standard_normal((m, d)), rng.standard_normal(m)
    z = x @ w.T / np.sqrt(d)  # (P, m) pre-activations
    on = (z > 0).astype(float)
    # the Jacobian's inner products, neuron by neuron: ∂f/∂w_r = a_r 1{z>0} x/√(dm),
    # ∂f/∂a_r = relu(z)/√m
    monte_carlo = ((on * a**2) @ on.T) * (x @ x.T) / d / m + np.maximum(z, 0) @ np.maximum(
        z, 0
    ).T / m
    exact = limit_kernel(x)
    assert np.abs(monte_carlo - exact).max() < 10 / np.sqrt(m) * np.abs(exact).max()
    assert np.linalg.eigvalsh(exact).min() > 0


def test_every_result_is_listed_once_by_its_name_with_paper_size_and_time():
    lines = [listing(r) for r in RESULTS.values()]
    assert [line.split()[0] for line in lines] == list(RESULTS)
    for line, result in zip(lines, RESULTS.values()):
        assert f"seed {result.seed}" in line and "min on 2 CPU cores" in line
        assert result.spec_path.is_file()


def test_an_unknown_result_is_named_with_the_known_ones():
    with pytest.raises(SpecError, match="NAME = 'nosuch'.*lazy_training"):
        select(["nosuch"])


def test_the_gallery_command_lists_shows_sql_and_refuses_unknown_names(capsys, tmp_path):
    from phasesweep._cli import main

    assert main(["gallery", "--list"]) == 0
    assert capsys.readouterr().out.startswith("lazy_training ")
    assert main(["gallery", "lazy_training", "--show-sql"]) == 0
    assert "FROM trajectories WHERE sweep = 'gallery_lazy_training'" in capsys.readouterr().out
    assert main(["gallery", "nosuch", "--store", str(tmp_path / "s")]) == 2
    assert not (tmp_path / "s").exists()


def _reproduced(tmp_path, name: str, overrides: list[str]):
    result = RESULTS[name]
    store = Store.open(str(tmp_path / "store"))
    spec = store_sweep(result.spec_path, [*result.overrides(), *overrides], store)
    return evaluate(result, store, spec.name)


@pytest.mark.slow
def test_lazy_training_exponents(tmp_path):
    evaluation = _reproduced(tmp_path, "lazy_training", ["grid.init_scale={logspace: [-1, 1, 5]}"])
    assert len(evaluation.checks) == 3
    assert evaluation.passed, evaluation.caption


@pytest.mark.slow
def test_escape_time_exponents_by_depth(tmp_path):
    evaluation = _reproduced(
        tmp_path,
        "escape_time",
        ["grid.depth=[2, 3, 4]", "grid.init_scale={logspace: [-4, -1, 4]}", "grid.seed=[0, 1]"],
    )
    assert len(evaluation.checks) == 3
    assert evaluation.passed, evaluation.caption


@pytest.mark.slow
def test_balance_defect_exponent_in_lr_read_by_sql_at_fixed_time(tmp_path):
    evaluation = _reproduced(tmp_path, "balance", ["grid.depth=[3]"])
    assert len(evaluation.checks) == 2
    assert evaluation.passed, evaluation.caption
    # the SQL's interpolation at t = 2 against numpy's, from the raw tables
    con = open_catalog(Store.open(str(tmp_path / "store")))
    raw = con.execute(
        "SELECT r.lr, r.seed, r.activation, l.layer, t.time, abs(l.balance_defect) AS d "
        "FROM layers l JOIN trajectories t USING (run_id, step) JOIN runs r USING (run_id) "
        "WHERE l.layer < r.depth ORDER BY t.time"
    ).df()
    con.close()
    frame = evaluation.frame
    assert len(frame) == raw.groupby(["lr", "seed", "activation", "layer"]).ngroups == 32
    for row in frame.itertuples():
        grp = raw[
            (raw.lr == row.lr)
            & (raw.seed == row.seed)
            & (raw.activation == row.activation)
            & (raw.layer == row.layer)
        ]
        assert row.defect_at_t == pytest.approx(np.interp(2.0, grp.time, grp.d), rel=1e-9)


@pytest.mark.slow
def test_ntk_eigenvalue_gaps_shrink_like_width_to_the_minus_half(tmp_path):
    evaluation = _reproduced(
        tmp_path, "ntk_gram", ["grid.width=[256, 1024, 4096, 16384]", "grid.seed={range: [0, 8]}"]
    )
    assert len(evaluation.checks) == 2
    assert evaluation.passed, evaluation.caption
    # the closed form on the rebuilt probe set is what the widest nets' kernels approach
    from phasesweep._gallery.results.ntk_gram import with_gaps

    widest = with_gaps(evaluation.frame).query("width == 16384")
    assert np.allclose(widest.ntk_eig_min, widest.limit_min, rtol=0.1)
    assert np.allclose(widest.ntk_eig_max, widest.limit_max, rtol=0.05)


@pytest.mark.slow
def test_biasfree_time_ratio_exponent_follows_the_same_init_delay(tmp_path):
    evaluation = _reproduced(
        tmp_path,
        "biasfree_time",
        [
            "grid={data.kind: [symmetric], leaky_slope: [0.0, 0.25, 0.5, 1.0], "
            "init_scale: [1.0e-4, 1.0e-6], seed: [0]}"
        ],
    )
    frame = evaluation.frame
    assert len(frame) == 6  # one row per (g, α < 1), joined with its linear net
    assert np.allclose(frame.time_ratio, frame.t_leaky / frame.t_linear)
    assert len(evaluation.checks) == 2
    assert evaluation.passed, evaluation.caption
    # Theorem 8's exponent 1 alone misses at g = 1e-4: the same init delays the ReLU net
    fit = next(c.fit for c in evaluation.checks if c.label.startswith("g = 1e-04"))
    assert fit.low > 1.01


@pytest.mark.slow
def test_transversal_variation_exponents_in_sigma_and_sample_size(tmp_path):
    evaluation = _reproduced(
        tmp_path,
        "transversal",
        [
            "grid={activation: [linear], depth: [2], noise_sigma: [0.3, 1.0], "
            "data.n_train: [32, 128, 512], seed: [0, 1, 2]}",
            "train.steps=4000",
        ],
    )
    assert len(evaluation.checks) == 2
    assert evaluation.passed, evaluation.caption


@pytest.mark.slow
def test_biasfree_plateau_lasts_one_over_delta_read_by_sql(tmp_path):
    evaluation = _reproduced(
        tmp_path,
        "biasfree_plateau",
        [
            "grid={data.kind: [perturbed_symmetric], data.delta: [0.025, 0.05, 0.1], "
            "leaky_slope: [0.0, 1.0], seed: [0]}"
        ],
    )
    frame = evaluation.frame
    assert len(frame) == 3  # one row per ReLU run, joined with its linear net
    # the level read from the linear net is the least-squares loss of the six points
    for row in frame.itertuples():
        x = np.array([[1, 1], [-1, -1], [1, -1], [-1, 1], [-1, 0], [1, row.delta]])
        y = np.array([1.0, -1, 1, -1, 1, -1])
        residual = y - x @ np.linalg.lstsq(x, y, rcond=None)[0]
        assert row.level == pytest.approx(0.5 * np.mean(residual**2), abs=1e-4)
    assert np.allclose(frame.l0, 0.5, rtol=1e-6)  # f(x) ≈ 0 at init: L0 = mean(y²)/2
    # reached at the linear net's transition whatever δ, left later the smaller δ
    assert np.ptp(frame.t_reach) < 0.1 * frame.t_reach.mean()
    assert frame.sort_values("delta").t_leave.is_monotonic_decreasing
    assert len(evaluation.checks) == 1
    assert evaluation.passed, evaluation.caption
    assert evaluation.checks[0].fit.estimate == pytest.approx(-1.0, abs=0.12)


@pytest.mark.slow
def test_lazy_rich_boundary_slope_in_width(tmp_path):
    from phasesweep.analysis import analyze

    result = RESULTS["lazy_phase"]
    store = Store.open(str(tmp_path / "store"))
    overrides = [
        *result.overrides(),
        "grid.width=[64, 256, 1024]",
        "grid.init_scale={logspace: [-0.8, 0, 5]}",
        "grid.seed=[0, 1]",
    ]
    spec = store_sweep(result.spec_path, overrides, store)
    analyze(store, spec.name, workers=0)
    evaluation = evaluate(result, store, spec.name)
    assert len(evaluation.checks) == 1
    assert evaluation.passed, evaluation.caption
    # every (width, seed) line flips once inside the grid: 3 widths x 2 seeds boundaries
    from phasesweep._gallery.results.lazy_phase import boundaries

    found = boundaries(evaluation.frame)
    assert len(found) == 6 and (found.g_rich < found.g_star).all()
    assert (found.g_star <= found.g_lazy).all()


def test_the_lazy_rich_boundary_of_an_exact_power_law_is_its_level_set():
    """Runs whose order parameter is exactly C g^-2 m^-1/2: the interpolated boundary is the
    level set (C / (θ √m))^(1/2) and its width slope -1/4; a line without a rich-to-lazy flip
    (all lazy, or not converged before its first lazy run) has none."""
    import pandas as pd

    from phasesweep._gallery.results.lazy_phase import boundaries, measure

    theta, constant = 0.1, 0.3
    rows = []
    for width in (64, 256, 1024):
        for seed in (0, 1):
            for g in np.logspace(-1, 0, 6):
                value = constant * g**-2 * width**-0.5
                regime = "lazy" if value < theta else "rich"
                rows.append((2, width, g, seed, regime, value, theta))
    rows.append((2, 4096, 0.5, 0, "lazy", 1e-3, theta))  # lazy over its whole range
    rows.append((2, 4096, 1.0, 0, "lazy", 1e-4, theta))
    rows.append((2, 16, 0.5, 0, "not_converged", 1.0, theta))  # no rich run before lazy
    rows.append((2, 16, 1.0, 0, "lazy", 1e-2, theta))
    columns = ["depth", "width", "init_scale", "seed", "regime", "order_value", "lazy_threshold"]
    frame = pd.DataFrame(rows, columns=columns)
    found = boundaries(frame)
    assert sorted(found.width.unique()) == [64, 256, 1024] and len(found) == 6
    exact = np.sqrt(constant / (theta * np.sqrt(found.width)))
    assert np.allclose(found.g_star, exact, rtol=1e-12)
    assert ((found.g_rich < found.g_star) & (found.g_star <= found.g_lazy)).all()
    (check,) = measure(frame)
    assert check.fit.estimate == pytest.approx(-0.25, abs=1e-12) and check.passed


@pytest.mark.slow
def test_relu_transversal_exponent_with_its_budget_and_n_range_read_by_sql(tmp_path):
    evaluation = _reproduced(
        tmp_path,
        "relu_transversal",
        [
            "grid={activation: [relu], depth: [2], noise_sigma: [0.0, 1.0], "
            "data.n_train: [32, 64, 128], seed: [0, 1]}",
            "train.steps=1000",
        ],
    )
    (beta,) = evaluation.checks  # σ = 0 is drawn, not checked (the module's docstring)
    # the budget and the N range are part of the claim; at this size β's interval is too
    # wide to decide
    assert "t = 1000, N 32–128" in beta.label and beta.fit.n == 6
    # the SQL's first and last values against the raw trajectories, by pandas
    con = open_catalog(Store.open(str(tmp_path / "store")))
    raw = con.execute(
        "SELECT r.noise_sigma, r.n_train, r.seed, t.step, t.transversal_grad_sq AS v "
        "FROM trajectories t JOIN runs r USING (run_id) ORDER BY t.step"
    ).df()
    con.close()
    ends = raw.groupby(["noise_sigma", "n_train", "seed"]).v.agg(["first", "last"])
    frame = evaluation.frame.set_index(["noise_sigma", "n_train", "seed"]).loc[ends.index]
    assert np.array_equal(frame.transversal_init, ends["first"])
    assert np.array_equal(frame.transversal_final, ends["last"])


@pytest.mark.slow
def test_escape_rank_one_weight_changes_in_the_hidden_layers(tmp_path):
    evaluation = _reproduced(
        tmp_path,
        "escape_rank",
        [
            "model.width=32",
            "grid.depth=[3, 4]",
            "grid.init_scale=[1.0e-4, 1.0e-3]",
            "grid.seed=[0, 1]",
            "train.steps=300",  # the escape comes by step ~70 (norm-adaptive step)
            "train.log_points=120",
        ],
    )
    frame = evaluation.frame
    assert len(frame) == 2 * 2 * (2 + 3)  # runs × layers 1..L-1, each read once
    assert (frame.time >= frame.t_cross_050).all()
    assert (frame.delta_srank >= 1 - 1e-9).all()  # a stable rank is at least one
    # the random init is far from rank one: the check could fail on it
    assert (frame.init_srank > 3).all()
    assert len(evaluation.checks) == 2
    assert evaluation.passed, evaluation.caption


@pytest.mark.slow
def test_slow_time_decade_on_the_sigma_squared_scale_read_by_sql(tmp_path):
    evaluation = _reproduced(
        tmp_path,
        "slow_time",
        [
            "grid={activation: [linear], depth: [2], noise_sigma: [0.2, 0.25, 0.3, 0.42], "
            "seed: [0]}",
            "train.steps=2500",  # t(0.03) + t_decade ≈ 2000 at σ = 0.2
            "train.log_points=60",
        ],
    )
    (check,) = evaluation.checks
    assert check.fit.n == 3  # the largest σ is drawn, not fitted
    assert evaluation.passed, evaluation.caption
    # the SQL's crossings against numpy's, from the raw trajectories
    con = open_catalog(Store.open(str(tmp_path / "store")))
    raw = con.execute(
        "SELECT r.noise_sigma, t.time, t.transversal_grad_sq AS v "
        "FROM trajectories t JOIN runs r USING (run_id) WHERE t.time > 0 ORDER BY t.step"
    ).df()
    con.close()
    for sigma, run in raw.groupby("noise_sigma"):
        gap = np.abs(run.v.to_numpy() / run.v.iloc[-1] - 1)
        row = evaluation.frame[evaluation.frame.noise_sigma == sigma]
        for band, column in ((0.3, "t_1"), (0.03, "t_2")):
            k = np.flatnonzero(gap > band)[-1]  # the last point outside the band
            logt = np.log(run.time.to_numpy()[k : k + 2])
            expected = logt[0] + (gap[k] - band) / (gap[k] - gap[k + 1]) * (logt[1] - logt[0])
            assert row[column].item() == pytest.approx(np.exp(expected), rel=1e-9)


def test_a_fraction_interval_is_the_exact_binomial_interval():
    from phasesweep._gallery._fit import fraction_interval

    fit = fraction_interval(3, 40)
    assert (fit.estimate, fit.n) == (3 / 40, 40)
    # the Clopper–Pearson bounds by their definition: each tail 2.5 % at its end
    assert stats.binom.sf(2, 40, fit.low) == pytest.approx(0.025, rel=1e-6)
    assert stats.binom.cdf(3, 40, fit.high) == pytest.approx(0.025, rel=1e-6)
    none = fraction_interval(0, 23)
    assert none.low == 0 and none.high == pytest.approx(1 - 0.025 ** (1 / 23), rel=1e-9)
    with pytest.raises(ValueError, match="0 ≤ hits ≤ n"):
        fraction_interval(5, 4)


def _region_data(seed: int = 3):
    """Inputs on a 2-d subspace of R^3, x = (z, 0), N = 64; nonlinear labels; A = ⟨z zᵀ⟩,
    b = ⟨g z⟩ and the least-squares w_x* = A⁻¹b."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((64, 2))
    g = np.tanh(z @ [1.0, -0.5]) + 0.2 * z[:, 1] ** 2
    a, b = z.T @ z / 64, z.T @ g / 64
    return rng, np.column_stack([z, np.zeros(64)]), g, a, b, np.linalg.solve(a, b)


def test_the_initial_region_is_theorem_2_4s_by_its_geometric_definition():
    """E⁻: inside the cylinder E = {s = 0}, s(w_x) = w_xᵀA w_x − w_xᵀb; U⁺: beyond the plane
    H tangent to E at w_x*, on the side its exterior normal (∇s at w_x*, by central
    differences, pointing away from E's centre w_x*/2) points to."""
    from phasesweep._gallery.results.depth_region import BETWEEN, GROWS, SHRINKS, region

    rng, x, g, a, b, w_star = _region_data()

    def s(w_x):
        return w_x @ a @ w_x - w_x @ b

    h = 1e-6
    normal = np.array([(s(w_star + h * e) - s(w_star - h * e)) / (2 * h) for e in np.eye(2)])
    assert normal @ (w_star - w_star / 2) > 0  # exterior
    found = []
    for _ in range(400):
        w = rng.standard_normal(3) * np.exp(rng.uniform(-2, 1.5))
        expected = GROWS if s(w[:2]) < 0 else SHRINKS if normal @ (w[:2] - w_star) > 0 else BETWEEN
        found.append(region(x @ w, g, x[:, :2] @ w_star))
        assert found[-1] == expected
    assert set(found) == {GROWS, SHRINKS, BETWEEN}


def _flow_runs(depth_of_flow=lambda depth: depth):
    """Runs of the paper's product flow (2.4) at σ = 0, integrated by scipy to t = 5 from
    12 inits in E⁻ and 12 in U⁺, at depths 1–4, as the depth_region SQL's columns.
    ``depth_of_flow``: the L of the flow integrated for a run labelled ``depth``."""
    import pandas as pd
    from scipy.integrate import solve_ivp

    from phasesweep._gallery.results.depth_region import GROWS, SHRINKS, region

    rng, x, g, a, b, w_star = _region_data()

    def field(depth):
        def velocity(_, w):
            grad = np.append(a @ w[:2] - b, 0.0)
            sq = w @ w
            return -(sq ** (1 - 1 / depth)) * (grad + (depth - 1) * w * (w @ grad) / sq)

        return velocity

    inits = {GROWS: [], SHRINKS: []}
    while min(map(len, inits.values())) < 12:
        w = rng.standard_normal(3) * np.exp(rng.uniform(-2, 1.5))
        which = region(x @ w, g, x[:, :2] @ w_star)
        if which in inits and len(inits[which]) < 12:
            inits[which].append(w)
    rows = []
    for which, starts in inits.items():
        for w0 in starts:
            for depth in (1, 2, 3, 4):
                flow = field(depth_of_flow(depth))
                wt = solve_ivp(flow, (0, 5), w0, rtol=1e-10, atol=1e-12).y[:, -1]
                norm_0, norm_t = np.linalg.norm(w0), np.linalg.norm(wt)
                rows.append(
                    (depth, which, w0[2] ** 2, wt[2] ** 2, norm_0, norm_t,
                     np.log(abs(wt[2] / w0[2])), np.log(norm_t / norm_0))
                )  # fmt: skip
    columns = ["depth", "region", "wy_sq_0", "wy_sq_t", "w_norm_0", "w_norm_t"]
    return pd.DataFrame(rows, columns=[*columns, "dlog_wy", "dlog_w"])


def test_the_product_flow_keeps_theorem_2_4_and_the_depth_law_exactly():
    from phasesweep._gallery.results.depth_region import GROWS, judge, theorem_terms

    terms = theorem_terms(_flow_runs())
    deep = terms[terms.depth >= 2]
    # (2.20)/(2.21) without the per-run tolerance: the flow keeps them to its accuracy
    sign = np.where(deep.region == GROWS, 1.0, -1.0)
    assert (sign * (deep.change - deep.bound) >= -1e-7 * deep.change.abs()).all()
    assert (sign * deep.bound >= 0).all()
    assert (np.sign(deep.change) == sign).all()  # grows from E⁻, shrinks from U⁺
    assert (terms[terms.depth == 1].change.abs() < 1e-12).all()  # regression: frozen
    checks = judge(terms)
    assert len(checks) == 6 and all(c.passed for c in checks), [c.line() for c in checks]
    for check, depth in zip(checks[2:], (1, 2, 3, 4)):
        assert check.fit.estimate == pytest.approx((depth - 1) / depth, abs=1e-6)


def test_the_depth_region_checks_fail_on_regressions_frozen_normal_weight():
    """Runs labelled depth L that followed plain regression's flow (L = 1: w_y frozen)."""
    from phasesweep._gallery.results.depth_region import judge, theorem_terms

    checks = judge(theorem_terms(_flow_runs(lambda depth: 1)))
    assert [c.passed for c in checks] == [False, False, True, False, False, False]
    assert checks[0].fit.estimate == 1 and checks[1].fit.estimate == 1  # every run broke it


def _depth_region_store(tmp_path, overrides: list[str]):
    evaluation = _reproduced(
        tmp_path,
        "depth_region",
        [
            "grid.seed={range: [0, 12]}",
            "train.lr=0.0025",  # t = 2.5
            "train.steps=1000",
            "train.log_points=20",
            *overrides,
        ],
    )
    con = open_catalog(Store.open(str(tmp_path / "store")))
    raw = con.execute(
        "SELECT r.depth, r.init_scale, r.seed, t.train_loss FROM runs r "
        "JOIN trajectories t USING (run_id) WHERE t.step = 0 ORDER BY r.depth, r.init_scale, r.seed"
    ).df()
    con.close()
    return evaluation, raw


@pytest.mark.slow
def test_depth_region_theorem_2_4_and_depth_law_on_trained_balanced_nets(tmp_path):
    import json

    import torch
    from phasesweep.pipeline.data._datasets import make_dataset
    from phasesweep.pipeline.spec import DataConfig, ModelConfig
    from phasesweep.pipeline.train._init import init_params
    from phasesweep.pipeline.train._models import EnsembleMLP

    from phasesweep._gallery.results.depth_region import initial_outputs

    evaluation, step0 = _depth_region_store(tmp_path, ["grid.depth=[1, 2, 4]"])
    assert len(evaluation.checks) == 5
    assert evaluation.passed, evaluation.caption
    frame = evaluation.frame
    assert len(frame) == 3 * 8 * 12 and evaluation.checks[1].fit.n >= 23
    for row, loss in zip(frame.itertuples(), step0.train_loss):
        # the rebuilt f₀ is the trained run's: its loss is the stored one at step 0
        f0, g, _ = initial_outputs(row.model_config, row.data_config, row.seed)
        assert 0.5 * np.mean((f0 - g) ** 2) == pytest.approx(loss, rel=1e-9)
    # the SQL's ‖w_y(0)‖² and ‖w(0)‖ are those of the end-to-end vector w₀ (the net on the
    # identity), its codimension part P⊥ w₀
    for row in frame.iloc[::17].itertuples():
        model = ModelConfig.model_validate(json.loads(row.model_config))
        data = DataConfig.model_validate(json.loads(row.data_config))
        basis = make_dataset(data, row.seed).codim_basis.numpy()
        net = EnsembleMLP(model, 10, 1)
        w0 = net(init_params(net, [model], [row.seed]), torch.eye(10, dtype=torch.float64)[None])
        w0 = w0[0, :, 0].numpy()
        assert row.wy_sq_0 == pytest.approx(np.sum((basis.T @ w0) ** 2), rel=1e-9)
        assert row.w_norm_0 == pytest.approx(np.linalg.norm(w0), rel=1e-9)


@pytest.mark.slow
def test_depth_region_depth_law_fails_for_an_unbalanced_init(tmp_path):
    """The same rank-one init with its first layer doubled breaks the balance (2.5) that
    (2.4) and its depth law assume: a smaller first layer takes less of the growth."""
    evaluation, _ = _depth_region_store(
        tmp_path,
        [
            "grid.depth=[4]",
            "grid.seed=[0, 1, 2, 3]",
            "model.depth=4",  # the base config holds layer_scales too
            "model.layer_scales=[2, 1, 1, 1]",
        ],
    )
    law = evaluation.checks[-1]
    assert law.label.startswith("depth 4:") and not law.passed
    assert law.fit.low > 0.76, law.line()
