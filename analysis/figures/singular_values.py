"""Top singular values of every layer over time: one run per facet value.

The run shown (per facet value) is the one of smallest init scale that escaped a
saddle (else the smallest init scale), deepest first. Steps where the spectra
budget skipped the SVD (``layers.top_sv`` NULL) are left out.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
from matplotlib import ticker as mticker
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
    plain_log_labels,
    selected_runs,
    subtitle,
)

_RUN_AXES = ("init_scale", "depth", "width", "seed")


def _matrix(values) -> np.ndarray:
    """Lists of singular values (some NULL) as a (rows, k) array, NaN-padded."""
    vals = [np.asarray(v if v is not None else [], dtype=float) for v in values]
    k = max((len(v) for v in vals), default=0)
    mat = np.full((len(vals), k), np.nan)
    for i, v in enumerate(vals):
        mat[i, : len(v)] = v
    return mat


def shared_time_limits(ranges: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """x limits per row of panels from each row's (first, last) time: one range for all
    rows where they end within a decade of each other (the same horizon: equal times line
    up), else each row its own (runs whose clocks differ by decades, e.g. depths)."""
    lo = [r[0] for r in ranges]
    hi = [r[1] for r in ranges]
    if ranges and max(hi) <= 10 * min(hi):
        return [(min(lo), max(hi))] * len(ranges)
    return list(ranges)


def singular_values_figure(
    layers: pd.DataFrame,
    *,
    facet: str | None = None,
    title: str | None = None,
    ax: Axes | None = None,
) -> Figure:
    """Top singular values of every layer over time: one row of panels per facet value
    (one run each), one column per layer.

    ``layers``: ``time, layer, top_sv`` (lists, descending; NULL rows are skipped),
    optionally ``delta_top_sv`` (of W_l(t) - W_l(0), dashed: the init's random bulk
    hides in ``top_sv`` what was learned), ``facet`` and ``init_scale`` (shown in a row's
    titles where it differs between rows). σ_k has the same colour in every panel; the
    panels of a row share their time axis, and every row does where the runs end within
    a decade of each other (:func:`shared_time_limits`).
    """
    layers = layers[(layers["time"] > 0) & layers["top_sv"].notna()]
    keys = [None] if facet is None else sorted(layers[facet].dropna().unique())
    rows = [layers if fv is None else layers[layers[facet] == fv] for fv in keys]
    ncols = max((int(r["layer"].max()) for r in rows if len(r)), default=1)
    has_delta = "delta_top_sv" in layers and layers["delta_top_sv"].notna().any()
    series = [("top_sv", "-")] + ([("delta_top_sv", "--")] if has_delta else [])
    kmax = 1
    vary_alpha = "init_scale" in layers and layers["init_scale"].nunique() > 1
    with style.theme():
        nr = len(keys)
        fig, axes = canvas(ax, nr, ncols, (3.3 * ncols + 1.6, 2.7 * nr + 1.6))
        limits = shared_time_limits([(r["time"].min(), r["time"].max()) for r in rows])
        for i, (fv, row) in enumerate(zip(keys, rows)):
            for j in range(ncols):
                a = axes[i, j]
                g = row[row["layer"] == j + 1].sort_values("time")
                if g.empty:
                    a.set_visible(False)
                    continue
                for col, ls in series:
                    mat = _matrix(g[col])
                    kmax = max(kmax, mat.shape[1])
                    colors = style.palette(max(mat.shape[1], 1))
                    few = len(g) <= 12  # sparse spectra (metrics.spectra_budget): mark them
                    for q in range(mat.shape[1]):
                        y = mat[:, q]
                        ok = np.isfinite(y) & (y > 0)
                        a.plot(
                            g["time"].to_numpy()[ok],
                            y[ok],
                            color=colors[q],
                            lw=1.4,
                            ls=ls,
                            marker="o" if few else None,
                            ms=3.5,
                            mfc="white" if ls != "-" else None,
                        )
                a.set_xscale("log")
                a.set_yscale("log")
                lo, hi = limits[i]
                a.set_xlim(lo / 1.3, hi * 1.3)
                if hi / lo > 5:  # labels at the decades only, not crowded minor ones
                    a.xaxis.set_minor_formatter(mticker.NullFormatter())
                plain_log_labels(a, "y")
                head = f"layer {j + 1}"
                if fv is not None:
                    head = f"{short_label(facet)} {fmt(fv)} · {head}"
                    if vary_alpha:
                        head = f"{head} (α {fmt(g['init_scale'].iloc[0])})"
                a.set_title(head, fontsize="medium")
                a.grid(True, which="major", alpha=0.3)
        handles = [Line2D([], [], color="0.3", lw=1.4, label="of W_l(t)")]
        if has_delta:
            handles.append(Line2D([], [], color="0.3", lw=1.4, ls="--", label="of W_l(t) − W_l(0)"))
        handles += [
            Line2D([], [], color=c, lw=1.5, label=f"σ{q + 1}")
            for q, c in enumerate(style.palette(kmax))
        ]
        return finish(
            fig,
            axes,
            title or "Top singular values per layer",
            handles,
            {"ncols": len(handles)},
            xlabel=label("time"),
            ylabel="singular value σ_k",
        )


def _pick(p: PlotSpec, ctx: Context) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run each facet value shows, and its ``layers`` rows with singular values.

    The completed runs matching ``where``, per facet value in order of preference (the
    smallest init scale that escaped a saddle, else the smallest, deepest first): the
    first that has singular values. The candidates' layers are read a few runs at a time
    (:meth:`Context.chunk_rows`), never the whole table."""
    part = f"PARTITION BY r.{p.facet} " if p.facet else ""
    extra = f", r.{p.facet}" if p.facet and p.facet not in _RUN_AXES else ""
    facet = f"r.{p.facet}" if p.facet else "NULL"
    checked: set[str] = set()
    found = [pd.DataFrame(columns=["run_id", "step", "layer", "top_sv", "delta_top_sv"])]
    limit = 4
    while True:
        cands = ctx.df(
            "SELECT * FROM (SELECT r.run_id, r.attempt, r.init_scale, r.depth, r.width, "
            f"r.seed{extra}, coalesce(s.n_plateaus, 0) AS n_plateaus, {facet} AS _facet, "
            f"row_number() OVER ({part}"
            "ORDER BY coalesce(s.n_plateaus, 0) >= 1 DESC, r.init_scale ASC, r.depth DESC, "
            f"r.run_id) AS k FROM {selected_runs(p.where)} AS r "
            "LEFT JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id "
            "WHERE r.status = 'completed') WHERE k <= ? ORDER BY k, run_id",
            [limit],
        )
        new = cands[~cands["run_id"].isin(checked)]
        rows = ctx.chunk_rows("layers", new, ["step", "layer", "top_sv", "delta_top_sv"])
        found.append(rows[rows["top_sv"].notna()])
        checked.update(new["run_id"])
        with_sv = cands[cands["run_id"].isin(set(pd.concat(found)["run_id"]))]
        pick = with_sv.groupby("_facet", dropna=False, sort=True).head(1)
        exhausted = cands.groupby("_facet", dropna=False).size() < limit
        missing = set(cands["_facet"].unique()) - set(pick["_facet"].unique())
        if all(exhausted.get(f, True) for f in missing):
            layers = pd.concat(found, ignore_index=True)
            return pick.reset_index(drop=True), layers[layers["run_id"].isin(set(pick["run_id"]))]
        limit *= 4


class SingularValues(FigureKind):
    kind = "singular_values"
    order = 40
    fields = ("facet", "where", "name", "title")
    caption = (
        "Top singular values σ_k of each layer's weights W_l(t) (solid) and of their change "
        "W_l(t) − W_l(0) (dashed) over gradient-flow time: one run per row (the title says "
        "which), one layer per column."
    )

    def default(self, ctx: Context) -> PlotSpec | None:
        return PlotSpec(kind=self.kind) if ctx.any_value("layers", "top_sv") else None

    def resolve(self, p: PlotSpec, ctx: Context) -> PlotSpec:
        facet = p.facet or first_free(ctx, ("depth",), {"init_scale"}, p.where)
        where = fixed_where(ctx, {"init_scale", facet}, p.where)
        return p.model_copy(update={"facet": facet, "where": where})

    def query(self, p: PlotSpec, ctx: Context) -> dict:
        pick, layers = _pick(p, ctx)
        if pick.empty:
            raise Unavailable(
                "no completed run with singular values (metrics.spectra off, or no run matches "
                f"where = {p.where!r})"
            )
        times = ctx.chunk_rows("trajectories", pick, ["step", "time"])
        pick = pick.drop(columns=["attempt", "_facet", "k"])
        layers = layers.merge(times, on=["run_id", "step"]).merge(pick, on="run_id")
        layers = layers.sort_values(["run_id", "layer", "time"], ignore_index=True)
        layers = layers[["run_id", "layer", "time", "top_sv", "delta_top_sv", *pick.columns[1:]]]
        if not (layers["time"] > 0).any():
            raise Unavailable("singular values were recorded at step 0 only")
        first = pick["run_id"].iloc[0]
        logged = int(((times["run_id"] == first) & (times["time"] > 0)).sum())
        with_sv = layers[(layers["run_id"] == first) & (layers["time"] > 0)]["time"].nunique()
        return {"layers": layers, "runs": pick, "coverage": (int(with_sv), logged)}

    def draw(self, data: dict, p: PlotSpec, ax: Axes | None = None) -> Figure:
        runs = data["runs"]
        left = runs["n_plateaus"] >= 1
        which = "the smallest init scale" + (
            " that left a plateau"
            if left.all()
            else " (none left a plateau)"
            if not left.any()
            else " that left a plateau, where one did"
        )
        if runs["init_scale"].nunique() == 1:
            which += f" (α {fmt(runs['init_scale'].iloc[0])})"
        # the run's values of the other axes, but those the title's [where] sets (a = v)
        fixed = [
            a
            for a in _RUN_AXES
            if a not in (p.facet, "init_scale")
            and not re.search(rf"\b{a}\s*=[^=]", p.where or "", re.I)
        ]
        fixed = ", ".join(
            f"{short_label(a)} {fmt(runs[a].iloc[0])}" for a in fixed if runs[a].nunique() == 1
        )
        runs_shown = f"one run per {short_label(p.facet)}, " if p.facet else "the run of "
        title = p.title or (
            f"Top singular values of each layer over training: {runs_shown}{which}"
            + (f"; {fixed}" if fixed else "")
            + subtitle(p.where)
        )
        with_sv, logged = data.get("coverage", (0, 0))
        if with_sv < logged:
            title += f" — SVD at {with_sv} of {logged} logged steps (metrics.spectra_budget)"
        return singular_values_figure(data["layers"], facet=p.facet, title=title, ax=ax)
