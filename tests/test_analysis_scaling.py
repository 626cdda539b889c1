"""Scaling fits: slopes and intervals by hand, and the theory's exponents on closed forms."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from calibration import deep_linear_loss, logged_times, two_layer_escape_time
from phasesweep.analysis import _series as ser
from phasesweep.analysis._escape import escape_times
from phasesweep.analysis._scaling import fit_group, fit_scaling, theory
from scipy import stats


def _ols_slope(x, y):
    x, y = np.asarray(x, float), np.asarray(y, float)
    return ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()


def test_seed_t_interval_by_hand():
    alphas = np.logspace(-3, -1, 5)
    rng = np.random.default_rng(3)
    rows, slopes = [], []
    for seed in range(4):
        t = 7.0 * alphas**-1.5 * np.exp(0.05 * rng.standard_normal(len(alphas)))
        rows += [(a, seed, v) for a, v in zip(alphas, t)]
        slopes.append(_ols_slope(np.log(alphas), np.log(t)))
    a, s, t = map(np.array, zip(*rows))
    res = fit_group(a, s, t, x="log_init_scale", y="log_escape_time", confidence=0.9)
    m, sd, n = np.mean(slopes), np.std(slopes, ddof=1), len(slopes)
    half = stats.t.ppf(0.95, n - 1) * sd / math.sqrt(n)
    assert res["slope"] == pytest.approx(m, rel=1e-10)
    assert res["ci_low"] == pytest.approx(m - half, rel=1e-10)
    assert res["ci_high"] == pytest.approx(m + half, rel=1e-10)
    assert res["ci_method"] == "seeds_t"
    assert res["n_seeds"] == 4 and res["n_points"] == 20
    assert res["ci_low"] < -1.5 < res["ci_high"]


def test_single_seed_ols_interval_and_too_few_decades():
    alphas = np.logspace(-3, -1, 6)
    rng = np.random.default_rng(0)
    t = alphas**-1.0 * np.exp(0.1 * rng.standard_normal(6))
    x, y = np.log(alphas), np.log(t)
    res = fit_group(alphas, np.zeros(6), t, x="log_init_scale", y="log_escape_time")
    b = _ols_slope(x, y)
    resid = y - (y.mean() + b * (x - x.mean()))
    se = math.sqrt((resid**2).sum() / 4 / ((x - x.mean()) ** 2).sum())
    assert res["slope"] == pytest.approx(b, rel=1e-10)
    assert res["ci_high"] - res["slope"] == pytest.approx(stats.t.ppf(0.975, 4) * se, rel=1e-8)
    assert res["ci_method"] == "ols_t"
    # 1.5 decades only: no slope, never a made-up one; counts say why
    few = fit_group(alphas[:4], np.zeros(4), t[:4], x="log_init_scale", y="log_escape_time")
    assert few["slope"] is None and few["ci_low"] is None and few["n_seeds"] == 0
    # NaN escape times (runs that never escaped) are left out
    t2 = t.copy()
    t2[2] = np.nan  # a middle point: the 2 decades stay
    res2 = fit_group(alphas, np.zeros(6), t2, x="log_init_scale", y="log_escape_time")
    assert res2["n_points"] == 5


def test_theory_slopes():
    assert theory(3, "log_init_scale")[0] == -1.0
    assert theory(5, "log_init_scale")[0] == -3.0
    assert theory(2, "log_init_scale")[0] is None
    assert theory(2, "log_log_inv_init_scale")[0] is None
    assert theory(1, "log_init_scale")[0] is None


def _closed_form_escapes(depth, alphas, seeds, s=2.0, steps=10**6, lr=None):
    """Escape times (eps 0.5) of balanced whitened depth-L linear nets, u0 = alpha^L."""
    frames, meta = [], []
    for a in alphas:
        for seed in seeds:
            u0 = a**depth * (1 + 0.2 * seed)
            t_scale = (
                (u0 ** (-(depth - 2) / depth) / ((depth - 2) * s))
                if depth > 2
                else (math.log(s / u0) / (2 * s))
            )
            t = logged_times((lr or 20 * t_scale / steps), steps, 400)
            rid = f"{a:.3e}-{seed}"
            loss = deep_linear_loss(t, [s], u0, depth)
            frames.append(pd.DataFrame({"run_id": rid, "time": t, "train_loss": loss}))
            meta.append((rid, a, seed))
    df = pd.concat(frames)
    srs = ser.from_frame(df, ["train_loss"], run_ids=np.array([m[0] for m in meta], dtype=object))
    esc = escape_times(srs, [0.5])[:, 0]
    return pd.DataFrame(
        {
            "depth": depth,
            "init_scale": [m[1] for m in meta],
            "seed": [m[2] for m in meta],
            "escape_time": esc,
        }
    )


@pytest.mark.parametrize("depth", [3, 4])
def test_deep_linear_escape_slope_matches_theory(depth):
    # t_esc ∝ alpha^-(L-2) at small init (seeds/002, Prop. 2.2): fit over 2 decades
    df = _closed_form_escapes(depth, np.logspace(-4, -2, 5), [0, 1, 2])
    fits = fit_scaling(df)
    row = fits[fits["x"] == "log_init_scale"].iloc[0]
    assert row["theory_slope"] == -(depth - 2)
    assert row["slope"] == pytest.approx(-(depth - 2), abs=0.03)
    assert row["n_seeds"] == 3 and row["n_points"] == 15
    assert row["ci_low"] <= row["slope"] <= row["ci_high"]


def test_two_layer_escape_is_logarithmic():
    # depth 2: t ≈ (1/s) log(1/alpha) + O(1) for a whitened linear net (u0 = alpha^2)
    s = 2.0
    df = _closed_form_escapes(2, np.logspace(-4, -1, 7), [0, 1], s=s, steps=10**5, lr=1e-3)
    fits = fit_scaling(df).set_index("x")
    lin = fits.loc["log_inv_init_scale"]
    assert lin["y"] == "escape_time"
    assert lin["slope"] == pytest.approx(1 / s, rel=0.02)
    assert pd.isna(lin["theory_slope"])
    # the law is linear in log(1/alpha): intercept a and slope b reproduce the closed-form
    # time at which the loss (s - u)^2/2 has fallen half-way (u = s (1 - 1/sqrt 2)), mean
    # over the two seeds' u0 = alpha^2 (1 + 0.2 seed), at every fitted alpha
    alphas = np.logspace(-4, -1, 7)
    frac = 1 - 1 / math.sqrt(2)
    exact = np.mean(
        [[two_layer_escape_time(s, a * a * (1 + 0.2 * k), frac) for a in alphas] for k in (0, 1)],
        axis=0,
    )
    pred = lin["intercept"] + lin["slope"] * np.log(1 / alphas)
    assert np.abs(pred - exact).max() < 0.05 / s
    loglog = fits.loc["log_log_inv_init_scale"]
    # no theory slope: log t vs log log(1/alpha) tends to 1 only as alpha -> 0
    assert pd.isna(loglog["theory_slope"])
    assert pd.isna(fits.loc["log_init_scale"]["theory_slope"])


def test_fit_scaling_groups_and_columns():
    alphas = np.logspace(-3, -1, 5)
    rows = []
    for width in (16, 64):
        for seed in (0, 1):
            for a in alphas:
                rows.append(
                    (3, width, a, seed, (1 + seed / 10) * a ** (-1.0 if width == 16 else -2.0))
                )
    df = pd.DataFrame(rows, columns=["depth", "width", "init_scale", "seed", "escape_time"])
    fits = fit_scaling(df, group_axes=["width"], eps=0.25)
    assert list(fits["width"]) == [16, 64]
    assert fits["slope"].tolist() == pytest.approx([-1.0, -2.0])
    assert (fits["eps"] == 0.25).all()
    assert fits["activation"].isna().all()
    assert list(fits["init_scale_min"]) == pytest.approx([1e-3, 1e-3])
    empty = fit_scaling(df.iloc[:0])
    assert empty.empty and "slope" in empty.columns
