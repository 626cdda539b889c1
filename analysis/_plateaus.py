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
from scipy.signal import find_peaks

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
    if contrast <= 1:
        raise ValueError(f"contrast must exceed 1, got {contrast}")
    t = np.asarray(t, dtype=np.float64)
    loss = np.asarray(loss, dtype=np.float64)
    ok = np.isfinite(t) & np.isfinite(loss)
    t, loss = t[ok], loss[ok]
    order = np.argsort(t, kind="stable")
    t, loss = t[order], loss[order]
    t, first = np.unique(t, return_index=True)
    loss = loss[first]
    if len(t) < 3 or loss[0] <= 0:
        return []
    ell = np.log(np.maximum(loss, floor * loss[0]))
    env = np.minimum.accumulate(ell)
    rate = (env[:-1] - env[1:]) / np.diff(t)  # >= 0, one per segment
    log_rate = np.log(np.maximum(rate, _TINY))
    # The end of training closes a drop still in progress.
    padded = np.append(log_rate, np.log(_TINY))
    peaks, props = find_peaks(padded, prominence=np.log(contrast))
    kept = list(peaks)
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
        prom = dict(zip(peaks, props["prominences"]))
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
    for p in kept:
        lo, hi = prev + 1, p - 1  # segments strictly between the previous drop and this one
        v = lo + int(np.argmin(log_rate[lo : hi + 1]))
        thr = log_rate[p] - np.log(contrast)
        a = b = v
        while a - 1 >= lo and log_rate[a - 1] <= thr:
            a -= 1
        while b + 1 <= hi and log_rate[b + 1] <= thr:
            b += 1
        # the drop lasts while the rate stays above thr: until the first slow segment after p
        slow = np.nonzero(log_rate[p + 1 :] <= thr)[0]
        drop_end = float(t[p + 1 + slow[0]]) if len(slow) else float(t[-1])
        level = float(np.exp(ell[a : b + 2].mean()))
        c = float(np.exp(min(log_rate[p] - log_rate[v], np.log(MAX_CONTRAST))))
        k_end = p + 1 + slow[0] if len(slow) else len(t) - 1
        steep = 1.0 - float(np.exp(env[k_end] - env[b + 1]))
        # mean rate over the whole plateau against the mean rate over the core of the drop
        # (its segments within sqrt(contrast) of the peak rate): the steep part's ramps
        # would dilute a short drop between two close saddles
        rate_plateau = (env[a] - env[b + 1]) / (t[b + 1] - t[a])
        seg = np.arange(b + 1, k_end)
        core = seg[log_rate[seg] >= log_rate[p] - 0.5 * np.log(contrast)]
        dt = np.diff(t)
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
    rows: list[tuple] = []
    loss = s.values[column]
    for r in range(s.n_runs):
        if skip is not None and skip[r]:
            counts[r] = -1
            continue
        sl = slice(s.starts[r], s.ends[r])
        found = detect_plateaus(
            s.time[sl],
            loss[sl],
            contrast=contrast,
            min_drop=min_drop,
            min_duration_ratio=min_duration_ratio,
            floor=floor,
        )
        counts[r] = len(found)
        rid = s.run_ids[r]
        rows.extend(
            (rid, p.level, p.start, p.end, p.duration, i, p.drop_frac, p.contrast)
            for i, p in enumerate(found)
        )
    frame = pd.DataFrame.from_records(rows, columns=PLATEAU_COLUMNS)
    frame = frame.astype({"run_id": object, "plateau_index": np.int64})
    return frame, counts
