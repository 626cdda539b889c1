"""The figures of ``phasesweep plot``, as pure functions of pandas frames.

Each function returns a matplotlib Figure drawn in the style of
:mod:`analysis.style`; :mod:`analysis.plotting` loads the frames from a store
and saves the figures.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from matplotlib import colors as mcolors
from matplotlib import pyplot as plt
from matplotlib import ticker as mticker
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from phasesweep.analysis import style
from phasesweep.analysis.style import fmt, label, short_label


def _wrap(text: str, width_in: float, size: float = 12) -> str:
    """``text`` wrapped to fit a figure ``width_in`` inches wide at font ``size``."""
    chars = max(int(width_in * 72 / (0.55 * size)), 20)
    return "\n".join(textwrap.wrap(text, chars))


def _grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return (n + cols - 1) // cols, cols


# --------------------------------------------------------------------------- phase diagram


def phase_diagram_figure(
    cells: pd.DataFrame,
    *,
    x: str,
    y: str,
    value: str,
    threshold: float | None = None,
    facet: str | None = None,
    title: str | None = None,
) -> plt.Figure:
    """Heatmap of ``cells`` (rows of :func:`analysis.phase.phase_diagram_sql`).

    Colour: the mean final ``value`` over a cell's completed runs. A contour at
    ``threshold`` separates lazy from rich. Cells where every run diverged are
    hatched grey and labelled "div"; cells where some diverged carry "k/n div".
    """
    facets = [None] if facet is None else sorted(cells["facet"].dropna().unique())
    xs = sorted(cells["x"].dropna().unique())
    ys = sorted(cells["y"].dropna().unique())
    finite = cells["value"].to_numpy(dtype=float, na_value=np.nan)
    finite = finite[np.isfinite(finite)]
    vmin = float(finite.min()) if len(finite) else 0.0
    vmax = float(finite.max()) if len(finite) else 1.0
    if value in ("kernel_distance", "param_rel_change", "act_flip_frac", "order_value"):
        vmin = min(vmin, 0.0)
    if vmax <= vmin:
        vmax = vmin + 1.0
    norm = mcolors.Normalize(vmin, vmax)
    cmap = plt.get_cmap(style.SEQUENTIAL).copy()

    with style.theme():
        nr, nc = _grid_shape(len(facets))
        cw = max(0.6 * len(xs), 3.6) + 1.4
        ch = max(0.5 * len(ys), 2.6) + 1.0
        width = max(cw * nc + 1.6, 8.5)  # room for the title, colorbar and legend
        fig, axes = plt.subplots(
            nr, nc, figsize=(width, ch * nr + 0.8), squeeze=False, layout="constrained"
        )
        annotate = len(xs) * len(ys) <= 120
        for k, fv in enumerate(facets):
            ax = axes[k // nc][k % nc]
            sub = cells if fv is None else cells[cells["facet"] == fv]
            grid = np.full((len(ys), len(xs)), np.nan)
            nrun = np.zeros_like(grid)
            nconv = np.zeros(grid.shape, dtype=bool)
            ndiv = np.zeros_like(grid)
            for row in sub.itertuples(index=False):
                if row.x not in xs or row.y not in ys:
                    continue
                i, j = ys.index(row.y), xs.index(row.x)
                grid[i, j] = np.nan if pd.isna(row.value) else row.value
                nrun[i, j] = row.n_runs
                ndiv[i, j] = row.n_diverged
                if getattr(row, "regime", None) == "not_converged":
                    nconv[i, j] = True
            mesh = ax.pcolormesh(
                np.arange(len(xs) + 1),
                np.arange(len(ys) + 1),
                np.ma.masked_invalid(grid),
                cmap=cmap,
                norm=norm,
                edgecolors="white",
                linewidth=0.6,
            )
            for i in range(len(ys)):
                for j in range(len(xs)):
                    if nrun[i, j] == 0:
                        continue
                    if ndiv[i, j] == nrun[i, j]:
                        ax.add_patch(
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
                        ax.text(
                            j + 0.5,
                            i + 0.5,
                            "div",
                            ha="center",
                            va="center",
                            fontsize=8,
                            color="black",
                            fontweight="bold",
                        )
                    else:
                        if nconv[i, j]:
                            ax.add_patch(
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
                        txt = "" if np.isnan(v) else f"{v:.2g}"
                        if nconv[i, j]:
                            txt += "\nnot conv."
                        if ndiv[i, j] > 0:
                            txt += f"\n{int(ndiv[i, j])}/{int(nrun[i, j])} div"
                        rgba = cmap(norm(v)) if np.isfinite(v) else (1, 1, 1, 1)
                        lum = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2]
                        ax.text(
                            j + 0.5,
                            i + 0.5,
                            txt,
                            ha="center",
                            va="center",
                            fontsize=7,
                            color="black" if lum > 0.5 else "white",
                        )
            if threshold is not None and len(xs) >= 2 and len(ys) >= 2:
                # not-converged cells have no regime to separate: keep them out of the contour
                z = np.ma.masked_invalid(np.where(nconv, np.nan, grid))
                if z.count() and z.min() < threshold < z.max():
                    cs = ax.contour(
                        np.arange(len(xs)) + 0.5,
                        np.arange(len(ys)) + 0.5,
                        z,
                        levels=[threshold],
                        colors="#d62728",
                        linewidths=2.2,
                    )
                    ax.clabel(cs, fmt={threshold: f"{threshold:g}"}, fontsize=8)
            ax.set_xticks(
                np.arange(len(xs)) + 0.5, [fmt(v) for v in xs], rotation=45 if len(xs) > 6 else 0
            )
            ax.set_yticks(np.arange(len(ys)) + 0.5, [fmt(v) for v in ys])
            ax.set_xlim(0, len(xs))
            ax.set_ylim(0, len(ys))
            ax.set_xlabel(label(x) + (" — log spaced" if x in style.LOG_AXES else ""))
            ax.set_ylabel(label(y))
            if fv is not None:
                ax.set_title(f"{short_label(facet)} = {fmt(fv)}")
            ax.tick_params(length=0)
            for sp in ax.spines.values():
                sp.set_visible(False)
        for k in range(len(facets), nr * nc):
            axes[k // nc][k % nc].set_visible(False)
        cb = fig.colorbar(mesh, ax=axes.ravel().tolist(), shrink=0.9)
        cb.set_label(f"{label(value)}\nmean over seeds (completed runs)")
        handles = [
            Patch(
                facecolor=style.DIVERGED_COLOR,
                hatch="xxx",
                edgecolor="white",
                label="all runs diverged",
            ),
            Patch(
                facecolor="white",
                hatch="...",
                edgecolor=style.NOT_CONVERGED_COLOR,
                label="most runs not converged",
            ),
        ]
        if threshold is not None:
            handles.append(
                Line2D(
                    [], [], color="#d62728", lw=2.2, label=f"lazy | rich threshold = {threshold:g}"
                )
            )
        fig.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
        n_seeds = int(cells["n_seeds"].max()) if len(cells) else 0
        fig.suptitle(
            _wrap(title or f"Phase diagram: {short_label(value)} ({n_seeds} seeds per cell)", width)
        )
    return fig


# --------------------------------------------------------------------------- escape times


def _geo_center(a: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    return float(np.exp(np.mean(np.log(a)))), float(np.exp(np.mean(np.log(t))))


def escape_time_figure(
    points: pd.DataFrame, fits: pd.DataFrame | None = None, *, title: str | None = None
) -> plt.Figure:
    """Escape time vs init scale on log axes, one colour per depth.

    ``points``: runs with ``depth, init_scale, seed, escape_time`` and optionally
    ``in_fit`` (bool: the run's regime and init scale enter the scaling fit; the
    others are drawn hollow). Markers: the geometric mean over seeds, bars:
    min-max over seeds, small dots: single seeds. Solid lines: the fitted power
    laws from ``fits`` (scaling_fits rows) over their fitted range; dashed (depth
    2): the fitted ``t = a + b log(1/α)``. Dotted grey: the theory's slope -(L-2)
    (L >= 3) and, for L = 2, the shape t ∝ log(1/α) (its coefficient is not
    universal), drawn through the centre of the fit (or of the fitted points):
    guides to the slope, not predictions of the level.
    """
    pts = points[np.isfinite(points["escape_time"]) & (points["escape_time"] > 0)].copy()
    if "in_fit" not in pts:
        pts["in_fit"] = True
    depths = sorted(pts["depth"].unique())
    colors = dict(zip(depths, style.palette(max(len(depths), 1))))
    fits = fits if fits is not None else pd.DataFrame(columns=["depth", "x", "slope"])
    with style.theme():
        fig, ax = plt.subplots(figsize=(7.6, 6.2), layout="constrained")
        handles = []
        for d in depths:
            g = pts[pts["depth"] == d]
            c = colors[d]
            ax.scatter(g["init_scale"], g["escape_time"], s=9, color=c, alpha=0.35, lw=0)
            agg = (
                g.groupby("init_scale")
                .agg(
                    gm=("escape_time", lambda v: float(np.exp(np.log(v).mean()))),
                    lo=("escape_time", "min"),
                    hi=("escape_time", "max"),
                    in_fit=("in_fit", "all"),
                )
                .reset_index()
            )
            for in_fit, a in agg.groupby("in_fit"):
                ax.errorbar(
                    a["init_scale"],
                    a["gm"],
                    yerr=[(a["gm"] - a["lo"]).clip(lower=0), (a["hi"] - a["gm"]).clip(lower=0)],
                    fmt="o",
                    ms=5.5,
                    color=c,
                    mfc=c if in_fit else "white",
                    mec=c,
                    capsize=2,
                    lw=1,
                )
            text = [f"depth {d}:"]
            center = None
            f = fits[(fits["depth"] == d) & (fits["x"] == "log_init_scale") & fits["slope"].notna()]
            if len(f) == 0 and len(fits[(fits["depth"] == d) & (fits["x"] == "log_init_scale")]):
                text.append("no fit (too few decades or seeds)")
            if len(f):
                f = f.iloc[0]
                a = np.geomspace(f["init_scale_min"], f["init_scale_max"], 50)
                ax.plot(a, np.exp(f["intercept"]) * a ** f["slope"], color=c, lw=2)
                ci = f" [{f['ci_low']:.2f}, {f['ci_high']:.2f}]" if pd.notna(f["ci_low"]) else ""
                text.append(f"fit slope {f['slope']:.2f}{ci}")
                a_c = float(np.sqrt(f["init_scale_min"] * f["init_scale_max"]))
                center = (a_c, float(np.exp(f["intercept"]) * a_c ** f["slope"]), a)
            f2 = fits[
                (fits["depth"] == d) & (fits["x"] == "log_inv_init_scale") & fits["slope"].notna()
            ]
            if len(f2):
                f2 = f2.iloc[0]
                a = np.geomspace(f2["init_scale_min"], f2["init_scale_max"], 50)
                ax.plot(a, f2["intercept"] + f2["slope"] * np.log(1 / a), color=c, lw=1.6, ls="--")
                text.append(f"t ≈ {f2['intercept']:.2g} + {f2['slope']:.2g}·log(1/α)")
            if center is None:
                gi = g[g["in_fit"] & (g["init_scale"] < 1 if d == 2 else g["in_fit"])]
                if len(gi):
                    a_c, t_c = _geo_center(
                        gi["init_scale"].to_numpy(), gi["escape_time"].to_numpy()
                    )
                    center = (
                        a_c,
                        t_c,
                        np.geomspace(gi["init_scale"].min(), gi["init_scale"].max(), 50),
                    )
            if d >= 3:
                text.append(f"theory −{d - 2}")
                if center is not None:
                    a_c, t_c, a = center
                    ax.plot(a, t_c * (a / a_c) ** (-(d - 2)), color="0.3", lw=1.3, ls=":")
            elif d == 2:
                text.append("theory ∝ log(1/α)")
                if center is not None:
                    a_c, t_c, a = center
                    a = a[a < 1]
                    if a_c < 1 and len(a):
                        ax.plot(
                            a, t_c * np.log(1 / a) / np.log(1 / a_c), color="0.3", lw=1.3, ls=":"
                        )
            handles.append(Line2D([], [], color=c, marker="o", lw=2, label="  ".join(text)))
        handles += [
            Line2D([], [], color="0.3", ls=":", lw=1.3, label="theory guide (slope only)"),
            Line2D(
                [],
                [],
                color="0.3",
                marker="o",
                mfc="white",
                ls="none",
                label="not fitted (no plateau, regime or init-scale range)",
            ),
        ]
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(label("init_scale"))
        ax.set_ylabel(label("escape_time"))
        ax.grid(True, which="major", alpha=0.3)
        fig.legend(handles=handles, loc="outside lower center", ncols=1, frameon=False)
        ax.set_title(_wrap(title or "Escape time vs init scale", fig.get_figwidth()))
    return fig


# --------------------------------------------------------------------------- loss curves


def loss_curves_figure(
    traj: pd.DataFrame,
    runs: pd.DataFrame,
    plateaus: pd.DataFrame | None = None,
    *,
    hue: str = "init_scale",
    facet: str | None = None,
    title: str | None = None,
    decades: float = 8.0,
) -> plt.Figure:
    """Train loss vs gradient-flow time (log-log), coloured by ``hue``, plateaus shaded.

    ``traj``: ``run_id, time, train_loss``; ``runs``: ``run_id`` + ``hue`` (+ ``facet``,
    ``status``); ``plateaus``: rows of the plateaus table. Every plateau is a band
    (x: its start-end, y: its level ±25 %) in its run's colour. t = 0 is not on a
    log axis: curves start at the first logged step. The y axis spans at most
    ``decades`` decades below the largest loss (converged runs reach round-off).
    """
    runs = runs.set_index("run_id")
    facets = [None] if facet is None else sorted(runs[facet].dropna().unique())
    hv = runs[hue].to_numpy(dtype=float)
    positive = hv[np.isfinite(hv) & (hv > 0)]
    use_log = hue in style.LOG_AXES and len(positive) and positive.min() > 0
    if len(positive):
        norm = (
            mcolors.LogNorm(positive.min(), max(positive.max(), positive.min() * 1.0001))
            if use_log
            else mcolors.Normalize(np.nanmin(hv), np.nanmax(hv))
        )
    else:
        norm = mcolors.Normalize(0, 1)
    cmap = plt.get_cmap("plasma_r")
    traj = traj[(traj["time"] > 0) & np.isfinite(traj["train_loss"]) & (traj["train_loss"] > 0)]
    by_run = {k: g for k, g in traj.groupby("run_id")}
    top = float(traj["train_loss"].max()) if len(traj) else 0.0
    bottom = float(traj["train_loss"].min()) if len(traj) else 0.0
    pl = {} if plateaus is None else {k: g for k, g in plateaus.groupby("run_id")}
    with style.theme():
        nr, nc = _grid_shape(len(facets))
        fig, axes = plt.subplots(
            nr,
            nc,
            figsize=(5.2 * nc + 1.0, 4.0 * nr + 0.5),
            squeeze=False,
            sharey=True,
            layout="constrained",
        )
        for k, fv in enumerate(facets):
            ax = axes[k // nc][k % nc]
            ids = runs.index if fv is None else runs.index[runs[facet] == fv]
            ids = sorted(ids, key=lambda r: runs.at[r, hue])
            for rid in ids:
                g = by_run.get(rid)
                if g is None:
                    continue
                c = cmap(norm(runs.at[rid, hue]))
                diverged = "status" in runs and runs.at[rid, "status"] == "diverged"
                ax.plot(g["time"], g["train_loss"], color=c, lw=1.4, ls="--" if diverged else "-")
                first_t = g["time"].min()
                for p in pl.get(rid).itertuples() if rid in pl else ():
                    x0 = max(p.start, first_t)
                    ax.add_patch(
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
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(label("time"))
            if k % nc == 0:
                ax.set_ylabel(label("train_loss"))
            if top > 0:
                ax.set_ylim(max(bottom, top * 10.0**-decades), top * 2.5)
            if fv is not None:
                ax.set_title(f"{short_label(facet)} = {fmt(fv)}")
            ax.grid(True, which="major", alpha=0.3)
        for k in range(len(facets), nr * nc):
            axes[k // nc][k % nc].set_visible(False)
        sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
        cb = fig.colorbar(sm, ax=axes.ravel().tolist(), shrink=0.9)
        cb.set_label(label(hue))
        fig.legend(
            handles=[
                Patch(facecolor="0.5", alpha=0.3, label="detected plateau"),
                Line2D([], [], color="0.3", ls="--", label="diverged run"),
            ],
            loc="outside lower center",
            ncols=2,
            frameon=False,
        )
        fig.suptitle(_wrap(title or "Train loss vs gradient-flow time", fig.get_figwidth()))
    return fig


# --------------------------------------------------------------------------- singular values


def singular_values_figure(layers: pd.DataFrame, *, title: str | None = None) -> plt.Figure:
    """Top singular values of every layer over time, for one run.

    ``layers``: ``time, layer, top_sv`` (lists, descending) and optionally
    ``delta_top_sv`` (of W_l(t) - W_l(0), drawn in a second row: the init's random
    bulk hides what was learned in the first row).
    """
    layers = layers[layers["time"] > 0].sort_values(["layer", "time"])
    ls = sorted(layers["layer"].unique())
    rows = [("top_sv", "σ_k(W_l(t))")]
    if "delta_top_sv" in layers and layers["delta_top_sv"].notna().any():
        rows.append(("delta_top_sv", "σ_k(W_l(t) − W_l(0))"))
    with style.theme():
        fig, axes = plt.subplots(
            len(rows),
            len(ls),
            figsize=(3.6 * len(ls) + 1.0, 3.2 * len(rows)),
            squeeze=False,
            sharex=True,
            layout="constrained",
        )
        kmax = 1
        for r, (col, ylabel) in enumerate(rows):
            for j, layer in enumerate(ls):
                ax = axes[r][j]
                g = layers[layers["layer"] == layer]
                vals = [np.asarray(v if v is not None else [], dtype=float) for v in g[col]]
                k = max((len(v) for v in vals), default=0)
                kmax = max(kmax, k)
                mat = np.full((len(vals), k), np.nan)
                for i, v in enumerate(vals):
                    mat[i, : len(v)] = v
                colors = style.palette(max(k, 1))
                for q in range(k):
                    y = mat[:, q]
                    ok = np.isfinite(y) & (y > 0)
                    ax.plot(
                        g["time"].to_numpy()[ok], y[ok], color=colors[q], lw=1.5, label=f"σ{q + 1}"
                    )
                ax.set_xscale("log")
                ax.set_yscale("log")
                lo, hi = ax.get_ylim()
                if hi / lo < 10:  # less than a decade: plain numbers, not 10^x labels
                    ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%.3g"))
                    ax.yaxis.set_minor_formatter(mticker.NullFormatter())
                if r == 0:
                    ax.set_title(f"layer {layer}")
                if r == len(rows) - 1:
                    ax.set_xlabel(label("time"))
                if j == 0:
                    ax.set_ylabel(ylabel)
                ax.grid(True, which="major", alpha=0.3)
        handles = [
            Line2D([], [], color=c, lw=1.5, label=f"σ{q + 1}")
            for q, c in enumerate(style.palette(kmax))
        ]
        fig.legend(
            handles=handles, loc="outside right center", frameon=False, title="singular value"
        )
        fig.suptitle(_wrap(title or "Top singular values per layer", fig.get_figwidth()))
    return fig


# --------------------------------------------------------------------------- transversal


def transversal_figure(
    df: pd.DataFrame, *, x: str = "noise_sigma", hue: str = "depth", title: str | None = None
) -> plt.Figure:
    """Final transversal variation vs noise σ, one colour per depth (mean ± sd over seeds)."""
    d = df[np.isfinite(df["final_transversal_grad_sq"])]
    groups = sorted(d[hue].dropna().unique())
    colors = dict(zip(groups, style.palette(max(len(groups), 1))))
    with style.theme():
        fig, ax = plt.subplots(figsize=(6.8, 4.6), layout="constrained")
        for h in groups:
            g = d[d[hue] == h]
            agg = g.groupby(x)["final_transversal_grad_sq"].agg(["mean", "std", "count"])
            agg = agg.reset_index()
            ax.scatter(
                g[x], g["final_transversal_grad_sq"], s=10, alpha=0.35, color=colors[h], lw=0
            )
            ax.errorbar(
                agg[x],
                agg["mean"],
                yerr=agg["std"].fillna(0),
                fmt="o-",
                ms=5,
                capsize=2,
                color=colors[h],
                label=f"{short_label(hue)} {fmt(h)}",
            )
        xs = d[x].to_numpy(dtype=float)
        if len(xs) and (xs > 0).any():
            if (xs <= 0).any():
                ax.set_xscale("symlog", linthresh=float(xs[xs > 0].min()))
            else:
                ax.set_xscale("log")
        if len(xs):
            ticks = np.unique(xs)
            if len(ticks) <= 12:
                ax.set_xticks(ticks, [fmt(v) for v in ticks])
                ax.minorticks_off()
        yv = d["final_transversal_grad_sq"].to_numpy(dtype=float)
        if len(yv) and (yv > 0).all():
            ax.set_yscale("log")
        elif len(yv) and (yv > 0).any() and (yv >= 0).all():
            ax.set_yscale("symlog", linthresh=float(yv[yv > 0].min()))
            ax.set_ylim(bottom=0)
        ax.set_xlabel(label(x) + (" — symlog (0 included)" if (xs <= 0).any() else ""))
        ax.set_ylabel(label("transversal_grad_sq") + " (final)")
        ax.legend(frameon=False)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(
            _wrap(title or "Transversal variation of the trained function", fig.get_figwidth())
        )
    return fig
