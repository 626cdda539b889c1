"""Scaling of escape times with the init scale: fitted slopes, confidence intervals, theory.

Theory (Bantzis, Simon, Jacot, Prop. 2.2 and the escape-time estimate after it,
seeds/002): near the saddle at the origin a depth-L net follows the localized
gradient flow; aligned with an escape direction of speed ``s`` its norm obeys
``d||θ||/dt ∝ s ||θ||^(L-1)``, so reaching a fixed norm ``r`` from ``||θ0|| ∝ α``
(``α`` = init_scale) takes

- ``L >= 3``: ``t ≈ (||θ0||^(2-L) - r^(2-L)) / ((L-2) L s)  ∝  α^-(L-2)``: a
  power law, slope ``-(L-2)`` of ``log t`` vs ``log α``;
- ``L = 2``: ``||θ||`` grows like ``e^{st}``, so ``t ≈ log(r / ||θ0||) / s``:
  logarithmic, ``t = a + b log(1/α)`` with ``b = 1/s``. This linear form is the
  depth-2 law that is fitted. On log-log axes it is no power law; ``log t`` vs
  ``log log(1/α)`` tends to slope 1 only as ``α -> 0`` (the O(1) offset ``a`` bends
  it on any finite range), so that row carries no theory slope. The
  coefficient ``b`` is not universal: for a whitened two-layer *linear* net
  with small balanced init in phasesweep's conventions (loss 1/(2n) Σ||f-y||²,
  t = Σ lr, standard parameterization) each mode is the logistic
  ``u(t) = s e^{2st} / (e^{2st} - 1 + s/u0)`` with ``u0 ∝ α²``, so the half-way
  time is ``t ≈ log(s/u0) / (2s) = (1/s) log(1/α) + O(1)``: ``b = 1/s1`` for the
  top singular value ``s1`` of Σ_yx; other parameterizations rescale per-layer
  learning rates and change ``b``. So ``theory_slope`` is NULL for that row and
  the figures draw its *shape* only.
- ``L = 1`` (convex): no saddle, no theory slope.

Fits (one row per group, i.e. per depth and per value of the other grid axes):

- ``x = 'log_init_scale'``, ``y = 'log_escape_time'``: every depth.
- depth 2 also: ``x = 'log_inv_init_scale'``, ``y = 'escape_time'`` (the linear law
  above, ``t = a + b log(1/α)``: slope = ``b``, intercept = ``a``) and, for reference,
  ``x = 'log_log_inv_init_scale'``, ``y = 'log_escape_time'`` (init scales below 1
  only; no theory slope: slope 1 holds only in the limit α -> 0).

A fit needs, per seed, escape times at >= 2 init scales spanning at least
``min_decades`` decades. With >= 2 such seeds the slope is the mean of the
per-seed OLS slopes and the interval a Student-t interval over seeds
(``ci_method = 'seeds_t'``); with one seed it is that seed's OLS slope with the
OLS t-interval (``'ols_t'``, NULL with fewer than 3 points). Without enough data
the slope and interval are NULL (the row stays, with its counts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from phasesweep.storage.schema import SCALING_FITS
from scipy import stats

FIT_COLUMNS = SCALING_FITS.names


def theory(depth: int, x: str) -> tuple[float | None, str]:
    """The theory slope (or None) for ``depth`` and fit ``x``, and the law it comes from."""
    if x == "log_init_scale":
        if depth >= 3:
            return -(depth - 2.0), f"t ∝ α^-(L-2) = α^{-(depth - 2)} (saddle at the origin, L≥3)"
        if depth == 2:
            return None, "t ≈ log(1/α)/s + O(1): logarithmic, no power law (L=2)"
        return None, "no saddle (depth 1 is convex)"
    if x == "log_inv_init_scale":
        return None, "t = a + b·log(1/α), b = 1/s (escape ∝ e^(st); whitened linear: s = s1)"
    if x == "log_log_inv_init_scale":
        return None, "→ 1 only as α → 0; the law is t = a + b·log(1/α) (log_inv_init_scale)"
    raise ValueError(f"unknown fit x {x!r}")


def fit_specs(depth: int) -> list[tuple[str, str]]:
    """(x, y) of the fits made for a depth."""
    specs = [("log_init_scale", "log_escape_time")]
    if depth == 2:
        specs += [
            ("log_inv_init_scale", "escape_time"),
            ("log_log_inv_init_scale", "log_escape_time"),
        ]
    return specs


def transform(x: str, y: str, init_scale: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
    """(X, Y, usable mask) for a fit: the coordinates of the points and which points count."""
    init_scale = np.asarray(init_scale, dtype=np.float64)
    t = np.asarray(t, dtype=np.float64)
    ok = np.isfinite(init_scale) & (init_scale > 0) & np.isfinite(t) & (t > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        if x == "log_init_scale":
            xs = np.log(init_scale)
        elif x == "log_inv_init_scale":
            xs = np.log(1.0 / init_scale)
        elif x == "log_log_inv_init_scale":
            ok &= init_scale < 1.0
            xs = np.log(np.log(1.0 / init_scale))
        else:
            raise ValueError(f"unknown fit x {x!r}")
        ys = np.log(t) if y == "log_escape_time" else t
    ok &= np.isfinite(xs) & np.isfinite(ys)
    return xs, ys, ok


def fit_group(
    init_scale: np.ndarray,
    seed: np.ndarray,
    escape_time: np.ndarray,
    *,
    x: str,
    y: str,
    min_decades: float = 2.0,
    confidence: float = 0.95,
) -> dict:
    """Slope, intercept, interval and counts of one fit (see the module docstring)."""
    xs, ys, ok = transform(x, y, init_scale, escape_time)
    init_scale = np.asarray(init_scale, dtype=np.float64)
    seed = np.asarray(seed)
    per_seed = []
    used = np.zeros(len(xs), dtype=bool)
    for m in _by_seed(seed, ok):
        a = init_scale[m]
        if len(np.unique(a)) < 2 or np.log10(a.max() / a.min()) < min_decades - 1e-9:
            continue
        slope, intercept = np.polyfit(xs[m], ys[m], 1)
        per_seed.append((slope, intercept, m))
        used[m] = True
    out = {
        "slope": None,
        "intercept": None,
        "ci_low": None,
        "ci_high": None,
        "ci_method": None,
        "n_points": int(used.sum()),
        "n_seeds": len(per_seed),
        "init_scale_min": float(init_scale[used].min()) if used.any() else None,
        "init_scale_max": float(init_scale[used].max()) if used.any() else None,
    }
    if len(per_seed) >= 2:
        slopes = np.array([p[0] for p in per_seed])
        n = len(slopes)
        mean = float(slopes.mean())
        half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * slopes.std(ddof=1) / np.sqrt(n))
        out |= {
            "slope": mean,
            "intercept": float(np.mean([p[1] for p in per_seed])),
            "ci_low": mean - half,
            "ci_high": mean + half,
            "ci_method": "seeds_t",
        }
    elif len(per_seed) == 1:
        slope, intercept, m = per_seed[0]
        out |= {"slope": float(slope), "intercept": float(intercept)}
        n = len(m)
        if n >= 3:
            res = stats.linregress(xs[m], ys[m])
            half = float(stats.t.ppf(0.5 + confidence / 2, n - 2) * res.stderr)
            out |= {"ci_low": slope - half, "ci_high": slope + half, "ci_method": "ols_t"}
    return out


def _by_seed(seed: np.ndarray, ok: np.ndarray) -> list[np.ndarray]:
    """Indices of the ``ok`` points of each seed (ascending), seeds in order of first
    appearance: one sort, where a mask per seed would cost seeds x points."""
    idx = np.flatnonzero(ok)
    codes, _ = pd.factorize(seed[idx])  # a NULL seed (-1) is no seed: left out
    idx, codes = idx[codes >= 0], codes[codes >= 0]
    order = np.argsort(codes, kind="stable")
    return np.split(idx[order], np.flatnonzero(np.diff(codes[order])) + 1) if len(idx) else []


def fit_scaling(
    df: pd.DataFrame,
    *,
    group_axes: Sequence[str] = (),
    eps: float = 0.5,
    min_decades: float = 2.0,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Scaling fits of a frame of runs (``depth, init_scale, seed, escape_time`` + ``group_axes``).

    ``df`` holds the runs to fit (already filtered: regimes, init-scale range).
    Returns one row per (group, fit) with the columns of ``storage.schema.SCALING_FITS``.
    """
    keys = ["depth", *[a for a in group_axes if a != "depth"]]
    rows = []
    if len(df):
        for key, g in df.groupby(keys, dropna=False, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            depth = int(key[0])
            for x, y in fit_specs(depth):
                res = fit_group(
                    g["init_scale"].to_numpy(),
                    g["seed"].to_numpy(),
                    g["escape_time"].to_numpy(),
                    x=x,
                    y=y,
                    min_decades=min_decades,
                    confidence=confidence,
                )
                slope, law = theory(depth, x)
                row = {
                    "depth": depth,
                    "x": x,
                    "y": y,
                    "theory_slope": slope,
                    "theory": law,
                    "eps": eps,
                    "confidence": confidence,
                    **res,
                }
                row.update({k: _scalar(v) for k, v in zip(keys[1:], key[1:])})
                rows.append(row)
    out = pd.DataFrame(rows, columns=FIT_COLUMNS)
    return out


def _scalar(v):
    if isinstance(v, float) and np.isnan(v):
        return None
    return v.item() if hasattr(v, "item") else v
