"""Escape times: when a run's loss leaves its initial plateau, for good.

Definition (per run, on the logged train loss ``L(t)``, ``t`` = gradient-flow time):

- ``L0`` is the first logged loss (step 0), ``L_end`` the last finite one.
- The threshold is ``theta = L0 - eps * (L0 - L_end)``: relative to the run's own
  loss range, so runs with different initial losses or floors compare.
- The crossing must *persist*: it is the crossing after the last logged point at
  which ``L >= theta``, so every later logged point is below the threshold. A
  transient dip that comes back up does not count.
- The time is interpolated between the two logged points that bracket that
  crossing, with ``log L`` linear in ``t`` (exact for an exponential decay; on
  log-spaced logging with ~15 % between points the error on a sigmoidal drop
  is below ~2 %). The runs table's ``t_cross_*`` columns are exact first
  crossings (detected at every step) of fixed fractions of ``L0``, for
  comparison.
- NULL (NaN here), never a made-up number, if the run has fewer than two finite
  points, a non-positive ``L0``, or a total decrease ``L0 - L_end`` below
  ``min_drop * L0``: a run stuck at a saddle for its whole training has no
  escape time (its relative threshold would sit inside the round-off noise of
  the plateau). Diverged runs get NULL from the caller.

Everything is vectorized over runs (see :mod:`analysis._series`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from phasesweep.analysis._series import Series, segment_last_true


def escape_times(
    series: Series, eps: Sequence[float], *, column: str = "train_loss", min_drop: float = 0.05
) -> np.ndarray:
    """(R, len(eps)) escape times of every run of ``series`` at every ``eps`` (NaN: none).

    See the module docstring for the definition. Non-finite losses are ignored.
    """
    s = series.select(column)
    loss, t = s.values[column], s.time
    n_runs = s.n_runs
    out = np.full((n_runs, len(eps)), np.nan)
    if n_runs == 0:
        return out
    n = s.lengths
    has = n >= 2
    l0 = np.full(n_runs, np.nan)
    lend = np.full(n_runs, np.nan)
    l0[has] = loss[s.starts[has]]
    lend[has] = loss[s.ends[has] - 1]
    with np.errstate(invalid="ignore"):
        valid = has & (l0 > 0) & (l0 - lend >= min_drop * l0) & (l0 > lend)
    run_of_row = s.run_index()
    for k, e in enumerate(eps):
        if not 0 < e < 1:
            raise ValueError(f"eps must be in (0, 1), got {e}")
        theta = l0 - e * (l0 - lend)
        with np.errstate(invalid="ignore"):
            above = loss >= theta[run_of_row]
        j = segment_last_true(above, s.starts, s.ends)
        ok = valid & (j >= 0) & (j + 1 < s.ends)
        jj = j[ok]
        out[ok, k] = _interpolate(t[jj], t[jj + 1], loss[jj], loss[jj + 1], theta[ok])
    return out


def _interpolate(
    t0: np.ndarray, t1: np.ndarray, l0: np.ndarray, l1: np.ndarray, theta: np.ndarray
) -> np.ndarray:
    """Time at which the loss, between (t0, l0 >= theta) and (t1, l1 < theta), hits theta.

    ``log L`` is interpolated linearly in ``t`` (exact for an exponential decay);
    the loss itself if ``l1 <= 0``.
    """
    positive = (l1 > 0) & (theta > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac_log = (np.log(l0) - np.log(theta)) / (np.log(l0) - np.log(l1))
    frac_lin = (l0 - theta) / (l0 - l1)
    frac = np.clip(np.where(positive, frac_log, frac_lin), 0.0, 1.0)
    return t0 + frac * (t1 - t0)


def escape_time(
    t: np.ndarray, loss: np.ndarray, eps: float = 0.5, *, min_drop: float = 0.05
) -> float:
    """Escape time of one run (a convenience wrapper of :func:`escape_times`); NaN if none."""
    t = np.asarray(t, dtype=np.float64)
    series = Series(
        run_ids=np.array(["run"], dtype=object),
        starts=np.array([0]),
        ends=np.array([len(t)]),
        time=t,
        values={"train_loss": np.asarray(loss, dtype=np.float64)},
    )
    return float(escape_times(series, [eps], min_drop=min_drop)[0, 0])
