"""Phase diagram: a heatmap of a final value over two swept axes, mean over seeds.

Its data is the single query of :func:`analysis._phase.phase_diagram_sql`. The
colour scale is logarithmic where the cell values span more than two decades
(order parameters of lazy runs reach round-off, 1e-16 ... 1e-1).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib import pyplot as plt
from matplotlib.axes import Axes
from matplotlib.contour import ContourSet
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from phasesweep.analysis import _style as style
from phasesweep.analysis._boundaries import BOUNDARY_COLOR, boundaries_frame, draw_boundaries
from phasesweep.analysis._phase import FROM_ZERO, VALUES, phase_diagram_sql
from phasesweep.analysis._style import fmt, label, short_label
from phasesweep.analysis.config import PlotSpec
from phasesweep.analysis.figures._kind import (
    Y_PREFERENCE,
    Context,
    FigureKind,
    Unavailable,
    canvas,
    finish,
    first_free,
    fixed_where,
    grid_shape,
    hide_unused,
    log_ok,
    sorted_values,
    spans_decades,
    subtitle,
)

from phasesweep._config import SpecError


def phase_diagram_figure(
    cells: pd.DataFrame,
    *,
    x: str,
    y: str,
    value: str,
    threshold: float | None = None,
    facet: str | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    boundaries: pd.DataFrame | None = None,
) -> Figure:
    """Heatmap of ``cells`` (rows of :func:`analysis._phase.phase_diagram_sql`).

    Colour: the mean final ``value`` over a cell's completed runs, on a log scale
    where the values span more than two decades (cells at or below 0 then take the
    lowest colour, marked "≤ 0"). A contour at ``threshold`` separates lazy from
    rich, drawn only through cells whose regime (the ``regime`` column, most common over
    the cell's runs) is lazy or rich: a cell without one (not converged, diverged, or
    NULL, e.g. ``analysis.at_time`` beyond its runs) has no lazy/rich side. Cells where
    every run diverged are hatched grey and labelled "div"; cells where some diverged
    carry "k/n div". Cells with a run without a current summary (``n_analyzed`` below
    ``n_runs``: new points, runs trained again) are hatched and labelled "not analyzed",
    never coloured as a value. The legend lists only what is drawn. ``ax``: draw in its place (a
    subfigure, facets split into a grid) instead of a new figure.
    ``boundaries``: rows of the ``boundaries`` table along ``x`` (``phasesweep refine``),
    drawn over the cells with their brackets and seed crossings, per facet value; only
    those of ``value``'s own metric (a boundary of another metric says nothing of these
    colours), labelled with the metric and level. The threshold line's label is placed
    where it covers no cell's text (:func:`label_threshold`).
    """
    if boundaries is not None and "metric" in boundaries.columns:
        boundaries = boundaries[boundaries["metric"] == value]
    facets = [None] if facet is None else sorted_values(cells["facet"])
    xs = sorted_values(cells["x"])
    ys = sorted_values(cells["y"])
    vals = cells["value"].to_numpy(dtype=float, na_value=np.nan)
    finite = vals[np.isfinite(vals)]
    log = spans_decades(finite)
    log_x = x in style.LOG_AXES and log_ok(xs)
    if log:
        pos = finite[finite > 0]
        norm = mcolors.LogNorm(float(pos.min()), float(pos.max()))
    else:
        vmin = float(finite.min()) if len(finite) else 0.0
        vmax = float(finite.max()) if len(finite) else 1.0
        if value in FROM_ZERO:
            vmin = min(vmin, 0.0)
        if vmax <= vmin:
            vmax = vmin + 1.0
        norm = mcolors.Normalize(vmin, vmax)
    base = plt.get_cmap(style.SEQUENTIAL)
    cmap = base.with_extremes(under=base(0.0))
    drawn = {
        "diverged": False,
        "not_analyzed": False,
        "not_converged": False,
        "contour": False,
        "boundary": False,
        "sided": False,
    }

    with style.theme():
        nr, nc = grid_shape(len(facets))
        cw = max(0.6 * len(xs), 3.6) + 1.4
        ch = max(0.5 * len(ys), 2.6) + 1.0
        width = max(cw * nc + 1.6, 7.5)
        fig, axes = canvas(ax, nr, nc, (width, ch * nr + 1.2))
        mesh = None
        contours: list[tuple[Axes, ContourSet]] = []
        for k, fv in enumerate(facets):
            a = axes.ravel()[k]
            sub = cells if fv is None else cells[cells["facet"] == fv]
            grid = np.full((len(ys), len(xs)), np.nan)
            nrun = np.zeros_like(grid)
            nconv = np.zeros(grid.shape, dtype=bool)
            sided = np.zeros(grid.shape, dtype=bool)  # regime lazy or rich
            ndiv = np.zeros_like(grid)
            unanalyzed = np.zeros(grid.shape, dtype=bool)
            for row in sub.itertuples(index=False):
                if row.x not in xs or row.y not in ys:
                    continue
                i, j = ys.index(row.y), xs.index(row.x)
                grid[i, j] = np.nan if pd.isna(row.value) else row.value
                nrun[i, j] = row.n_runs
                ndiv[i, j] = row.n_diverged
                unanalyzed[i, j] = getattr(row, "n_analyzed", row.n_runs) < row.n_runs
                if unanalyzed[i, j]:
                    grid[i, j] = np.nan  # a partial mean is no value of the cell
                regime = getattr(row, "regime", None)
                nconv[i, j] = regime == "not_converged"
                sided[i, j] = regime in ("lazy", "rich")
            # values at or below 0 take the lowest colour on a log scale; NaN stays blank
            shown = grid if not log else np.where(~(grid <= 0), grid, norm.vmin * 0.5)
            mesh = a.pcolormesh(
                np.arange(len(xs) + 1),
                np.arange(len(ys) + 1),
                np.ma.masked_invalid(shown),
                cmap=cmap,
                norm=norm,
                edgecolors="white",
                linewidth=0.6,
            )
            annotate = len(xs) * len(ys) <= 120
            for i in range(len(ys)):
                for j in range(len(xs)):
                    if nrun[i, j] == 0:
                        continue
                    if unanalyzed[i, j]:
                        drawn["not_analyzed"] = True
                        a.add_patch(
                            Rectangle(
                                (j, i),
                                1,
                                1,
                                fill=False,
                                hatch=NOT_ANALYZED_HATCH,
                                edgecolor=style.DIVERGED_COLOR,
                                linewidth=0.0,
                            )
                        )
                        a.text(
                            j + 0.5, i + 0.5, "not\nanalyzed", ha="center", va="center", fontsize=7
                        )
                        continue
                    if ndiv[i, j] == nrun[i, j]:
                        drawn["diverged"] = True
                        a.add_patch(
                            Rectangle(
                                (j, i),
                                1,
                                1,
                                facecolor=style.DIVERGED_COLOR,
                                hatch="xxx",
                                edgecolor="white",
                                linewidth=0.0,
                            )
                        )
                        a.text(
                            j + 0.5,
                            i + 0.5,
                            "div",
                            ha="center",
                            va="center",
                            fontsize=8,
                            fontweight="bold",
                        )
                        continue
                    if nconv[i, j]:
                        drawn["not_converged"] = True
                        a.add_patch(
                            Rectangle(
                                (j, i),
                                1,
                                1,
                                fill=False,
                                hatch="...",
                                edgecolor=style.NOT_CONVERGED_COLOR,
                                linewidth=0.0,
                            )
                        )
                    if not annotate:
                        continue
                    v = grid[i, j]
                    txt = "" if np.isnan(v) else ("≤ 0" if log and v <= 0 else f"{v:.2g}")
                    if nconv[i, j]:
                        txt += "\nnot conv."
                    if ndiv[i, j] > 0:
                        txt += f"\n{int(ndiv[i, j])}/{int(nrun[i, j])} div"
                    rgba = cmap(norm(shown[i, j])) if np.isfinite(v) else (1, 1, 1, 1)
                    lum = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]
                    a.text(
                        j + 0.5,
                        i + 0.5,
                        txt,
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="black" if lum > 0.5 else "white",
                    )
            if threshold is not None and len(xs) >= 2 and len(ys) >= 2:
                # only cells with a lazy or rich regime have a side of the threshold
                z = np.ma.masked_invalid(np.where(sided, grid, np.nan))
                drawn["sided"] |= bool(sided.any())
                if z.count() and z.min() < threshold < z.max():
                    cs = a.contour(
                        np.arange(len(xs)) + 0.5,
                        np.arange(len(ys)) + 0.5,
                        z,
                        levels=[threshold],
                        colors=THRESHOLD_COLOR,
                        linewidths=2.2,
                    )
                    contours.append((a, cs))
                    drawn["contour"] = True
            if boundaries is not None and not boundaries.empty:
                lines = boundaries if fv is None else boundaries[boundaries[facet] == fv]
                n = draw_boundaries(a, lines, y=y, x_cells=xs, y_cells=ys, label=None)
                drawn["boundary"] = drawn["boundary"] or n > 0
            a.set_xticks(
                np.arange(len(xs)) + 0.5, [fmt(v) for v in xs], rotation=45 if len(xs) > 6 else 0
            )
            a.set_yticks(np.arange(len(ys)) + 0.5, [fmt(v) for v in ys])
            a.set_xlim(0, len(xs))
            a.set_ylim(0, len(ys))
            a.set_xlabel(label(x) + (" — log spaced" if log_x else ""))
            a.set_ylabel(label(y))
            if fv is not None:
                a.set_title(f"{short_label(facet)} = {fmt(fv)}")
            a.tick_params(length=0)
            for sp in a.spines.values():
                sp.set_visible(False)
        hide_unused(axes, len(facets))
        cb = fig.colorbar(mesh, ax=axes.ravel()[: len(facets)].tolist(), shrink=0.9)
        scale = ", log scale" if log else ""
        cb.set_label(f"{label(value)}\nmean over seeds (completed runs){scale}")
        handles = []
        if drawn["diverged"]:
            handles.append(
                Patch(
                    facecolor=style.DIVERGED_COLOR,
                    hatch="xxx",
                    edgecolor="white",
                    label="all runs diverged",
                )
            )
        if drawn["not_analyzed"]:
            handles.append(
                Patch(
                    facecolor="white",
                    hatch=NOT_ANALYZED_HATCH,
                    edgecolor=style.DIVERGED_COLOR,
                    label="not analyzed: phasesweep analyze",
                )
            )
        if drawn["not_converged"]:
            handles.append(
                Patch(
                    facecolor="white",
                    hatch="...",
                    edgecolor=style.NOT_CONVERGED_COLOR,
                    label="most runs not converged",
                )
            )
        if drawn["contour"]:
            handles.append(
                Line2D(
                    [],
                    [],
                    color=THRESHOLD_COLOR,
                    lw=2.2,
                    label=f"lazy | rich threshold = {threshold:g}",
                )
            )
        if threshold is not None and len(xs) >= 2 and len(ys) >= 2 and not drawn["sided"]:
            handles.append(
                Line2D(
                    [], [], ls="none", label="no cell has a lazy or rich regime: no threshold line"
                )
            )
        if drawn["boundary"]:
            handles.append(
                Line2D(
                    [],
                    [],
                    color=BOUNDARY_COLOR,
                    marker="D",
                    lw=1.2,
                    mfc="none",
                    label=f"refined boundary of {short_label(value)} at level "
                    + ", ".join(f"{v:g}" for v in sorted(set(boundaries["level"])))
                    + " (bar: bracket, ticks: seeds)",
                )
            )
        n_seeds = int(cells["n_seeds"].max()) if len(cells) else 0
        root = finish(
            fig,
            axes,
            title or f"Phase diagram: {short_label(value)} ({n_seeds} seeds per cell)",
            handles,
            {"ncols": 3},
        )
        if contours:
            root.draw_without_rendering()  # the layout: where the cells' texts now are
            for a, cs in contours:
                label_threshold(a, cs, f"{threshold:g}", root.canvas.get_renderer())
        return root


#: The ``gid`` of a threshold line's label (how tests and users find it).
THRESHOLD_LABEL = "threshold-label"


def label_threshold(a: Axes, cs: ContourSet, text: str, renderer) -> None:
    """Label the threshold line ``cs`` of panel ``a`` with ``text`` at the point of the line
    where the label's box lies farthest from every text of the panel (the cells' values),
    inside the panel; no label where every point would touch one (the legend names the
    level). ``renderer``: of the figure after its layout, which fixes the texts' boxes.

    Placed in display space because that is where text sizes are fixed: in data units a
    cell's text and the label change size with the figure, and matplotlib's own placement
    (``clabel``) looks at the line's curvature only, so it often sat on a cell's value."""
    boxes = np.array(
        [t.get_window_extent(renderer).extents for t in a.texts if t.get_text().strip()]
    ).reshape(-1, 4)  # (M, 4): x0, y0, x1, y1 in pixels
    label = a.text(
        0, 0, text, ha="center", va="center", fontsize=8, color=THRESHOLD_COLOR,
        fontweight="bold", gid=THRESHOLD_LABEL,
        bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
    )  # fmt: skip
    extent = label.get_window_extent(renderer)
    pad = 0.15 * 8 * a.figure.dpi / 72 + 1.0  # the box's pad, and a pixel between boxes
    half = np.array([extent.width / 2 + pad, extent.height / 2 + pad])
    points = np.concatenate(
        [_along(p) for path in cs.get_paths() for p in path.to_polygons(closed_only=False)]
        or [np.empty((0, 2))]
    )
    centre = a.transData.transform(points)  # (K, 2) pixels
    lo, hi = centre - half, centre + half
    inside = (lo >= a.bbox.p0).all(axis=1) & (hi <= a.bbox.p1).all(axis=1)
    # separation of the label's box from each text box: the widest gap along x or y (< 0: overlap)
    gap = np.maximum.reduce(
        [
            boxes[None, :, 0] - hi[:, None, 0],
            lo[:, None, 0] - boxes[None, :, 2],
            boxes[None, :, 1] - hi[:, None, 1],
            lo[:, None, 1] - boxes[None, :, 3],
        ]
    )
    clearance = np.where(inside, gap.min(axis=1, initial=np.inf), -np.inf)
    if not len(clearance) or clearance.max() <= 0:
        label.remove()
        return
    label.set_position(points[int(np.argmax(clearance))])


def _along(vertices: np.ndarray, step: float = 0.02) -> np.ndarray:
    """Points along the polyline ``vertices`` (N, 2), at most ``step`` apart (data units:
    cells are 1 wide and 1 high), the vertices included."""
    if len(vertices) < 2:
        return vertices
    out = [vertices[:1]]
    for start, end in zip(vertices[:-1], vertices[1:]):
        n = max(int(np.ceil(np.hypot(*(end - start)) / step)), 1)
        out.append(start + (end - start) * (np.arange(1, n + 1) / n)[:, None])
    return np.concatenate(out)


#: The colour of the lazy/rich threshold line and its label.
THRESHOLD_COLOR = "#d62728"
#: The hatch of a cell whose runs are not all analyzed (no value to colour it by).
NOT_ANALYZED_HATCH = "///"


class PhaseDiagram(FigureKind):
    kind = "phase_diagram"
    order = 10
    fields = ("x", "y", "value", "facet", "where", "name", "title")
    caption = (
        "Colour: the final value, mean over the cell's completed runs (its seeds; log scale "
        "where it spans decades). Red line: the lazy/rich threshold of the analysis, drawn "
        "through the cells with a lazy or rich regime only. Grey hatched cells (“div”):"
        " every run diverged; pink dotted cells (“not conv.”): most runs did not "
        "converge (final loss above analysis.converged_loss_frac of the initial one). "
        "Grey striped cells (“not analyzed”): runs without a current summary (analyze)."
    )

    def default(self, ctx: Context) -> PlotSpec | None:
        return PlotSpec(kind=self.kind) if len(ctx.axes) >= 2 else None

    def resolve(self, p: PlotSpec, ctx: Context) -> PlotSpec:
        axes = ctx.axes
        x = p.x or ("init_scale" if "init_scale" in axes else (axes[0] if axes else "init_scale"))
        y = p.y or next((a for a in [*Y_PREFERENCE, *axes] if a in axes and a != x), "seed")
        facet = p.facet or first_free(ctx, (), {x, y}, p.where)
        return p.model_copy(
            update={
                "x": x,
                "y": y,
                "value": p.value or "kernel_distance",
                "facet": facet,
                "where": fixed_where(ctx, {x, y, facet, "seed"}, p.where),
            }
        )

    def check(self, p: PlotSpec, key: str) -> None:
        super().check(p, key)
        if p.value is not None and p.value not in VALUES:
            raise SpecError(f"{key}.value", p.value, f"known: {', '.join(VALUES)}")

    def name(self, p: PlotSpec) -> str:
        if p.name:
            return p.name
        return f"phase_{p.value}_{p.x}_{p.y}" + (f"_by_{p.facet}" if p.facet else "")

    def sql(self, p: PlotSpec, ctx: Context) -> str:
        return phase_diagram_sql(ctx.sweep, p.x, p.y, p.value, facet=p.facet, where=p.where)

    def query(self, p: PlotSpec, ctx: Context) -> dict:
        cells = ctx.con.execute(self.sql(p, ctx)).df()
        if cells.empty:
            raise Unavailable(f"no runs match where = {p.where!r}")
        valued = (cells["n_diverged"] < cells["n_runs"]) & (cells["n_analyzed"] == cells["n_runs"])
        if cells["value"].notna().sum() == 0 and valued.any():
            raise Unavailable(f"{p.value} is NULL for every completed run")
        cfg = ctx.cfg
        thr = None
        if p.value in (cfg.order_parameter, "order_value"):
            thr = cfg.lazy_threshold
        elif p.value in ("kernel_distance", "param_rel_change"):
            thr = cfg.fallback_lazy_threshold
        refined = boundaries_frame(ctx.con, ctx.sweep)
        refined = refined[refined["axis"] == p.x]
        if p.y not in refined.columns or (p.facet and p.facet not in refined.columns):
            refined = None  # boundaries are drawn per line of a run axis the table carries
        return {"cells": cells, "threshold": thr, "boundaries": refined}

    def draw(self, data: dict, p: PlotSpec, ax: Axes | None = None) -> Figure:
        title = p.title or (
            f"Phase diagram — {short_label(p.value)}, mean over seeds{subtitle(p.where)}"
        )
        return phase_diagram_figure(
            data["cells"],
            x=p.x,
            y=p.y,
            value=p.value,
            threshold=data["threshold"],
            facet=p.facet,
            title=title,
            ax=ax,
            boundaries=data.get("boundaries"),
        )
