"""Train loss vs gradient-flow time (log-log), coloured by ``hue``, detected plateaus shaded."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib import pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
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
    sample_note,
    sorted_values,
    subtitle,
)
from phasesweep.storage import sql_condition
from phasesweep.storage._catalog import UNANALYZED

#: at most this many hue values get a legend of their own colours; more get a colour bar.
MAX_LEGEND_HUES = 8
#: at most about this many runs' curves are drawn; more are sampled (``Context.sample``).
MAX_CURVES = 200


def hue_scale(values: pd.Series, hue: str):
    """``(colour_of, legend_handles, mappable)``: categorical colours and a legend for a few
    or non-numeric values, else a colour map (log where ``hue`` is a log axis) and a bar."""
    distinct = sorted_values(values)
    numeric = all(isinstance(v, (int, float, np.number)) for v in distinct)
    if not numeric or len(distinct) <= MAX_LEGEND_HUES:
        colors = hue_colors(values)
        handles = [
            Line2D([], [], color=c, lw=1.6, label=f"{short_label(hue)} {fmt(v)}")
            for v, c in colors.items()
        ]
        return (lambda v: colors.get(v, "0.5")), handles, None
    hv = np.asarray(distinct, dtype=float)
    if hue in style.LOG_AXES and (hv > 0).all():
        norm = mcolors.LogNorm(hv.min(), hv.max())
    else:
        norm = mcolors.Normalize(hv.min(), hv.max())
    cmap = plt.get_cmap("plasma_r")
    return (lambda v: cmap(norm(v))), [], plt.cm.ScalarMappable(norm=norm, cmap=cmap)


def loss_curves_figure(
    traj: pd.DataFrame,
    runs: pd.DataFrame,
    plateaus: pd.DataFrame | None = None,
    *,
    hue: str = "init_scale",
    facet: str | None = None,
    title: str | None = None,
    decades: float = 8.0,
    ax: Axes | None = None,
) -> Figure:
    """Train loss vs gradient-flow time (log-log), coloured by ``hue``, plateaus shaded.

    ``traj``: ``run_id, time, train_loss``; ``runs``: ``run_id`` + ``hue`` (+ ``facet``,
    ``status``, ``analyzed``: whether the run has a current summary); ``plateaus``: rows of
    the plateaus table. Every plateau is a band (x: its start-end, y: its level ±25 %) in
    its run's colour. A run without a current summary (new, or trained again since the last
    ``analyze``) is dotted, with no plateau and a legend entry "not analyzed": what the
    analysis would say of it is unknown, not "no plateau". t = 0 is not on a
    log axis, NULL or non-positive losses are not drawn: curves start at the first
    logged step. Diverged runs are dashed, with a × at their last finite loss; those
    with no finite loss are counted in the legend, not drawn. The y axis spans at most ``decades``
    decades below the largest loss (converged runs reach round-off). A few hue
    values get a legend, many a colour bar; the legend lists only what is drawn.
    """
    runs = runs.set_index("run_id")
    if hue not in runs:
        runs[hue] = "all"
    facets = [None] if facet is None else sorted_values(runs[facet])
    tl = traj["train_loss"].to_numpy(dtype=float, na_value=np.nan)
    tt = traj["time"].to_numpy(dtype=float, na_value=np.nan)
    traj = traj[(tt > 0) & np.isfinite(tl) & (tl > 0)]
    by_run = {k: g for k, g in traj.groupby("run_id")}
    # colours of the runs with a curve: a hue value none of whose runs is drawn gets no entry
    curved = runs[runs.index.isin(list(by_run))]
    colour_of, handles, mappable = hue_scale((curved if len(curved) else runs)[hue], hue)
    top = float(traj["train_loss"].max()) if len(traj) else 0.0
    bottom = float(traj["train_loss"].min()) if len(traj) else 0.0
    pl = {} if plateaus is None or plateaus.empty else dict(list(plateaus.groupby("run_id")))
    drawn = {"plateau": False, "diverged": False, "not_analyzed": False}
    undrawn = 0  # diverged runs without a finite loss at t > 0: no curve to draw
    with style.theme():
        nr, nc = grid_shape(len(facets))
        fig, axes = canvas(ax, nr, nc, (5.2 * nc + 1.2, 4.0 * nr + 1.2), sharey=True)
        for k, fv in enumerate(facets):
            a = axes.ravel()[k]
            ids = runs.index if fv is None else runs.index[runs[facet] == fv]
            for rid in sorted(ids, key=lambda r: str(runs.at[r, hue])):
                g = by_run.get(rid)
                diverged = "status" in runs and runs.at[rid, "status"] == "diverged"
                if g is None:
                    undrawn += int(diverged)
                    continue
                c = colour_of(runs.at[rid, hue])
                analyzed = "analyzed" not in runs or bool(runs.at[rid, "analyzed"])
                drawn["diverged"] |= diverged
                drawn["not_analyzed"] |= not analyzed
                # a diverged run may have one finite loss only: its × is drawn where a
                # line of one point would not be
                a.plot(
                    g["time"], g["train_loss"], color=c, lw=1.4,
                    ls=NOT_ANALYZED_STYLE if not analyzed else "--" if diverged else "-",
                    marker="x" if diverged else None, markevery=[-1], ms=7,
                )  # fmt: skip
                first_t = g["time"].min()
                for p in pl[rid].itertuples() if rid in pl and analyzed else ():
                    if not (np.isfinite(p.level) and p.level > 0 and p.end > first_t):
                        continue
                    x0 = max(p.start, first_t)
                    a.add_patch(
                        Rectangle(
                            (x0, p.level / 1.25),
                            p.end - x0,
                            p.level * (1.25 - 1 / 1.25),
                            facecolor=c,
                            alpha=0.3,
                            edgecolor=c,
                            lw=0.6,
                        )
                    )
                    drawn["plateau"] = True
            a.set_xscale("log")
            a.set_yscale("log")
            if top > 0:
                a.set_ylim(max(bottom, top * 10.0**-decades) / 1.5, top * 2.5)
            if fv is not None:
                a.set_title(f"{short_label(facet)} = {fmt(fv)}")
            a.grid(True, which="major", alpha=0.3)
        hide_unused(axes, len(facets))
        if mappable is not None:
            cb = fig.colorbar(mappable, ax=axes.ravel()[: len(facets)].tolist(), shrink=0.9)
            cb.set_label(label(hue))
        if drawn["plateau"]:
            handles.append(Patch(facecolor="0.5", alpha=0.3, label="detected plateau"))
        if drawn["diverged"]:
            handles.append(
                Line2D(
                    [], [], color="0.3", ls="--", marker="x",
                    label="diverged run (×: its last finite loss)",
                )
            )  # fmt: skip
        if drawn["not_analyzed"]:
            handles.append(
                Line2D(
                    [], [], color="0.3", ls=NOT_ANALYZED_STYLE,
                    label="not analyzed (no plateaus detected yet): phasesweep analyze",
                )
            )  # fmt: skip
        if undrawn:
            runs_ = "run" if undrawn == 1 else "runs"
            text = f"{undrawn} diverged {runs_} not drawn: no finite loss"
            handles.append(Line2D([], [], ls="none", label=text))
        return finish(
            fig,
            axes,
            title or "Train loss vs gradient-flow time",
            handles,
            {"ncols": 4},
            xlabel=label("time"),
            ylabel=label("train_loss"),
        )


#: The line style of a run without a current summary (its plateaus are not known).
NOT_ANALYZED_STYLE = ":"


class LossCurves(FigureKind):
    kind = "loss_curves"
    order = 30
    fields = ("hue", "facet", "where", "name", "title")
    caption = (
        "Train loss vs gradient-flow time, log–log, one colour per hue value (dashed, × "
        "at the last finite loss: diverged; dotted: not analyzed, no current summary); shaded "
        "boxes: detected plateaus (time span × level ±25 %)."
    )

    def default(self, ctx: Context) -> PlotSpec | None:
        return PlotSpec(kind=self.kind)

    def resolve(self, p: PlotSpec, ctx: Context) -> PlotSpec:
        hue = p.hue or first_free(ctx, ("init_scale",), set(), p.where) or "seed"
        facet = p.facet or first_free(ctx, ("depth", "width"), {hue}, p.where)
        where = fixed_where(ctx, {hue, facet}, p.where)
        return p.model_copy(update={"hue": hue, "facet": facet, "where": where})

    def query(self, p: PlotSpec, ctx: Context) -> dict:
        cols = ", ".join(dict.fromkeys(c for c in ("status", p.hue, p.facet) if c))
        where = f" AND ({sql_condition(p.where)})" if p.where else ""
        runs, total = ctx.sample(
            f"SELECT run_id, attempt, {cols}, NOT ({UNANALYZED}) AS analyzed "
            f"FROM runs AS r WHERE sweep = ?{where}",
            [p.facet, p.hue],
            MAX_CURVES,
            [ctx.sweep],
        )
        if runs.empty:
            raise Unavailable(f"no runs match where = {p.where!r}")
        traj = ctx.chunk_rows("trajectories", runs, ["time", "train_loss"])
        traj = traj[traj["train_loss"].notna()].sort_values(["run_id", "time"], ignore_index=True)
        if traj.empty:
            raise Unavailable("the selected runs have no logged train loss")
        pl = ctx.df(
            "SELECT * FROM plateaus WHERE sweep = ? AND run_id IN (SELECT unnest(?::VARCHAR[]))",
            [runs["run_id"].tolist()],
        )
        return {"traj": traj, "runs": runs, "plateaus": pl, "shown": (len(runs), total)}

    def draw(self, data: dict, p: PlotSpec, ax: Axes | None = None) -> Figure:
        title = p.title or f"Train loss vs gradient-flow time{subtitle(p.where)}"
        title += sample_note(*data.get("shown", (0, 0)))
        return loss_curves_figure(
            data["traj"],
            data["runs"],
            data["plateaus"],
            hue=p.hue,
            facet=p.facet,
            title=title,
            ax=ax,
        )
