"""Final transversal variation ``mean ‖P⊥ ∇ₓf‖²`` vs noise σ (subspace data).

Markers: the median over seeds, bars: min–max over seeds (quantiles, so they
stay positive on a log axis, unlike mean ± sd).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from phasesweep.analysis import _style as style
from phasesweep.analysis._style import fmt, label, short_label
from phasesweep.analysis.config import PlotSpec
from phasesweep.analysis.figures._kind import (
    Context,
    FigureKind,
    Unavailable,
    canvas,
    finish,
    first_free,
    fixed_where,
    grid_shape,
    hide_unused,
    hue_colors,
    plain_log_labels,
    sample_note,
    selected_runs,
    sorted_values,
    subtitle,
)

_Y = "final_transversal_grad_sq"


def _scale(ax: Axes, values: np.ndarray, axis: str) -> bool:
    """Log scale where every value is positive, symlog where some are 0; True if symlog."""
    v = values[np.isfinite(values)]
    if not len(v) or not (v > 0).any() or (v < 0).any():
        return False
    if (v > 0).all():
        getattr(ax, f"set_{axis}scale")("log")
        return False
    getattr(ax, f"set_{axis}scale")("symlog", linthresh=float(v[v > 0].min()))
    return True


#: at most about this many runs are drawn as dots; more are sampled (``Context.sample``).
MAX_DOTS = 2000


def transversal_cells(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per value of ``keys`` (the figure's facet, hue and x): the ``median``, ``min`` and
    ``max`` of the final transversal variation of ``df``'s runs and its smallest positive
    value (``min_pos``), as the figure's query computes them in SQL."""
    g = df.groupby(keys, dropna=False)[_Y]
    cells = g.agg(["median", "min", "max"])
    cells["min_pos"] = df[_Y].where(df[_Y] > 0).groupby([df[k] for k in keys], dropna=False).min()
    return cells.reset_index()


def transversal_figure(
    df: pd.DataFrame,
    *,
    x: str = "noise_sigma",
    hue: str = "depth",
    facet: str | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    cells: pd.DataFrame | None = None,
) -> Figure:
    """Final transversal variation vs ``x``, one colour per ``hue``, a panel per ``facet``.

    ``df``: one row per run with ``x``, ``hue`` (+ ``facet``) and
    ``final_transversal_grad_sq`` (NULL rows are skipped). Markers: median over
    seeds; bars: min–max over seeds; small dots: single seeds. Axes are log where
    every value is positive, symlog where 0 occurs (σ = 0). ``cells``: the markers'
    data (:func:`transversal_cells` of all runs) where ``df`` holds only the dots drawn
    (a sample); default: those of ``df``.
    """
    y = df[_Y].to_numpy(dtype=float, na_value=np.nan)
    d = df[np.isfinite(y)].copy()
    if hue not in d:
        d[hue] = "all"
    keys = list(dict.fromkeys(k for k in (facet, hue, x) if k))
    cells = transversal_cells(d, keys) if cells is None else cells.copy()
    if hue not in cells:
        cells[hue] = "all"
    colors = hue_colors(cells[hue])
    facets = [None] if facet is None else sorted_values(cells[facet])
    xs = cells[x].to_numpy(dtype=float)
    yv = cells[["min", "max", "min_pos"]].to_numpy(dtype=float, na_value=np.nan).ravel()
    with style.theme():
        nr, nc = grid_shape(len(facets))
        fig, axes = canvas(ax, nr, nc, (5.6 * nc + 1.2, 4.2 * nr + 1.2), sharey=True)
        for k, fv in enumerate(facets):
            a = axes.ravel()[k]
            sub = cells if fv is None else cells[cells[facet] == fv]
            dots = d if fv is None else d[d[facet] == fv]
            for h, c in colors.items():
                agg = sub[sub[hue] == h].sort_values(x)
                if agg.empty:
                    continue
                g = dots[dots[hue] == h]
                a.scatter(g[x], g[_Y], s=10, alpha=0.35, color=c, lw=0)
                a.errorbar(
                    agg[x],
                    agg["median"],
                    yerr=[agg["median"] - agg["min"], agg["max"] - agg["median"]],
                    fmt="o-",
                    ms=5,
                    capsize=2,
                    color=c,
                )
            symlog_x = _scale(a, xs, "x")
            symlog_y = _scale(a, yv, "y")
            if symlog_y:
                a.set_ylim(bottom=0)
            elif a.get_yscale() == "log":
                plain_log_labels(a, "y")
            ticks = np.unique(xs[np.isfinite(xs)])
            if 0 < len(ticks) <= 12:
                a.set_xticks(ticks, [fmt(v) for v in ticks])
                a.minorticks_off()
            if fv is not None:
                a.set_title(f"{short_label(facet)} = {fmt(fv)}")
            a.grid(True, which="major", alpha=0.3)
        hide_unused(axes, len(facets))
        handles = [
            Line2D([], [], color=c, marker="o", label=f"{short_label(hue)} {fmt(h)}")
            for h, c in colors.items()
        ]
        return finish(
            fig,
            axes,
            title or "Transversal variation of the trained function",
            handles,
            {"ncols": 5},
            xlabel=label(x) + (" — symlog (0 included)" if symlog_x else ""),
            ylabel=label("transversal_grad_sq") + " (final)",
        )


class Transversal(FigureKind):
    kind = "transversal"
    order = 50
    fields = ("x", "hue", "facet", "where", "name", "title")
    caption = (
        "Final transversal variation mean ‖P⊥ ∇ₓf‖² vs noise σ (markers: median over seeds, "
        "bars: min–max over seeds)."
    )

    def default(self, ctx: Context) -> PlotSpec | None:
        has = ctx.count(
            "SELECT count(*) FROM summaries WHERE sweep = ? AND final_transversal_grad_sq > 0"
        )
        return PlotSpec(kind=self.kind) if has or "noise_sigma" in ctx.axes else None

    def resolve(self, p: PlotSpec, ctx: Context) -> PlotSpec:
        x = p.x or "noise_sigma"
        hue = p.hue or first_free(ctx, ("depth",), {x}, p.where) or "depth"
        facet = p.facet or first_free(ctx, (), {x, hue}, p.where)
        where = fixed_where(ctx, {x, hue, facet, "seed"}, p.where)
        return p.model_copy(update={"x": x, "hue": hue, "facet": facet, "where": where})

    def query(self, p: PlotSpec, ctx: Context) -> dict:
        keys = ", ".join(dict.fromkeys(k for k in (p.facet, p.hue, p.x) if k))
        finite = (
            f"SELECT r.run_id, {', '.join(f'r.{k}' for k in keys.split(', '))}, s.{_Y} "
            f"FROM {selected_runs(p.where)} AS r JOIN summaries AS s "
            "ON s.sweep = r.sweep AND s.run_id = r.run_id "
            f"WHERE r.status = 'completed' AND isfinite(s.{_Y})"
        )
        with ctx.materialized(finite) as rows:
            cells = ctx.con.execute(
                f"SELECT {keys}, median({_Y}) AS median, min({_Y}) AS min, max({_Y}) AS max, "
                f"min({_Y}) FILTER (WHERE {_Y} > 0) AS min_pos FROM {rows} GROUP BY ALL"
            ).df()
            dots, total = ctx.sample(f"SELECT * FROM {rows}", [p.facet, p.hue, p.x], MAX_DOTS)
        if cells.empty:
            raise Unavailable(
                "transversal_grad_sq is NULL for every completed run (subspace data only)"
            )
        return {"points": dots, "cells": cells, "shown": (len(dots), total)}

    def draw(self, data: dict, p: PlotSpec, ax: Axes | None = None) -> Figure:
        title = p.title or f"Transversal variation vs {short_label(p.x)}{subtitle(p.where)}"
        title += sample_note(*data["shown"])
        return transversal_figure(
            data["points"],
            x=p.x,
            hue=p.hue,
            facet=p.facet,
            title=title,
            ax=ax,
            cells=data["cells"],
        )
