"""Many runs' time series packed into flat numpy arrays (the shape every per-run metric uses).

A :class:`Series` holds the logged points of many runs back to back, sorted by
run and then by gradient-flow time; ``starts[r]:ends[r]`` is run ``r``'s slice.
Per-run computations are vectorized over that layout (``np.*.reduceat``) instead
of looping over runs in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from phasesweep.analysis.config import REACH_RTOL


@dataclass(frozen=True)
class Series:
    """Logged points of ``len(run_ids)`` runs; rows sorted by (run, time)."""

    run_ids: np.ndarray  # (R,) object: run ids, in the order of the slices
    starts: np.ndarray  # (R,) int64: first row of each run
    ends: np.ndarray  # (R,) int64: one past the last row of each run
    time: np.ndarray  # (N,) float64: gradient-flow time
    values: dict[str, np.ndarray]  # column -> (N,) float64

    @property
    def n_runs(self) -> int:
        return len(self.run_ids)

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.starts

    def run_index(self) -> np.ndarray:
        """(N,) index of the run of every row."""
        return np.repeat(np.arange(self.n_runs), self.lengths)

    def select(self, column: str) -> Series:
        """``column`` alone, on the rows where it and ``time`` are finite (per-run slices
        recomputed)."""
        keep = np.isfinite(self.values[column]) & np.isfinite(self.time)
        if keep.all():
            return Series(
                self.run_ids, self.starts, self.ends, self.time, {column: self.values[column]}
            )
        counts = segment_sum(keep.astype(np.int64), self.starts, self.ends)
        ends = np.cumsum(counts)
        return Series(
            run_ids=self.run_ids,
            starts=ends - counts,
            ends=ends,
            time=self.time[keep],
            values={column: self.values[column][keep]},
        )

    def run(self, r: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        s = slice(self.starts[r], self.ends[r])
        return self.time[s], {k: v[s] for k, v in self.values.items()}


def from_frame(df: pd.DataFrame, columns: list[str], run_ids: np.ndarray | None = None) -> Series:
    """Pack a long frame with ``run_id``, ``time`` and ``columns`` into a :class:`Series`.

    ``run_ids``: the runs (and their order) to include; runs without rows get an
    empty slice. Default: the runs present in ``df``, sorted. Rows of a run are sorted by
    time, then by ``step`` where the frame has it (else kept in their order).
    """
    present = df["run_id"].to_numpy(dtype=object)
    if run_ids is None:
        run_ids = np.sort(pd.unique(present))
    run_ids = np.asarray(run_ids, dtype=object)
    codes = pd.Categorical(present, categories=run_ids).codes.astype(np.int64)
    return _pack(run_ids, codes, {c: _floats(df[c]) for c in {"time", "step", *columns} & {*df}})


def from_arrow(table: pa.Table, columns: list[str], run_ids: np.ndarray) -> Series:
    """:func:`from_frame` of an Arrow table (``run_id``, ``time``, ``columns`` and maybe
    ``step``) for the runs ``run_ids``, without converting it to pandas."""
    run_ids = np.asarray(run_ids, dtype=object)
    found = pc.index_in(table["run_id"], value_set=pa.array(run_ids, pa.string()))
    codes = pc.fill_null(found, -1).to_numpy().astype(np.int64)
    wanted = {"time", "step", *columns} & set(table.column_names)
    return _pack(run_ids, codes, {c: _floats(table[c]) for c in wanted})


def _floats(values: pd.Series | pa.ChunkedArray) -> np.ndarray:
    """A column as float64 numpy, NULL as NaN."""
    if isinstance(values, pd.Series):
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    return pc.fill_null(values.cast(pa.float64()), np.nan).to_numpy()


def _pack(run_ids: np.ndarray, codes: np.ndarray, columns: dict[str, np.ndarray]) -> Series:
    """The :class:`Series` of rows whose run is ``run_ids[codes]`` (-1: left out), sorted by
    run, time and ``step`` (if given; else ties keep their order)."""
    keep = np.flatnonzero(codes >= 0)
    order = keep[np.argsort(codes[keep], kind="stable")]
    time = columns["time"][order]
    same_run = codes[order][1:] == codes[order][:-1]
    if not (time[1:] > time[:-1])[same_run].all():  # else already sorted (as a run logs)
        keys = [columns["time"][keep], codes[keep]]
        if "step" in columns:
            keys.insert(0, columns["step"][keep])
        order = keep[np.lexsort(keys)]
    counts = np.bincount(codes[order], minlength=len(run_ids)).astype(np.int64)
    ends = np.cumsum(counts)
    return Series(
        run_ids=run_ids,
        starts=ends - counts,
        ends=ends,
        time=columns["time"][order],
        values={c: v[order] for c, v in columns.items() if c not in ("time", "step")},
    )


def segment_sum(x: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sum of ``x[starts[r]:ends[r]]`` for every r (0 for an empty slice)."""
    cs = np.concatenate([np.zeros(1, dtype=x.dtype), np.cumsum(x)])
    return cs[ends] - cs[starts]


def pairwise_sums(x: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(n,) ``x[starts[i] : starts[i] + lengths[i]].sum()`` for every i, to the bit: the slices
    summed as ``np.sum`` sums a contiguous float64 array (numpy's pairwise summation: a plain
    loop below 8 values, 8 running sums up to 128 added in pairs, longer halves at a
    multiple of 8 recursively), vectorized over the slices instead of a call per slice.
    ``x``: (N,) float64; ``lengths`` may be 0 (sum 0.0)."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(len(starts))
    short = np.flatnonzero(lengths < 8)
    for k in range(7):
        i = short[lengths[short] > k]
        out[i] += x[starts[i] + k]
    block = np.flatnonzero((lengths >= 8) & (lengths <= 128))
    first, n = starts[block], lengths[block]
    whole = n - n % 8
    lanes = np.arange(8)
    acc = x[first[:, None] + lanes]
    for at in range(8, 128, 8):
        i = at < whole
        acc[i] += x[first[i, None] + at + lanes]
    total = ((acc[:, 0] + acc[:, 1]) + (acc[:, 2] + acc[:, 3])) + (
        (acc[:, 4] + acc[:, 5]) + (acc[:, 6] + acc[:, 7])
    )
    for k in range(7):
        i = whole + k < n
        total[i] += x[first[i] + whole[i] + k]
    out[block] = 0.0 + total
    long = np.flatnonzero(lengths > 128)
    if len(long):
        half = lengths[long] // 2
        half -= half % 8
        out[long] = pairwise_sums(x, starts[long], half) + pairwise_sums(
            x, starts[long] + half, lengths[long] - half
        )
    return out


def segment_last_true(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the last True of ``mask[starts[r]:ends[r]]`` for every r (-1 if none)."""
    idx = np.where(mask, np.arange(len(mask)), -1)
    run_max = np.maximum.accumulate(idx) if len(idx) else idx
    out = np.full(len(starts), -1, dtype=np.int64)
    has = ends > starts
    cand = run_max[ends[has] - 1]
    out[has] = np.where(cand >= starts[has], cand, -1)
    return out


def first(series: Series, column: str) -> np.ndarray:
    """(R,) the first value of ``column`` per run (NaN for a run without rows)."""
    out = np.full(series.n_runs, np.nan)
    has = series.lengths > 0
    out[has] = series.values[column][series.starts[has]]
    return out


def last(series: Series, column: str) -> np.ndarray:
    """(R,) the last value of ``column`` per run (NaN for a run without rows)."""
    out = np.full(series.n_runs, np.nan)
    has = series.lengths > 0
    out[has] = series.values[column][series.ends[has] - 1]
    return out


def last_finite(series: Series, column: str) -> np.ndarray:
    """(R,) the last finite value of ``column`` per run (NaN if it has none)."""
    return last(series.select(column), column)


def last_time_finite(series: Series, column: str) -> np.ndarray:
    """(R,) time of the last row with a finite ``column`` (NaN if none)."""
    s = series.select(column)
    out = np.full(s.n_runs, np.nan)
    has = s.lengths > 0
    out[has] = s.time[s.ends[has] - 1]
    return out


def value_at(series: Series, column: str, t: float) -> np.ndarray:
    """(R,) the value of ``column`` at gradient-flow time ``t`` per run (NaN: not reached).

    Among the rows where ``column`` is finite: the logged value at ``t`` itself, else
    interpolated linearly in ``log t`` between the two logged points around ``t`` (exact
    for a value linear in log t, the shape of log-spaced logging; linearly in ``t`` on the
    first segment, which starts at t = 0). A run whose last such point lies before
    ``t`` (by more than :data:`REACH_RTOL`) did not reach it: NaN, never an extrapolation.
    """
    s = series.select(column)
    out = np.full(s.n_runs, np.nan)
    if not len(s.time):
        return out
    time, v = s.time, s.values[column]
    j = segment_last_true(time <= t, s.starts, s.ends)
    has = j >= 0
    jj = j[has]
    exact = time[jj] >= t * (1.0 - REACH_RTOL)
    nxt = jj + 1 < s.ends[has]
    val = np.where(exact, v[jj], np.nan)
    inner = ~exact & nxt
    k = jj[inner]
    t0, t1 = time[k], time[k + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(t0 > 0, np.log(t / t0) / np.log(t1 / t0), (t - t0) / (t1 - t0))
    val[inner] = v[k] + w * (v[k + 1] - v[k])
    out[has] = val
    return out
