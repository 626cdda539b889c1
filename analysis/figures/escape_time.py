"""Escape time vs init scale on log axes, with the fitted scaling laws and theory slopes.

One colour per value of ``hue`` (depth by default, else the next swept axis), one
panel per value of ``facet`` (the next swept axis): every swept axis is drawn,
none is silently fixed to one value.
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
    sample_note,
    selected_runs,
    sorted_values,
    subtitle,
)
from phasesweep.storage.schema import FIT_GROUP_COLUMNS

from phasesweep._config import SpecError

#: at most about this many runs are drawn as dots; more are sampled (``Context.sample``).
MAX_DOTS = 2000

#: The aggregate of the escape times of a group of runs (one colour, panel, fit group and
#: init scale; the groups of the figure's query also split what ``fit_mask`` reads):
#: ``n`` runs with a positive escape time, ``sum_log`` of their logs, ``lo``/``hi`` the
#: smallest and largest, ``in_fit`` whether they enter the scaling fit.
GROUP_COLUMNS = ("n", "sum_log", "lo", "hi", "in_fit")


def escape_groups(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` (runs with a positive escape time) as groups of one run each (see
    :data:`GROUP_COLUMNS`): for a figure of a frame of runs."""
    t = points["escape_time"].to_numpy(dtype=float)
    in_fit = points.get("in_fit", True)
    return points.assign(n=1, sum_log=np.log(t), lo=t, hi=t, in_fit=in_fit)


def _geo_center(groups: pd.DataFrame) -> tuple[float, float]:
    """Geometric means of the init scales and escape times of the runs of ``groups``."""
    n = groups["n"].sum()
    log_a = (groups["n"] * np.log(groups["init_scale"])).sum() / n
    return float(np.exp(log_a)), float(np.exp(groups["sum_log"].sum() / n))


def matching_fits(fits: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """The ``scaling_fits`` rows whose group (depth and the group axes) is one of ``runs``'."""
    if fits.empty or runs.empty:
        return fits.iloc[:0]
    keep = np.ones(len(fits), dtype=bool)
    for c in ("depth", *FIT_GROUP_COLUMNS):
        if c not in fits or c not in runs:
            continue
        vals = set(runs[c].dropna().tolist())
        col = fits[c]
        keep &= col.isna().to_numpy() | col.isin(vals).to_numpy()
    return fits[keep]


def fitted_spans(g: pd.DataFrame) -> list[tuple[float, float]]:
    """The init-scale ranges a fitted line may cover: runs of two or more consecutive init
    scales of the group ``g`` (rows: ``init_scale``, ``in_fit``) that each have a fitted
    run. A line never crosses an init scale whose runs were all left out of the fit."""
    fitted = g.groupby("init_scale")["in_fit"].any().sort_index()
    spans: list[tuple[float, float]] = []
    start = prev = None
    for a, ok in fitted.items():
        if ok and start is None:
            start = a
        elif not ok and start is not None:
            spans.append((start, prev))
            start = None
        prev = a
    if start is not None:
        spans.append((start, prev))
    return [(float(lo), float(hi)) for lo, hi in spans if hi > lo]


def _clipped(spans: list[tuple[float, float]], lo: float, hi: float) -> list[np.ndarray]:
    """Log-spaced init scales over each span, clipped to [lo, hi] (empty spans dropped)."""
    out = []
    for a, b in spans:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            out.append(np.geomspace(a, b, 50))
    return out


def _dodges(init_scales: pd.Series, n: int) -> list[float]:
    """Factors on init scale that spread ``n`` colours' markers at one init scale side by
    side (else they hide each other): over a third of the smallest log gap between the
    init scales (a third of a decade where there is one init scale), centred on it."""
    if n < 2:
        return [1.0] * n
    logs = np.unique(np.log10(init_scales.to_numpy(dtype=float)))
    gap = float(np.diff(logs).min()) if len(logs) > 1 else 1.0
    step = gap / 3 / (n - 1)
    return [10.0 ** ((i - (n - 1) / 2) * step) for i in range(n)]


def _draw_group(
    ax, dots: pd.DataFrame, g: pd.DataFrame, fits: pd.DataFrame, c, drawn: dict, shift: float
) -> list[str]:
    """Dots, markers, fits and theory guide of one colour group (``g``: its groups of
    runs, :data:`GROUP_COLUMNS`); returns its legend text.

    Dots and markers are drawn at ``shift`` × their init scale (:func:`_dodges`); lines
    (fits, theory guide) at the init scale itself, over :func:`fitted_spans` only."""
    ax.scatter(dots["init_scale"] * shift, dots["escape_time"], s=9, color=c, alpha=0.35, lw=0)
    agg = (
        g.groupby("init_scale")
        .agg(
            n=("n", "sum"),
            sum_log=("sum_log", "sum"),
            lo=("lo", "min"),
            hi=("hi", "max"),
            in_fit=("in_fit", "all"),
        )
        .reset_index()
    )
    agg["gm"] = np.exp(agg["sum_log"] / agg["n"])
    for in_fit, a in agg.groupby("in_fit"):
        drawn["hollow"] |= not in_fit
        ax.errorbar(
            a["init_scale"] * shift,
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
    text = []
    law = None  # the fitted power law, where there is one
    spans = fitted_spans(g)
    power = fits[(fits["x"] == "log_init_scale") & fits["slope"].notna()]
    if len(power) == 0 and (fits["x"] == "log_init_scale").any():
        text.append("no fit (too few decades or seeds)")
    if len(power):
        f = power.iloc[0]
        pieces = _clipped(spans, f["init_scale_min"], f["init_scale_max"])
        for a in pieces:
            ax.plot(a, np.exp(f["intercept"]) * a ** f["slope"], color=c, lw=2)
        drawn["power"] |= bool(pieces)
        ci = f" [{f['ci_low']:.2f}, {f['ci_high']:.2f}]" if pd.notna(f["ci_low"]) else ""
        text.append(f"fit slope {f['slope']:.2f}{ci}" + ("" if pieces else " (no line)"))
        law = (float(np.exp(f["intercept"])), float(f["slope"]))
    logf = fits[(fits["x"] == "log_inv_init_scale") & fits["slope"].notna()]
    if len(logf):
        f = logf.iloc[0]
        for a in _clipped(spans, f["init_scale_min"], f["init_scale_max"]):
            ax.plot(a, f["intercept"] + f["slope"] * np.log(1 / a), color=c, lw=1.6, ls="--")
            drawn["log"] = True
        text.append(f"t ≈ {f['intercept']:.2g} + {f['slope']:.2g}·log(1/α)")
    depths = g["depth"].dropna().unique()
    if len(depths) != 1:
        return text
    d = int(depths[0])
    pieces = _clipped(spans, 0.0, np.nextafter(1.0, 0.0) if d == 2 else np.inf)
    if d < 2 or not pieces:
        return text
    text.append(f"theory −{d - 2}" if d >= 3 else "theory ∝ log(1/α)")
    for a in pieces:
        # through the middle of this stretch: on the fitted law, else the fitted points
        a_c = float(np.sqrt(a[0] * a[-1]))
        if law is not None:
            t_c = law[0] * a_c ** law[1]
        else:
            near = g[g["in_fit"] & g["init_scale"].between(a[0], a[-1])]
            t_c = _geo_center(near)[1]
        shape = (a / a_c) ** (-(d - 2)) if d >= 3 else np.log(1 / a) / np.log(1 / a_c)
        ax.plot(a, t_c * shape, color=c, lw=1.3, ls=":")
    drawn["theory"] = True
    return text


def escape_time_figure(
    points: pd.DataFrame,
    fits: pd.DataFrame | None = None,
    *,
    hue: str = "depth",
    facet: str | None = None,
    title: str | None = None,
    ax: Axes | None = None,
    groups: pd.DataFrame | None = None,
) -> Figure:
    """Escape time vs init scale on log axes, one colour per ``hue``, a panel per ``facet``.

    ``points``: runs with ``depth, init_scale, seed, escape_time`` (+ ``hue``,
    ``facet`` and the fit-group columns) and optionally ``in_fit`` (bool: the run
    enters the scaling fit; the others are drawn hollow). Markers: the geometric
    mean over seeds, bars: min-max over seeds, small dots: single seeds. Solid
    lines: the fitted power laws from ``fits`` (scaling_fits rows of each colour's
    group) over their fitted range; dashed: the fitted ``t = a + b log(1/α)``.
    Dotted, in the group's colour (a group of one depth L): the theory's slope -(L-2)
    (L >= 3) and, for L = 2, the shape t ∝ log(1/α), drawn through the middle of the
    fitted law (or of the fitted points): guides to the slope, not predictions of the
    level. Every line covers only :func:`fitted_spans`: adjacent fitted init scales.
    Several colours' markers and dots at one init scale are set side by side
    (:func:`_dodges`), and the legend says so; the lines stay at the init scale itself.

    ``groups``: the markers', fits' and guides' data as aggregates of groups of runs
    (:data:`GROUP_COLUMNS`, with ``init_scale``, ``hue``, ``facet`` and the fit-group
    columns), where ``points`` are only the dots drawn (a sample); default: every point
    its own group (:func:`escape_groups`).
    """
    et = points["escape_time"].to_numpy(dtype=float, na_value=np.nan)
    pts = points[np.isfinite(et) & (et > 0)].copy()
    if groups is None:
        groups = escape_groups(pts)
    groups = groups[groups["n"] > 0].copy()
    for frame in (pts, groups):
        if hue not in frame:
            frame[hue] = "all"
    colors = hue_colors(groups[hue])
    facets = [None] if facet is None else sorted_values(groups[facet])
    fits = fits if fits is not None else pd.DataFrame(columns=["depth", "x", "slope"])
    drawn = {"hollow": False, "theory": False, "power": False, "log": False, "dodged": False}
    with style.theme():
        nr, nc = grid_shape(len(facets))
        fig, axes = canvas(ax, nr, nc, (6.0 * nc + 1.6, 4.8 * nr + 1.6), sharey=True)
        handles = []
        for k, fv in enumerate(facets):
            a = axes.ravel()[k]
            sub = groups if fv is None else groups[groups[facet] == fv]
            dots = pts if fv is None else pts[pts[facet] == fv]
            present = [h for h in colors if (sub[hue] == h).any()]
            shifts = dict(zip(present, _dodges(groups["init_scale"], len(present))))
            drawn["dodged"] |= len(present) > 1
            for h, c in colors.items():
                g = sub[sub[hue] == h]
                if g.empty:
                    continue
                d = dots[dots[hue] == h]
                text = _draw_group(a, d, g, matching_fits(fits, g), c, drawn, shifts[h])
                name = f"{short_label(hue)} {fmt(h)}"
                if fv is not None:
                    name = f"{short_label(facet)} {fmt(fv)}, {name}"
                text = f"{name}:  {'; '.join(text)}" if text else name
                handles.append(Line2D([], [], color=c, marker="o", lw=2, label=text))
            a.set_xscale("log")
            a.set_yscale("log")
            if fv is not None:
                a.set_title(f"{short_label(facet)} = {fmt(fv)}")
            a.grid(True, which="major", alpha=0.3)
        hide_unused(axes, len(facets))
        line = {"color": "0.3", "lw": 1.6}
        if drawn["power"]:
            handles.append(Line2D([], [], **line, label="fitted power law t ∝ α^slope (solid)"))
        if drawn["log"]:
            handles.append(
                Line2D([], [], **line, ls="--", label="fitted t = a + b·log(1/α) (dashed)")
            )
        if drawn["theory"]:
            handles.append(
                Line2D(
                    [], [], color="0.3", ls=":", lw=1.3, label="theory guide (slope only, dotted)"
                )
            )
        if drawn["hollow"]:
            handles.append(
                Line2D(
                    [],
                    [],
                    color="0.3",
                    marker="o",
                    mfc="white",
                    ls="none",
                    label="not fitted (no plateau, regime or init-scale range)",
                )
            )
        if drawn["dodged"]:
            text = "markers of one init scale set side by side by colour (lines at α itself)"
            handles.append(Line2D([], [], ls="none", label=text))
        return finish(
            fig,
            axes,
            title or "Escape time vs init scale",
            handles,
            {"ncols": 2},
            xlabel=label("init_scale"),
            ylabel=label("escape_time"),
        )


class EscapeTime(FigureKind):
    kind = "escape_time"
    order = 20
    fields = ("x", "hue", "facet", "where", "name", "title")
    caption = (
        "Markers: geometric mean over seeds (bars: min–max; hollow: runs left out of the "
        "fit), those of several colours at one init scale set side by side; solid and dashed lines: the fitted laws, drawn over adjacent fitted init "
        "scales only; dotted: the theory's slope drawn through the data's centre (slope "
        "only, not a prediction of the level)."
    )

    def default(self, ctx: Context) -> PlotSpec | None:
        return PlotSpec(kind=self.kind) if "init_scale" in ctx.axes else None

    def resolve(self, p: PlotSpec, ctx: Context) -> PlotSpec:
        x = p.x or "init_scale"
        hue = p.hue or first_free(ctx, ("depth",), {x}, p.where) or "depth"
        facet = p.facet or first_free(ctx, (), {x, hue}, p.where)
        where = fixed_where(ctx, {x, hue, facet, "seed"}, p.where)
        return p.model_copy(update={"x": x, "hue": hue, "facet": facet, "where": where})

    def check(self, p: PlotSpec, key: str) -> None:
        super().check(p, key)
        if p.x is not None and p.x != "init_scale":
            raise SpecError(f"{key}.x", p.x, "escape times are drawn against init_scale")

    def query(self, p: PlotSpec, ctx: Context) -> dict:
        from phasesweep.analysis._analyze import fit_mask

        names = [c for c in dict.fromkeys(("depth", *FIT_GROUP_COLUMNS, p.hue, p.facet)) if c]
        axes = ", ".join(names)
        completed = (
            f"SELECT r.run_id, {', '.join(f'r.{a}' for a in names)}, r.init_scale, "
            "r.status, s.regime, s.n_plateaus, s.escape_time "
            f"FROM {selected_runs(p.where)} AS r JOIN summaries AS s "
            "ON s.sweep = r.sweep AND s.run_id = r.run_id WHERE r.status = 'completed'"
        )
        positive = "FILTER (WHERE escape_time > 0)"
        with ctx.materialized(completed) as rows:
            groups = ctx.con.execute(
                f"SELECT {axes}, init_scale, status, regime, n_plateaus, "
                f"count(escape_time) AS n_escaped, count(*) {positive} AS n, "
                f"sum(ln(escape_time)) {positive} AS sum_log, "
                f"min(escape_time) {positive} AS lo, max(escape_time) {positive} AS hi "
                f"FROM {rows} GROUP BY ALL"
            ).df()
            dots, total = ctx.sample(
                f"SELECT run_id, {axes}, init_scale, escape_time FROM {rows} WHERE escape_time > 0",
                [p.facet, p.hue, "init_scale"],
                MAX_DOTS,
            )
        if groups.empty:
            raise Unavailable("no completed run with a summary (run analyze)")
        if groups["n_escaped"].sum() == 0:
            raise Unavailable("no run escaped (escape_time is NULL for every completed run)")
        # a group's runs share what fit_mask reads; `lo` stands for their escape times
        groups["in_fit"] = fit_mask(groups.assign(escape_time=groups["lo"]), ctx.cfg)
        fits = ctx.df("SELECT * FROM scaling_fits WHERE sweep = ?")
        return {
            "points": dots,
            "groups": groups,
            "fits": fits,
            "eps": ctx.cfg.escape_eps,
            "shown": (len(dots), total),
        }

    def draw(self, data: dict, p: PlotSpec, ax: Axes | None = None) -> Figure:
        cfg_eps = data.get("eps")
        what = f"t where L = L0 − {cfg_eps:g}(L0 − L_end)" if cfg_eps else "escape time"
        title = p.title or f"Escape time vs init scale ({what}){subtitle(p.where)}"
        title += sample_note(*data.get("shown", (0, 0)))
        return escape_time_figure(
            data["points"],
            data["fits"],
            hue=p.hue,
            facet=p.facet,
            title=title,
            ax=ax,
            groups=data.get("groups"),
        )
