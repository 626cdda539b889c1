"""What every gallery figure draws the same way: measured points with their spread over
seeds, the paper's law on the same axes (its free constant fitted, and said so), and the
caption under the axes."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from phasesweep._gallery._fit import Fit

#: Characters per caption line.
CAPTION_WIDTH = 120


def spread_points(
    ax: Axes,
    frame: pd.DataFrame,
    x: str,
    y: str,
    hue: str,
    name: str = "{hue} = {value:g}",
    marker: str = "o",
) -> dict:
    """One series per value of ``hue``: the geometric mean over seeds at each ``x`` (a
    ``marker``) and the seeds' range (an error bar). Returns ``{hue value: colour}``."""
    from phasesweep.analysis._style import palette

    values = sorted(frame[hue].unique())
    colours = dict(zip(values, palette(len(values))))
    for value, group in frame.groupby(hue, sort=True):
        logs = np.log(group[y].where(group[y] > 0))
        per_x = logs.groupby(group[x]).agg(["mean", "min", "max"]).dropna()
        mid = np.exp(per_x["mean"])
        ax.errorbar(
            per_x.index,
            mid,
            yerr=[mid - np.exp(per_x["min"]), np.exp(per_x["max"]) - mid],
            fmt=marker,
            ms=5,
            capsize=2,
            color=colours[value],
            label=name.format(hue=hue, value=value),
        )
    return colours


def power_law(ax: Axes, x: np.ndarray, y: np.ndarray, exponent: float, **style) -> float:
    """Draw ``y = C x^exponent`` over the range of ``x`` with ``C`` fitted to the points
    (least squares in log space, the exponent held at the paper's value); returns ``C``."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    ok = (x > 0) & (y > 0)
    constant = float(np.exp(np.mean(np.log(y[ok]) - exponent * np.log(x[ok]))))
    grid = np.geomspace(x[ok].min(), x[ok].max(), 50)
    ax.plot(grid, constant * grid**exponent, **{"color": "k", "lw": 1, "ls": "--", **style})
    return constant


def fit_label(symbol: str, fit: Fit, theory: str) -> str:
    """A legend entry: ``fit: slope 1.98 [1.95, 2.01] (theory 2)``."""
    return f"{symbol} {fit.estimate:.3g} [{fit.low:.3g}, {fit.high:.3g}] 95 % (theory {theory})"


def with_caption(fig: Figure, caption: str) -> Figure:
    """Put ``caption`` (wrapped) under the figure's axes; the figure, for chaining."""
    wrapped = "\n".join(
        textwrap.fill(line, CAPTION_WIDTH, subsequent_indent="  ") for line in caption.splitlines()
    )
    fig.text(0.01, -0.02, wrapped, ha="left", va="top", fontsize=8, family="DejaVu Sans")
    return fig
