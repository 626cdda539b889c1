"""The fits a gallery result states with a 95 % interval, and its pass criterion.

A result's numbers are a handful of points per seed (a metric against a grid axis); the
claim is a slope (a power law's exponent on log-log axes, or a ratio) with the paper's
value. :func:`slope_interval` pools every seed's points in one least-squares line and
gives the Student-t interval of its slope (n − 2 degrees of freedom): the seeds' spread
widens it, as it should. :class:`Check` compares the interval with the paper's value
up to a stated tolerance: the systematic error the finite sizes of the sweep leave (each
result says where its tolerance comes from).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

#: The confidence of every interval the gallery states.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Fit:
    """A fitted slope (or ratio) with its ``CONFIDENCE`` interval; ``n``: points used."""

    estimate: float
    low: float
    high: float
    intercept: float
    n: int


def slope_interval(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> Fit:
    """Least-squares line ``y = intercept + slope x`` over all points (shape (n,), n ≥ 3,
    at least two distinct x) and the Student-t interval of the slope.

    ``groups`` (shape (n,), any labels) gives each group its own intercept and one common
    slope (the fixed-effects fit: x and y centred within each group, n − groups − 1
    degrees of freedom); for series whose constants differ (layers, seeds) while the
    exponent is shared. ``intercept`` is then the mean of the groups' intercepts.

    Raises ValueError with fewer than 3 finite points, a single x value within every
    group, or no degree of freedom left: no interval can be stated then.
    """
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    labels = np.zeros(len(x), np.int64) if groups is None else np.asarray(groups)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y, labels = x[ok], y[ok], labels[ok]
    codes = np.unique(labels, return_inverse=True)[1].ravel()
    counts = np.bincount(codes)
    x_mean, y_mean = np.bincount(codes, x) / counts, np.bincount(codes, y) / counts
    dx, dy = x - x_mean[codes], y - y_mean[codes]
    sxx = float(dx @ dx)
    dof = len(x) - len(counts) - 1
    if len(x) < 3 or dof < 1 or sxx == 0:
        raise ValueError(
            f"a slope with an interval needs ≥ 3 points at ≥ 2 x values and a degree of "
            f"freedom, got {len(x)} points in {len(counts)} groups"
        )
    slope = float(dx @ dy) / sxx
    stderr = np.sqrt(float(np.sum((dy - slope * dx) ** 2)) / dof / sxx)
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, dof) * stderr)
    intercept = float(np.mean(y_mean - slope * x_mean))
    return Fit(slope, slope - half, slope + half, intercept, len(x))


def mean_interval(values: np.ndarray) -> Fit:
    """The mean of ``values`` (shape (n,), n ≥ 2 finite) with its Student-t interval
    (n − 1 degrees of freedom), as a :class:`Fit` whose ``intercept`` is 0: for claims
    about a level, not a slope. Raises ValueError with fewer than 2 finite values."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        raise ValueError(f"a mean with an interval needs ≥ 2 values, got {len(v)}")
    mean = float(v.mean())
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))
    return Fit(mean, mean - half, mean + half, 0.0, len(v))


def fraction_interval(hits: int, n: int) -> Fit:
    """The fraction ``hits / n`` (counts, n ≥ 1) with its exact (Clopper–Pearson)
    ``CONFIDENCE`` interval, as a :class:`Fit` whose ``intercept`` is 0: for claims that
    every run obeys a rule, stated as the fraction that breaks it. Unlike a Student-t
    interval it does not collapse to a point when no run breaks it: n runs with none
    broken bound the fraction by 1 − ((1 − CONFIDENCE)/2)^(1/n). Raises ValueError for
    n < 1 or hits outside [0, n]."""
    if n < 1 or not 0 <= hits <= n:
        raise ValueError(f"a fraction needs 0 ≤ hits ≤ n and n ≥ 1, got {hits} of {n}")
    ci = stats.binomtest(hits, n).proportion_ci(CONFIDENCE, method="exact")
    return Fit(hits / n, float(ci.low), float(ci.high), 0.0, n)


def loglog_fit(x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> Fit:
    """:func:`slope_interval` of ``log y`` against ``log x`` (the exponent of a power law;
    ``groups``: each its own constant); non-positive values are left out (a log cannot
    hold them)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ok = (x > 0) & (y > 0)
    labels = None if groups is None else np.asarray(groups)[ok]
    return slope_interval(np.log(x[ok]), np.log(y[ok]), labels)


@dataclass(frozen=True)
class Check:
    """One claim of a result against the store: the fitted ``fit`` and the paper's value
    ``theory``; it passes when the interval comes within ``tolerance`` of ``theory``
    (``bound='upper'``: when the interval's low end is at most ``theory + tolerance``, for
    claims that are bounds, not equalities; ``bound='below'``: when the whole interval,
    its high end, is at most ``theory + tolerance``, for a claim that the quantity is
    small, which a wide interval must not pass)."""

    label: str
    fit: Fit
    theory: float
    tolerance: float
    why_tolerance: str
    bound: str = "equal"

    @property
    def passed(self) -> bool:
        if self.bound == "below":
            return self.fit.high <= self.theory + self.tolerance
        if self.bound == "upper":
            return self.fit.low <= self.theory + self.tolerance
        return self.fit.low <= self.theory + self.tolerance and (
            self.fit.high >= self.theory - self.tolerance
        )

    def line(self) -> str:
        """One line: ``label: 1.98 [1.95, 2.01] vs 2 ± 0.05 (why): pass``."""
        f = self.fit
        relation, margin = ("vs", "±") if self.bound == "equal" else ("≤", "+")
        return (
            f"{self.label}: {f.estimate:.3g} [{f.low:.3g}, {f.high:.3g}] {relation} "
            f"{self.theory:g} {margin} {self.tolerance:g} ({self.why_tolerance}): "
            f"{'pass' if self.passed else 'FAIL'}"
        )
