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

from dataclasses import dataclass, fields, replace

import numpy as np
import pandas as pd
from phasesweep.analysis._series import Series, pairwise_sums

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
    return [
        Plateau(float(level), float(start), float(end), float(drop), float(c))
        for level, start, end, drop, c in zip(
            found.level, found.start, found.end, found.drop_frac, found.contrast, strict=True
        )
    ]


@dataclass(frozen=True)
class _Found:
    """Plateaus of many runs, (P,) each, sorted by run and then time: ``run`` indexes the
    runs of the series; the others are :class:`Plateau`'s fields."""

    run: np.ndarray
    level: np.ndarray
    start: np.ndarray
    end: np.ndarray
    drop_frac: np.ndarray
    contrast: np.ndarray

    def take(self, i: np.ndarray) -> _Found:
        return _Found(*(getattr(self, f.name)[i] for f in fields(self)))


def _detect_all(
    s: Series,
    column: str,
    *,
    contrast: float,
    min_drop: float,
    min_duration_ratio: float,
    floor: float,
    skip: np.ndarray | None = None,
) -> _Found:
    """The plateaus of every run of ``s`` (finite rows, sorted by time); ``skip``: (R,)
    bool, runs left out.

    The detector's first stage runs on all runs at once: the rate ``log r`` of every
    segment (log-loss envelope over time, as :func:`detect_plateaus` describes) and its
    peaks, found by one ``find_peaks`` over the runs' rates laid end to end with ``+inf``
    between them (a peak's prominence then stops at its own run's ends, as it would on
    the run alone). The selection among the candidate peaks (:func:`_select`) then runs
    on all runs with a candidate at once too.
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
        return _Found(np.zeros(0, dtype=np.int64), *(np.zeros(0) for _ in range(5)))
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
    # imported here: scipy.signal takes ~1 s, which plot, report and analyze's driver
    # (its workers detect) would spend for nothing
    from scipy.signal import find_peaks, peak_prominences

    # find_peaks(line, prominence=log(contrast)) without the +inf peaks, whose prominences
    # would each take a walk over the whole line
    peaks, _ = find_peaks(line)
    peaks = peaks[np.isfinite(line[peaks])]
    prominence = peak_prominences(line, peaks)[0]
    strong = prominence >= np.log(contrast)
    peaks, prominence = peaks[strong], prominence[strong]
    owner = np.searchsorted(offset, peaks, side="right") - 1
    found = _select(
        _Candidates(owner, peaks - offset[owner] - 1, prominence),
        _Curves(starts[runs_in], seg_start, n_seg, time, ell, env, log_rate),
        contrast=contrast,
        min_drop=min_drop,
        min_duration_ratio=min_duration_ratio,
    )
    return replace(found, run=runs_in[found.run])


@dataclass(frozen=True)
class _Curves:
    """The first stage's numbers of the runs with rows: run ``i``'s rows (``time``, ``ell``
    = clipped log loss, ``env`` = its running minimum) are ``rows[i] + j`` for its local
    rows ``j = 0 … n_seg[i]``, its segments (``log_rate``, between rows j and j + 1)
    ``segs[i] + j`` for ``j < n_seg[i]``."""

    rows: np.ndarray  # (I,) int64
    segs: np.ndarray  # (I,) int64
    n_seg: np.ndarray  # (I,) int64
    time: np.ndarray  # (N,) float64
    ell: np.ndarray  # (N,) float64
    env: np.ndarray  # (N,) float64
    log_rate: np.ndarray  # (S,) float64


@dataclass(frozen=True)
class _Candidates:
    """Candidate drops, (C,) each, sorted by run and then segment: the run (an index of
    :class:`_Curves`), the peak's local segment and its prominence."""

    run: np.ndarray
    peak: np.ndarray
    prominence: np.ndarray


def _select(
    cand: _Candidates,
    curves: _Curves,
    *,
    contrast: float,
    min_drop: float,
    min_duration_ratio: float,
) -> _Found:
    """The plateaus of every run from its candidate drops, ``run`` an index of ``curves``:
    while some of a run's drops fail the guards (:func:`_plateaus_for`), its weakest
    failing one (lowest prominence; the first of equal ones) is dropped, and its plateau
    merges into the next; a run that passes keeps its drops' plateaus. Each round handles
    every run still selecting at once."""
    kept = np.ones(len(cand.run), dtype=bool)
    selecting = np.ones(len(curves.rows), dtype=bool)
    passed: list[_Found] = []
    while True:
        now = np.flatnonzero(kept & selecting[cand.run])
        if not len(now):
            break
        run = cand.run[now]
        found, failing = _plateaus_for(
            run,
            cand.peak[now],
            curves,
            contrast=contrast,
            min_drop=min_drop,
            min_duration_ratio=min_duration_ratio,
        )
        fails = np.zeros(len(selecting), dtype=bool)
        fails[run[failing]] = True
        done = ~fails[run]
        passed.append(replace(found.take(done), run=now[done]))
        selecting[run[done]] = False
        bad = np.flatnonzero(failing)
        bad = bad[np.lexsort((bad, cand.prominence[now[bad]], run[bad]))]
        worst = bad[np.diff(run[bad], prepend=-1) != 0]  # the first of each run
        kept[now[worst]] = False
    if not passed:
        return _Found(np.zeros(0, dtype=np.int64), *(np.zeros(0) for _ in range(5)))
    every = _Found(*(np.concatenate([getattr(f, x.name) for f in passed]) for x in fields(_Found)))
    every = every.take(np.argsort(every.run, kind="stable"))  # candidates in run, time order
    return replace(every, run=cand.run[every.run])


def _plateaus_for(
    run: np.ndarray,
    peak: np.ndarray,
    c: _Curves,
    *,
    contrast: float,
    min_drop: float,
    min_duration_ratio: float,
) -> tuple[_Found, np.ndarray]:
    """The plateaus ending in the drops ``peak`` (local segments, (K,), sorted by ``run``
    and then segment: the drops kept so far of the runs selecting), and which fail the
    guards, (K,) bool. ``_Found.run`` holds positions in ``peak``.

    Each run's numbers are those of a loop over its drops, to the bit: sums as ``np.sum``
    sums (:func:`series.pairwise_sums`), the first of equal minima."""
    k = len(run)
    same = np.diff(run, prepend=-1) == 0  # a drop of the same run comes before
    lo = np.where(same, np.concatenate([[-1], peak[:-1]]), -1) + 1
    hi = peak - 1  # the segments strictly between the previous drop and this one
    rows, segs = c.rows[run], c.segs[run]
    log_c = np.log(contrast)
    rate_p = c.log_rate[segs + peak]
    thr = rate_p - log_c
    # v: the slowest segment between the drops (the first of equal ones)
    own, j = _ranges(lo, hi - lo + 1)
    rates = c.log_rate[segs[own] + j]
    slowest = np.minimum.reduceat(rates, np.cumsum(hi - lo + 1) - (hi - lo + 1))
    v = _first(rates == slowest[own], own, j, k, -1)
    # the plateau: the segments a..b around v (between the drops) with a rate <= thr
    fast = ~(rates <= thr[own])
    a = _last(fast & (j < v[own]), own, j, k, lo - 1) + 1
    b = _first(fast & (j > v[own]), own, j, k, hi + 1) - 1
    # the drop lasts while the rate stays above thr: until the first slow segment after it
    own, j = _ranges(peak + 1, c.n_seg[run] - peak - 1)
    k_end = _first(c.log_rate[segs[own] + j] <= thr[own], own, j, k, c.n_seg[run])
    start, end, drop_end = c.time[rows + a], c.time[rows + b + 1], c.time[rows + k_end]
    level = np.exp(pairwise_sums(c.ell, rows + a, b + 2 - a) / (b + 2 - a))
    ratio = np.exp(np.minimum(rate_p - c.log_rate[segs + v], np.log(MAX_CONTRAST)))
    steep = 1.0 - np.exp(c.env[rows + k_end] - c.env[rows + b + 1])
    # mean rate over the whole plateau against the mean rate over the core of the drop
    # (its segments within sqrt(contrast) of the peak rate): the steep part's ramps
    # would dilute a short drop between two close saddles
    rate_plateau = (c.env[rows + a] - c.env[rows + b + 1]) / (end - start)
    own, j = _ranges(b + 1, k_end - b - 1)
    core = c.log_rate[segs[own] + j] >= (rate_p - 0.5 * log_c)[own]
    own, at = own[core], rows[own[core]] + j[core]
    n_core = np.bincount(own, minlength=k)
    first_core = np.cumsum(n_core) - n_core
    fall = pairwise_sums(c.env[at] - c.env[at + 1], first_core, n_core)
    span = pairwise_sums(c.time[at + 1] - c.time[at], first_core, n_core)
    rate_core = fall / np.maximum(span, 1e-300)
    steep[rate_core < contrast * rate_plateau] = 0.0  # not an acceleration on average: noise
    # drop_frac: to the next plateau's level, or the run's final level
    final = np.exp(c.env[rows + c.n_seg[run]])
    nxt = np.where(np.diff(run, append=-1) == 0, np.append(level[1:], 0.0), final)
    drop_frac = 1.0 - nxt / level
    least = np.where(steep < drop_frac, steep, drop_frac)  # min(drop_frac, steep)
    failing = (least < min_drop) | (end - start < min_duration_ratio * (drop_end - end))
    return _Found(np.arange(k), level, start, end, drop_frac, ratio), failing


def _ranges(first: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranges ``first[i] … first[i] + length[i] - 1`` laid end to end: (their index i, the
    value) per element; ``length`` may be 0."""
    owner = np.repeat(np.arange(len(first)), length)
    within = np.arange(len(owner)) - (np.cumsum(length) - length)[owner]
    return owner, first[owner] + within


def _first(flag: np.ndarray, owner: np.ndarray, j: np.ndarray, n: int, default) -> np.ndarray:
    """(n,) per range: the first ``j`` where ``flag`` holds (``owner``, ``j``: of
    :func:`_ranges`), else ``default`` (a scalar or (n,))."""
    out = np.broadcast_to(np.asarray(default, dtype=np.int64), (n,)).copy()
    o, jj = owner[flag], j[flag]
    head = np.diff(o, prepend=-1) != 0
    out[o[head]] = jj[head]
    return out


def _last(flag: np.ndarray, owner: np.ndarray, j: np.ndarray, n: int, default) -> np.ndarray:
    """As :func:`_first`, the last ``j`` where ``flag`` holds."""
    out = np.broadcast_to(np.asarray(default, dtype=np.int64), (n,)).copy()
    o, jj = owner[flag], j[flag]
    tail = np.diff(o, append=n) != 0
    out[o[tail]] = jj[tail]
    return out


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
    found = _detect_all(
        s,
        column,
        contrast=contrast,
        min_drop=min_drop,
        min_duration_ratio=min_duration_ratio,
        floor=floor,
        skip=skip,
    )
    counts = np.bincount(found.run, minlength=s.n_runs).astype(np.int64)
    if skip is not None:
        counts[skip] = -1
    first = np.flatnonzero(np.diff(found.run, prepend=-1))  # each run's first plateau
    index = np.arange(len(found.run)) - np.repeat(first, np.diff(first, append=len(found.run)))
    frame = pd.DataFrame(
        {
            "run_id": s.run_ids[found.run].astype(object),
            "level": found.level,
            "start": found.start,
            "end": found.end,
            "duration": found.end - found.start,
            "plateau_index": index.astype(np.int64),
            "drop_frac": found.drop_frac,
            "contrast": found.contrast,
        },
        columns=PLATEAU_COLUMNS,
    )
    return frame, counts
