"""The classified lazy/rich boundary moves with the width as the theory says (issue 13, item 4).

Theory (NTK parameterization, init scale g multiplying the weights, depth-L homogeneous
net, antisymmetric init so f(theta_0) = 0): fitting an O(1) target moves the weights by
||dtheta|| ~ g^-(L-1) (the kernel grows like g^(2(L-1))), so each neuron, and the kernel,
move relatively by ~ 1 / (g^L sqrt(width)); the lazy/rich crossover, where that is O(1),
sits at g* ∝ width^(-1/(2L)): -1/4 at depth 2, -1/6 at depth 3.

The test trains ``sweeps/lazy_rich.yaml`` scaled down (width x init scale x seed, in this
process, no Ray), classifies every run with the project's regime rule
(:func:`analysis._analyze.analyze_frames`, the core of ``phasesweep analyze``), locates
each (width, seed)'s boundary inside its classified bracket (the largest rich and the
smallest lazy init scale) and fits log g* on log width by OLS; the theory's exponent must
lie in the fit's 95 % t-interval. The interval is the statistics of the boundaries
(seed-to-seed and width-to-width scatter), not a tolerance chosen to pass.

The contrast, measured: at depth 3 a fixed threshold on ``param_rel_change`` (which
divides by ||theta_0|| ~ g sqrt(P), P ~ width^2) has a wrong, steeper exponent while the
default rule (``kernel_distance``) has -1/6. At depth 2 (P ~ width) ``param_rel_change``
gives -1/4, and ``kernel_distance`` is steeper at these widths (see ``analysis._regimes``
for the numbers at other thresholds and times). Depth 2 takes about 45 s of CPU, depth 3
about 15 s.

The init scales are 0.2 decade apart: each boundary is interpolated inside its bracket, so
a grid twice as fine (0.1 decade, twice the training) changes the fits little (measured on
the same runs, 0.2 vs 0.1 decade: depth 2, param_rel_change -0.251 [-0.261, -0.241] vs
-0.250 [-0.261, -0.240], kernel_distance -0.277 [-0.294, -0.260] vs -0.278 [-0.294, -0.262];
depth 3, kernel_distance [-0.312, -0.093] vs [-0.317, -0.116], which holds -1/6 and excludes
-1/3 either way, param_rel_change high -0.421 vs -0.423). Fewer widths, seeds or a shorter
time are no such cut: without width 4096, or with two seeds, the depth-2 kernel_distance
interval reaches -0.259 and -0.251 (its margin to -1/4 gone), and at t = 1000 the depth-2
param_rel_change interval excludes -1/4 (not yet converged).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from phasesweep.analysis._analyze import RUN_COLUMNS, analyze_frames
from phasesweep.analysis.config import AnalysisConfig
from scipy import stats
from sweep_runner import run_sweep

pytestmark = pytest.mark.slow


def classified_boundaries(res, cfg: AnalysisConfig) -> pd.DataFrame:
    """One boundary g* per (width, seed) from the regimes ``analyze`` gives with ``cfg``.

    The classified bracket is (largest rich g, smallest lazy g); inside it g* is where the
    order parameter the rule compared crosses the rule's threshold, linear in log-log
    between the bracket's two runs. Each (width, seed) must read, by increasing g,
    not_converged (still on the saddle plateau at the smallest g) or nothing, then rich,
    then lazy: the rule must give one clean boundary here, or the test fails.
    """
    summaries = analyze_frames(res.runs[RUN_COLUMNS], res.trajectories, cfg)["summaries"]
    s = summaries.to_pandas()[["run_id", "regime", "order_value", "lazy_threshold"]]
    df = res.runs[["run_id", "width", "seed", "init_scale"]].merge(s, on="run_id")
    rows = []
    for (width, seed), grp in df.sort_values("init_scale").groupby(["width", "seed"]):
        regimes = grp.regime.tolist()
        n_nc, n_rich = regimes.count("not_converged"), regimes.count("rich")
        n_lazy = len(regimes) - n_nc - n_rich
        clean = ["not_converged"] * n_nc + ["rich"] * n_rich + ["lazy"] * n_lazy
        assert n_rich > 0 and n_lazy > 0 and regimes == clean, (width, seed, regimes)
        lo, hi = grp.iloc[n_nc + n_rich - 1], grp.iloc[n_nc + n_rich]
        x = np.log([lo.order_value, hi.order_value])
        y = np.log([lo.init_scale, hi.init_scale])
        g = math.exp(np.interp(math.log(lo.lazy_threshold), x[::-1], y[::-1]))
        rows.append({"width": width, "seed": seed, "boundary": g})
    return pd.DataFrame(rows)


def width_exponent(b: pd.DataFrame, confidence: float = 0.95) -> tuple[float, float, float]:
    """OLS slope of log g* on log width and its t-interval: (slope, low, high)."""
    fit = stats.linregress(np.log(b.width), np.log(b.boundary))
    half = stats.t.ppf(0.5 + confidence / 2, len(b) - 2) * fit.stderr
    return fit.slope, fit.slope - half, fit.slope + half


WIDTHS = [256, 512, 1024, 2048, 4096]
T = 3000.0  # gradient-flow time at which every run is read (lr 1 for every g <= 1)


@pytest.fixture(scope="module")
def sweep():
    """Depth 2, widths 256 ... 4096, 6 init scales 0.1 ... 1 (0.2 decade), 3 seeds.

    About 45 s of CPU on one thread. The lr floor 1 gives every run lr 1, so all reach
    t = T: the boundary is read at equal time, late enough that the runs near it have
    converged (the boundaries below move by < 0.01 decade from t = 2000 to 3000).
    """
    return run_sweep(
        "lazy_rich",
        [
            "grid.depth=[2]",
            f"grid.width={WIDTHS}",
            "grid.init_scale={logspace: [-1, 0, 6]}",
            "grid.seed=[0, 1, 2]",
            f"train.steps={int(T)}",
            "train.log_points=30",
            "train.lr_scaling.init_scale_floor=1.0",
        ],
    )


def test_depth2_param_rel_change_boundary_has_the_theory_width_exponent(sweep):
    # At depth 2 (P ~ width) param_rel_change ~ C / (g^L sqrt(P)) on the lazy side
    # is a function of the theory's scaling variable; its level set is g* ~ width^-1/4
    # where that law holds, i.e. at a level well inside the lazy regime (corrections are
    # O(param_rel_change): measured -0.258, -0.275, -0.287 at levels 0.1, 0.3, 1).
    cfg = AnalysisConfig(order_parameter="param_rel_change", lazy_threshold=0.03, at_time=T)
    slope, low, high = width_exponent(classified_boundaries(sweep, cfg))
    print(f"\n[param_rel_change 0.03] b = {slope:.3f}, 95 % [{low:.3f}, {high:.3f}]")
    depth = 2
    assert low <= -1 / (2 * depth) <= high


def test_depth2_kernel_distance_boundary_is_steeper_at_these_widths(sweep):
    # lazy_rich.yaml's rule at depth 2: 1 - cos(K_t, K_0) also counts the incoherent part of the
    # kernel change (activation flips of either sign, ~ sqrt(param_rel_change / width)),
    # which adds a width dependence of its own: at these widths its boundary falls
    # faster than width^-1/4 (measured -0.277 here, -0.27 ... -0.29 at levels 0.001-0.1)
    cfg = AnalysisConfig(order_parameter="kernel_distance", lazy_threshold=0.01, at_time=T)
    slope, low, high = width_exponent(classified_boundaries(sweep, cfg))
    print(f"\n[kernel_distance 0.01] b = {slope:.3f}, 95 % [{low:.3f}, {high:.3f}]")
    assert high < -1 / 4


@pytest.fixture(scope="module")
def deep_sweep():
    """Depth 3, widths 32 ... 256, the same init scales and time, 2 seeds (about 15 s CPU)."""
    return run_sweep(
        "lazy_rich",
        [
            "grid.depth=[3]",
            "grid.width=[32, 64, 128, 256]",
            "grid.init_scale={logspace: [-1, 0, 6]}",
            "grid.seed=[0, 1]",
            f"train.steps={int(T)}",
            "train.log_points=30",
            "train.lr_scaling.init_scale_floor=1.0",
        ],
    )


def test_depth3_default_rule_has_the_theory_exponent_and_param_rel_change_does_not(deep_sweep):
    # The default rule (kernel_distance, threshold 0.1) follows the kernel, whose lazy-side
    # change is ~ 1 / (g^L sqrt(width)) at every depth: g* ~ width^-1/6 at depth 3.
    depth = 3
    cfg = AnalysisConfig(at_time=T)
    slope, low, high = width_exponent(classified_boundaries(deep_sweep, cfg))
    print(
        f"\n[depth 3, {cfg.order_parameter} {cfg.lazy_threshold}] b = {slope:.3f}, "
        f"95 % [{low:.3f}, {high:.3f}]"
    )
    assert cfg.order_parameter == "kernel_distance"
    assert low <= -1 / (2 * depth) <= high
    # param_rel_change divides by ||theta_0|| ~ g sqrt(P), and P ~ width^2 once there is a
    # width x width layer: it is ~ 1 / (g^L width), sqrt(width) smaller than the kernel
    # change, and its fixed-threshold boundary falls like width^-1/L or faster, not -1/(2L)
    cfg = AnalysisConfig(order_parameter="param_rel_change", at_time=T)
    slope, low, high = width_exponent(classified_boundaries(deep_sweep, cfg))
    print(
        f"[depth 3, param_rel_change {cfg.lazy_threshold}] b = {slope:.3f}, "
        f"95 % [{low:.3f}, {high:.3f}]"
    )
    assert high < -1 / (2 * depth)
