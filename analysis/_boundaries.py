"""The refined phase boundaries of a sweep (``phasesweep refine``): read and draw.

:func:`boundaries_frame` reads the ``boundaries`` rows that refine a sweep;
:func:`draw_boundaries` draws them with their uncertainty onto a matplotlib ``Axes``,
in data coordinates or on the cell grid of a heatmap (:func:`analysis.figures.
phase_diagram_figure` places cell ``j`` of its sorted x values at ``j + 0.5``).

To overlay the boundary of ``metric`` on a phase diagram of ``sweep`` with x =
the refined axis and y = a line axis (e.g. width)::

    frame = boundaries_frame(store, sweep, metric="kernel_distance")
    for facet_value, ax in panels:            # one panel per facet value, if any
        sub = frame if facet is None else frame[frame[facet] == facet_value]
        draw_boundaries(ax, sub, y="width", x_cells=xs, y_cells=ys)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

#: colour of the refined boundary (the heatmap's threshold contour is red).
BOUNDARY_COLOR = "#1f3b99"


def boundaries_frame(
    store_or_con, sweep: str, *, metric: str | None = None, level: float | None = None
) -> pd.DataFrame:
    """``boundaries`` rows refining ``sweep`` (those whose parent is ``sweep``, or of the
    refinement sweep itself), optionally of one metric and level; sorted by line.

    ``store_or_con``: a ``storage.Store``, a URI, or an open catalog connection (used
    as it is and left open). Columns: the ``boundaries`` table's, plus ``sweep`` (the
    refinement sweep). Empty when the sweep was never refined.
    """
    import duckdb
    from phasesweep.storage import open_catalog

    own = not isinstance(store_or_con, duckdb.DuckDBPyConnection)
    con = open_catalog(store_or_con) if own else store_or_con
    try:
        sql = "SELECT * FROM boundaries WHERE (parent = ? OR sweep = ?)"
        params: list = [sweep, sweep]
        if metric is not None:
            sql += " AND metric = ?"
            params.append(metric)
        if level is not None:
            sql += " AND level = ?"
            params.append(float(level))
        order = " ORDER BY metric, level, axis, depth, width, noise_sigma, lr, activation, n_train, line"
        return con.execute(sql + order, params).df()
    finally:
        if own:
            con.close()


def _to_cells(values: np.ndarray, cells: Sequence | None, log: bool) -> np.ndarray:
    """Positions of ``values`` on a heatmap whose cell j holds ``cells[j]`` (centre
    j + 0.5), interpolated between cells (in log10 when ``log``); None: the values."""
    values = np.asarray(values, dtype=float)
    if cells is None:
        return values
    c = np.asarray(sorted(cells), dtype=float)
    f = np.log10 if log else (lambda a: a)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.interp(f(values), f(c), np.arange(len(c)) + 0.5, left=np.nan, right=np.nan)


#: Where in a heatmap's row (0 bottom, 1 top) a boundary is drawn: above the value text.
CELL_ROW = 0.85


def draw_boundaries(
    ax: Axes,
    frame: pd.DataFrame,
    *,
    y: str,
    x_cells: Sequence | None = None,
    y_cells: Sequence | None = None,
    color: str = BOUNDARY_COLOR,
    label: str | None = "refined boundary",
) -> int:
    """Draw the boundary of every bracketed row of ``frame`` on ``ax``; returns how many.

    Each line (a value of column ``y``, e.g. ``width``) gets the estimate (marker, the
    markers joined by a line), its bracket (thick horizontal bar: the seed-mean metric
    is on opposite sides of the level at its ends) and each seed's own crossing (small
    ticks: the seed spread). Rows that are not bracketed are skipped.

    ``x_cells`` / ``y_cells``: the sorted axis values of a heatmap drawn on cell
    indices (``phase_diagram_figure``), to map values onto its cells, in the upper part
    of each row with hollow markers (the cell's value text is at its centre and stays
    readable); None draws in data coordinates (set a log x scale yourself for a log axis).
    """
    rows = frame[frame["bracketed"].astype(bool)].sort_values(y)
    if rows.empty:
        return 0
    log = bool((rows["axis_scale"] == "log").all())
    ys = rows[y].to_numpy(dtype=float)
    if y_cells is not None:
        index = {float(v): i + CELL_ROW for i, v in enumerate(sorted(y_cells))}
        ys = np.array([index.get(v, np.nan) for v in ys])

    def px(col: str) -> np.ndarray:
        return _to_cells(rows[col].to_numpy(dtype=float), x_cells, log)

    est, lo, hi = px("boundary"), px("bracket_low"), px("bracket_high")
    ax.plot(est, ys, "-", color=color, lw=1.2, alpha=0.8, zorder=4)
    ax.errorbar(
        est,
        ys,
        xerr=np.vstack([est - lo, hi - est]),
        fmt="D",
        color=color,
        mfc="none" if y_cells is not None else color,
        ms=5,
        elinewidth=3,
        capsize=4,
        zorder=5,
        label=label,
    )
    for yv, seeds in zip(ys, rows["seed_boundaries"]):
        if seeds is None or len(seeds) == 0:
            continue
        sx = _to_cells(np.asarray(seeds, dtype=float), x_cells, log)
        ax.plot(sx, np.full_like(sx, yv), "|", color=color, ms=10, mew=1.2, zorder=5)
    return len(rows)
