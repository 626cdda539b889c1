"""Plateau detection: the saddles a run visits, from its logged loss curve.

The detector looks at the *loss-decay rate* in gradient-flow time,
``r(t) = -d log L / dt``, estimated between consecutive logged points on the
running minimum of ``log L``. Two facts make it work without a time scale:

- Linear (lazy, kernel) dynamics never accelerate: their loss is a sum of
  decaying exponentials, ``log L`` is convex in ``t`` and ``r(t)`` is
  non-increasing, for any sampling of ``t``. So a lazy run has no plateau,
  however long its loss looks flat on log-log axes.
- A saddle is left by an acceleration: the rate is tiny near the saddle and
  grows until the drop, then falls again near the next saddle (or minimum).

So a *drop* is a peak of ``log r`` (segment by segment) whose prominence (in
scipy's sense: its height above the higher of the two valleys that separate it
from higher peaks) is at least ``log(contrast)``. The *plateau* ending in that
drop is the stretch around the deepest valley before the peak (after the
previous drop) where the rate stays below ``thr = peak rate / contrast``; the
drop's *steep part* runs from the plateau's end until the rate falls back below
``thr``. A candidate counts only if

- the loss falls by at least ``min_drop`` (relative) over the steep part, and
  from the plateau's level to the next plateau's level (or the final loss);
- the plateau lasts at least ``min_duration_ratio`` times the steep part:
  saddles are left quickly compared to the time spent near them.

- the drop's core (its segments within √contrast of the peak rate) falls on average
  at least ``contrast`` times faster than the plateau (its mean rate): a steady
  decay cut up by noise does not accelerate on average. The core, not the whole
  steep part, so that a short plateau between two close saddles is not diluted by
  the ramps of its drop.

The guards are local, and they reject the short flat bits and rate spikes that
noise cuts out of a steady decay. Failing candidates are dropped one at a time
(lowest prominence first; its plateau merges into the next) until all pass.
The plateau's ``level`` is the geometric mean of the logged losses on it,
``start``/``end`` are logged times, ``duration = end - start``, ``drop_frac`` is
``1 - next level / level`` and ``contrast`` the peak rate over the plateau's
lowest rate. (The detector is meant for full-batch GD curves; SGD noise of a
percent or more can still fake plateaus: raise ``min_drop`` for noisy runs.)

Conventions:

- The plateau at the initial loss (the saddle at the origin of a small
  initialization) counts: a run with three drops has three plateaus, the first at
  ``L0``. ``n_plateaus`` is the number of drops.
- A flat stretch that no drop ends (a run still stuck at a saddle when training
  stopped, or converged at its minimum) is not a plateau.
- A drop still in progress at the end of training counts if the loss has
  already fallen by ``min_drop``.
- Losses below ``floor * L0`` are clipped (float64 round-off makes the log of a
  converged loss noisy); non-finite points are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from phasesweep.analysis._series import Series
from scipy.signal import find_peaks, peak_prominences

_TINY = 1e-300
#: contrasts are reported with the plateau rate floored at this fraction of the peak rate.
MAX_CONTRAST = 1e12


@dataclass(frozen=True)
class Plateau:
    level: float  # geometric mean of the logged loss on the plateau
    start: float  # gradient-flow time
    end: float
    drop_frac: float  # 1 - (next level or final loss) / level
    contrast: float  # peak rate of the drop / lowest rate on the plateau

    @property
    def duration(self) -> float:
        return self.end - self.start


def detect_plateaus(
    t: np.ndarray,
    loss: np.ndarray,
    *,
    contrast: float = 3.0,
    min_drop: float = 0.1,
    min_duration_ratio: float = 0.2,
    floor: float = 1e-12,
) -> list[Plateau]:
    """Plateaus of one loss curve, in time order (see the module docstring)."""
    t = np.asarray(t, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    series = Series(
        run_ids=np.array(["run"], dtype=object),
        starts=np.array([0]),
        ends=np.array([len(t)]),
        time=t[order],
        values={"loss": np.asarray(loss, dtype=np.float64)[order]},
    )
    found = _detect_all(
        series.select("loss"),
        "loss",
        contrast=contrast,
        min_drop=min_drop,
        min_duration_ratio=min_duration_ratio,
        floor=floor,
    )
    return dict(found).get(0, [])


def _detect_all(
    s: Series,
    column: str,
    *,
    contrast: float,
    min_drop: float,
    min_duration_ratio: float,
    floor: float,
    skip: np.ndarray | None = None,
):
    """``(run, plateaus)`` of every run of ``s`` (finite rows, sorted by time) that has a
    plateau, in run order; ``skip``: (R,) bool, runs left out.

    The detector's first stage runs on all runs at once: the rate ``log r`` of every
    segment (log-loss envelope over time, as :func:`detect_plateaus` describes) and its
    peaks, found by one ``find_peaks`` over the runs' rates laid end to end with ``+inf``
    between them (a peak's prominence then stops at its own run's ends, as it would on
    the run alone). Only runs with a candidate peak go through the per-run selection.
    """
    if contrast <= 1:
        raise ValueError(f"contrast must exceed 1, got {contrast}")
    time, loss = s.time, s.values[column]
    run = s.run_index()
    # one row per distinct time of a run (the first of equal ones)
    first = np.ones(len(time), dtype=bool)
    first[1:] = (time[1:] != time[:-1]) | (run[1:] != run[:-1])
    time, loss, run = time[first], loss[first], run[first]
    counts = np.bincount(run, minlength=s.n_runs)
    starts = np.cumsum(counts) - counts
    ok = counts >= 3
    ok[ok] = loss[starts[ok]] > 0
    if skip is not None:
        ok &= ~skip
    rows = ok[run]
    time, loss, run = time[rows], loss[rows], run[rows]
    if not len(time):
        return
    counts = np.bincount(run, minlength=s.n_runs)
    starts = np.cumsum(counts) - counts
    loss0 = loss[starts[run]]
    ell = np.log(np.maximum(loss, floor * loss0))
    env = pd.Series(ell).groupby(run).cummin().to_numpy()
    # segments: consecutive rows of a run
    seg = np.flatnonzero(run[1:] == run[:-1])
    rate = (env[seg] - env[seg + 1]) / (time[seg + 1] - time[seg])
    log_rate = np.log(np.maximum(rate, _TINY))
    # laid out per run as [+inf, its segments' log rates..., log(_TINY)]
    runs_in = np.flatnonzero(counts)
    n_seg = counts[runs_in] - 1
    width = n_seg + 2
    offset = np.cumsum(width) - width  # position of each run's +inf
    line = np.full(int(width.sum()), np.log(_TINY))
    line[offset] = np.inf
    seg_run = np.repeat(np.arange(len(runs_in)), n_seg)
    seg_start = np.cumsum(n_seg) - n_seg
    local = np.arange(len(seg)) - seg_start[seg_run]
    line[offset[seg_run] + 1 + local] = log_rate
    # find_peaks(line, prominence=log(contrast)) without the +inf peaks, whose prominences
    # would each take a walk over the whole line
    peaks, _ = find_peaks(line)
    peaks = peaks[np.isfinite(line[peaks])]
    prominence = peak_prominences(line, peaks)[0]
    strong = prominence >= np.log(contrast)
    peaks, prominence = peaks[strong], prominence[strong]
    owner = np.searchsorted(offset, peaks, side="right") - 1
    bounds = np.searchsorted(owner, np.arange(len(runs_in) + 1))
    for i in np.flatnonzero(np.diff(bounds)):
        r = runs_in[i]
        rows_r = slice(starts[r], starts[r] + counts[r])
        segs = slice(seg_start[i], seg_start[i] + n_seg[i])
        found = _select(
            peaks[bounds[i] : bounds[i + 1]] - offset[i] - 1,
            prominence[bounds[i] : bounds[i + 1]],
            log_rate[segs],
            ell[rows_r],
            env[rows_r],
            time[rows_r],
            contrast=contrast,
            min_drop=min_drop,
            min_duration_ratio=min_duration_ratio,
        )
        if found:
            yield r, found


def _select(
    peaks: np.ndarray,
    prominences: np.ndarray,
    log_rate: np.ndarray,
    ell: np.ndarray,
    env: np.ndarray,
    t: np.ndarray,
    *,
    contrast: float,
    min_drop: float,
    min_duration_ratio: float,
) -> list[Plateau]:
    """The plateaus of one run from its candidate drops ``peaks`` (segment indices, with
    their ``prominences``): failing candidates are dropped, weakest first."""
    kept = list(peaks)
    prom = dict(zip(peaks, prominences))
    final_level = float(np.exp(env[-1]))
    while kept:
        plateaus, drop_times = _plateaus_for(kept, log_rate, ell, env, t, contrast, final_level)
        failing = [
            i
            for i, (p, (d, steep)) in enumerate(zip(plateaus, drop_times))
            if min(p.drop_frac, steep) < min_drop or p.duration < min_duration_ratio * d
        ]
        if not failing:
            return plateaus
        # Drop the weakest failing peak; its plateau merges with the next one.
        worst = min(failing, key=lambda i: prom[kept[i]])
        kept.pop(worst)
    return []


def _plateaus_for(
    kept: list[int],
    log_rate: np.ndarray,
    ell: np.ndarray,
    env: np.ndarray,
    t: np.ndarray,
    contrast: float,
    final_level: float,
) -> tuple[list[Plateau], list[float]]:
    """Plateaus ending in the drops ``kept`` (segment indices), and each drop's duration."""
    spans = []
    prev = -1
    rates = log_rate.tolist()  # scalar reads, as Python floats (the same doubles)
    log_c = np.log(contrast)
    dt = np.diff(t)
    for p in kept:
        lo, hi = prev + 1, p - 1  # segments strictly between the previous drop and this one
        v = lo + int(np.argmin(log_rate[lo : hi + 1]))
        thr = rates[p] - log_c
        a = b = v
        while a - 1 >= lo and rates[a - 1] <= thr:
            a -= 1
        while b + 1 <= hi and rates[b + 1] <= thr:
            b += 1
        # the drop lasts while the rate stays above thr: until the first slow segment after p
        slow = np.flatnonzero(log_rate[p + 1 :] <= thr)
        k_end = p + 1 + int(slow[0]) if len(slow) else len(t) - 1
        drop_end = float(t[k_end])
        level = float(np.exp(ell[a : b + 2].sum() / (b + 2 - a)))
        c = float(np.exp(min(rates[p] - rates[v], np.log(MAX_CONTRAST))))
        steep = 1.0 - float(np.exp(env[k_end] - env[b + 1]))
        # mean rate over the whole plateau against the mean rate over the core of the drop
        # (its segments within sqrt(contrast) of the peak rate): the steep part's ramps
        # would dilute a short drop between two close saddles
        rate_plateau = (env[a] - env[b + 1]) / (t[b + 1] - t[a])
        core = b + 1 + np.flatnonzero(log_rate[b + 1 : k_end] >= rates[p] - 0.5 * log_c)
        rate_core = (env[core] - env[core + 1]).sum() / max(dt[core].sum(), 1e-300)
        if rate_core < contrast * rate_plateau:
            steep = 0.0  # not an acceleration on average: noise
        spans.append((level, float(t[a]), float(t[b + 1]), c, drop_end, steep))
        prev = p
    out, drop_times = [], []
    for i, (level, start, end, c, drop_end, steep) in enumerate(spans):
        nxt = spans[i + 1][0] if i + 1 < len(spans) else final_level
        out.append(Plateau(level, start, end, 1.0 - nxt / level, c))
        drop_times.append((drop_end - end, steep))
    return out, drop_times


PLATEAU_COLUMNS = [
    "run_id",
    "level",
    "start",
    "end",
    "duration",
    "plateau_index",
    "drop_frac",
    "contrast",
]


def plateau_frame(
    series: Series,
    *,
    column: str = "train_loss",
    contrast: float = 3.0,
    min_drop: float = 0.1,
    min_duration_ratio: float = 0.2,
    floor: float = 1e-12,
    skip: np.ndarray | None = None,
) -> tuple[pd.DataFrame, np.ndarray]:
    """Plateaus of every run of ``series`` as a frame (``PLATEAU_COLUMNS``), and (R,) counts.

    ``skip``: (R,) bool, runs to leave out (e.g. diverged); their count is -1.
    """
    s = series.select(column)
    counts = np.zeros(s.n_runs, dtype=np.int64)
    if skip is not None:
        counts[skip] = -1
    rows: list[tuple] = []
    for r, found in _detect_all(
        s,
        column,
        contrast=contrast,
        min_drop=min_drop,
        min_duration_ratio=min_duration_ratio,
        floor=floor,
        skip=skip,
    ):
        counts[r] = len(found)
        rid = s.run_ids[r]
        rows.extend(
            (rid, p.level, p.start, p.end, p.duration, i, p.drop_frac, p.contrast)
            for i, p in enumerate(found)
        )
    frame = pd.DataFrame.from_records(rows, columns=PLATEAU_COLUMNS)
    frame = frame.astype({"run_id": object, "plateau_index": np.int64})
    return frame, counts
