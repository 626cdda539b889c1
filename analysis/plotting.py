"""``phasesweep plot``: every figure the sweep's spec asks for, from the store.

The spec's ``plots:`` list names the figures (see ``pipeline.spec.PlotSpec``);
without one, :func:`default_plots` picks them from the swept axes. Unset fields
of a plot are filled the same way (:func:`resolve`). Each figure is written as
``NAME.png`` and ``NAME.svg``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
from matplotlib import pyplot as plt
from phasesweep.analysis import figures
from phasesweep.analysis.phase import AXES, VALUES, phase_diagram_sql
from phasesweep.analysis.style import fmt, save, short_label
from phasesweep.pipeline.spec import AnalysisConfig, PlotSpec, SpecError, SweepSpec

log = logging.getLogger(__name__)

#: swept axes that may serve as phase-diagram / facet axes, in order of preference for y.
_Y_PREFERENCE = ("width", "depth", "noise_sigma", "lr", "n_train", "activation", "leaky_slope")


@dataclass(frozen=True)
class Figure:
    """A resolved plot: what to draw and under which name."""

    spec: PlotSpec
    name: str


def swept_axes(runs: pd.DataFrame, spec: SweepSpec | None) -> list[str]:
    """The runs columns the sweep varies (not seed), in grid order when a spec is known."""
    if spec is not None:
        from phasesweep.analysis.analyze import grid_axes

        axes = [a for a in grid_axes(spec) if a in AXES and a != "seed" and a in runs]
        axes = [a for a in axes if runs[a].nunique(dropna=True) > 1]
        if axes:
            return axes
    cands = ["init_scale", *_Y_PREFERENCE]
    return [a for a in cands if a in runs and runs[a].nunique(dropna=True) > 1]


def default_plots(
    axes: list[str], *, has_layers: bool = True, has_transversal: bool = False
) -> list[PlotSpec]:
    """Figures for a sweep over ``axes`` (see the module docstring)."""
    plots: list[PlotSpec] = []
    if len(axes) >= 2:
        plots.append(PlotSpec(kind="phase_diagram"))
    if "init_scale" in axes:
        plots.append(PlotSpec(kind="escape_time"))
    plots.append(PlotSpec(kind="loss_curves"))
    if has_layers:
        plots.append(PlotSpec(kind="singular_values"))
    if has_transversal or "noise_sigma" in axes:
        plots.append(PlotSpec(kind="transversal"))
    return plots


def _fixed_where(runs: pd.DataFrame, axes: list[str], free: set[str]) -> str | None:
    """A condition fixing every swept axis not in ``free`` (and the seed) to one value."""
    conds = []
    if "seed" not in free and "seed" in runs and runs["seed"].notna().any():
        conds.append(f"seed = {int(runs['seed'].min())}")
    for a in axes:
        if a in free or a not in runs:
            continue
        vals = runs[a].dropna()
        if vals.empty:
            continue
        v = vals.max() if a in ("width", "n_train") else sorted(vals.unique())[0]
        conds.append(f"{a} = " + (f"'{v}'" if isinstance(v, str) else repr(_py(v))))
    return " AND ".join(conds) or None


def _py(v):
    return v.item() if hasattr(v, "item") else v


def resolve(p: PlotSpec, axes: list[str], runs: pd.DataFrame) -> PlotSpec:
    """``p`` with its unset fields chosen from the swept ``axes``."""
    u = {}
    if p.kind == "phase_diagram":
        x = p.x or ("init_scale" if "init_scale" in axes else (axes[0] if axes else "init_scale"))
        y = p.y or next((a for a in [*_Y_PREFERENCE, *axes] if a in axes and a != x), "seed")
        facet = p.facet
        if facet is None:  # the next swept axis that the plot's where clause does not fix
            rest = [a for a in axes if a not in (x, y) and not (p.where and a in p.where)]
            facet = rest[0] if rest else None
        u = {"x": x, "y": y, "value": p.value or "kernel_distance", "facet": facet}
        if p.where is None:
            u["where"] = _fixed_where(runs, axes, {x, y, facet, "seed"})
    elif p.kind == "escape_time":
        u = {"x": p.x or "init_scale", "hue": p.hue or "depth"}
        if p.where is None:
            u["where"] = _fixed_where(runs, axes, {u["x"], u["hue"], "seed"})
    elif p.kind == "loss_curves":
        hue = p.hue or ("init_scale" if "init_scale" in axes else (axes[0] if axes else "seed"))
        facet = p.facet
        if facet is None:
            facet = next(
                (
                    a
                    for a in ("depth", "width", *axes)
                    if a in axes and a != hue and not (p.where and a in p.where)
                ),
                None,
            )
        u = {"hue": hue, "facet": facet}
        if p.where is None:
            u["where"] = _fixed_where(runs, axes, {hue, facet})
    elif p.kind == "singular_values":
        if p.where is None:
            u["where"] = _fixed_where(runs, axes, {"init_scale", "depth"})
    elif p.kind == "transversal":
        u = {"x": p.x or "noise_sigma", "hue": p.hue or "depth"}
        if p.where is None:
            u["where"] = _fixed_where(runs, axes, {u["x"], u["hue"], "seed"})
    return p.model_copy(update=u)


def _name(p: PlotSpec) -> str:
    if p.name:
        return p.name
    if p.kind == "phase_diagram":
        return f"phase_{p.value}_{p.x}_{p.y}" + (f"_by_{p.facet}" if p.facet else "")
    return p.kind


def _in_runs(sweep: str, where: str | None) -> str:
    """SQL condition selecting the sweep's runs matching ``where`` (alias-free)."""
    q = "'" + sweep.replace("'", "''") + "'"
    cond = f"sweep = {q}" + (f" AND ({where})" if where else "")
    return f"run_id IN (SELECT run_id FROM runs WHERE {cond})"


def _subtitle(where: str | None) -> str:
    return f" [{where}]" if where else ""


def render(con, sweep: str, p: PlotSpec, cfg: AnalysisConfig) -> plt.Figure | None:
    """Draw one resolved plot from the catalog ``con``; None if there is nothing to draw."""
    q = [sweep]
    if p.kind == "phase_diagram":
        cells = con.execute(
            phase_diagram_sql(sweep, p.x, p.y, p.value, facet=p.facet, where=p.where)
        ).df()
        if cells.empty:
            return None
        thr = None
        if p.value in (cfg.order_parameter, "order_value"):
            thr = cfg.lazy_threshold
        elif p.value in ("kernel_distance", "param_rel_change"):
            thr = cfg.fallback_lazy_threshold
        title = p.title or (
            f"Phase diagram — {short_label(p.value)}, mean over seeds{_subtitle(p.where)}"
        )
        return figures.phase_diagram_figure(
            cells, x=p.x, y=p.y, value=p.value, threshold=thr, facet=p.facet, title=title
        )
    if p.kind == "escape_time":
        pts = con.execute(
            f"SELECT r.run_id, r.status, r.depth, r.{p.x} AS init_scale, r.seed, s.escape_time, "
            "s.regime, s.n_plateaus "
            "FROM runs r JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id "
            f"WHERE r.sweep = ? AND r.status = 'completed' AND r.{_in_runs(sweep, p.where)}",
            q,
        ).df()
        if pts["escape_time"].notna().sum() == 0:
            return None
        from phasesweep.analysis.analyze import fit_mask

        pts["in_fit"] = fit_mask(pts, cfg)
        fits = con.execute("SELECT * FROM scaling_fits WHERE sweep = ?", q).df()
        fits = _match_fits(fits, con, sweep, p.where)
        title = p.title or (
            f"Escape time vs init scale (t where L = L0 − {cfg.escape_eps:g}(L0 − L_end))"
            f"{_subtitle(p.where)}"
        )
        return figures.escape_time_figure(pts, fits, title=title)
    if p.kind == "loss_curves":
        cols = ", ".join(dict.fromkeys(c for c in ("status", p.hue, p.facet) if c))
        runs = con.execute(
            f"SELECT run_id, {cols} FROM runs WHERE sweep = ? AND {_in_runs(sweep, p.where)}",
            q,
        ).df()
        if runs.empty:
            return None
        traj = con.execute(
            "SELECT run_id, time, train_loss FROM trajectories "
            f"WHERE sweep = ? AND {_in_runs(sweep, p.where)} ORDER BY run_id, time",
            q,
        ).df()
        pl = con.execute(
            f"SELECT * FROM plateaus WHERE sweep = ? AND {_in_runs(sweep, p.where)}", q
        ).df()
        title = p.title or f"Train loss vs gradient-flow time{_subtitle(p.where)}"
        return figures.loss_curves_figure(traj, runs, pl, hue=p.hue, facet=p.facet, title=title)
    if p.kind == "singular_values":
        pick = con.execute(
            # the smallest init that escaped a saddle (else the smallest init), deepest first
            "SELECT r.run_id, r.init_scale, r.depth, r.width, r.seed FROM runs r "
            "LEFT JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id "
            f"WHERE r.sweep = ? AND r.status = 'completed' AND r.{_in_runs(sweep, p.where)} "
            "ORDER BY coalesce(s.n_plateaus, 0) >= 1 DESC, r.init_scale ASC, r.depth DESC, "
            "r.run_id LIMIT 1",
            q,
        ).df()
        if pick.empty:
            return None
        rid = pick["run_id"].iloc[0]
        layers = con.execute(
            "SELECT l.layer, t.time, l.top_sv, l.delta_top_sv FROM layers l "
            "JOIN trajectories t ON t.sweep = l.sweep AND t.run_id = l.run_id AND t.step = l.step "
            "WHERE l.sweep = ? AND l.run_id = ? ORDER BY l.layer, t.time",
            [sweep, rid],
        ).df()
        if layers.empty:
            return None
        r = pick.iloc[0]
        desc = ", ".join(f"{k} {fmt(r[k])}" for k in ("init_scale", "depth", "width", "seed"))
        title = p.title or f"Top singular values per layer — run {desc}"
        return figures.singular_values_figure(layers, title=title)
    if p.kind == "transversal":
        df = con.execute(
            f"SELECT r.run_id, r.{p.x}, r.{p.hue}, r.seed, s.final_transversal_grad_sq "
            "FROM runs r JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id "
            f"WHERE r.sweep = ? AND r.status = 'completed' AND r.{_in_runs(sweep, p.where)}",
            q,
        ).df()
        if df["final_transversal_grad_sq"].notna().sum() == 0:
            return None
        title = p.title or f"Transversal variation vs {short_label(p.x)}{_subtitle(p.where)}"
        return figures.transversal_figure(df, x=p.x, hue=p.hue, title=title)
    raise ValueError(f"unknown plot kind {p.kind!r}")


def _match_fits(fits: pd.DataFrame, con, sweep: str, where: str | None) -> pd.DataFrame:
    """The fits whose group axes agree with the runs selected by ``where``."""
    if fits.empty or not where:
        return fits
    sel = con.execute(
        f"SELECT DISTINCT width, activation, noise_sigma, lr FROM runs "
        f"WHERE sweep = ? AND {_in_runs(sweep, where)}",
        [sweep],
    ).df()
    keep = np.ones(len(fits), dtype=bool)
    for c in ("width", "activation", "noise_sigma", "lr"):
        vals = set(sel[c].dropna().tolist())
        col = fits[c]
        keep &= col.isna().to_numpy() | col.isin(vals).to_numpy()
    return fits[keep]


@dataclass(frozen=True)
class Rendered:
    """A figure written by :func:`render_all`."""

    name: str
    spec: PlotSpec  # resolved
    paths: list[Path]  # NAME.png, NAME.svg
    sql: str | None = None  # the phase-diagram query, for phase diagrams


def plots_for(con, sweep: str, spec: SweepSpec | None) -> tuple[list[PlotSpec], pd.DataFrame]:
    """The resolved plots of ``sweep`` (the spec's, else the defaults), and its runs."""
    runs = con.execute("SELECT * FROM runs WHERE sweep = ?", [sweep]).df()
    if runs.empty:
        raise ValueError(f"sweep {sweep!r} has no runs in the store")
    axes = swept_axes(runs, spec)
    if spec is not None and spec.plots is not None:
        plots = list(spec.plots)
    else:
        has_layers = (
            con.execute("SELECT count(*) FROM layers WHERE sweep = ?", [sweep]).fetchone()[0] > 0
        )
        has_tv = (
            con.execute(
                "SELECT count(*) FROM summaries WHERE sweep = ? AND final_transversal_grad_sq > 0",
                [sweep],
            ).fetchone()[0]
            > 0
        )
        plots = default_plots(axes, has_layers=has_layers, has_transversal=has_tv)
    resolved = [resolve(p, axes, runs) for p in plots]
    for i, p in enumerate(resolved):
        check(con, sweep, p, i)
    return resolved, runs


def check(con, sweep: str, p: PlotSpec, index: int) -> None:
    """Raise ``SpecError`` (key ``plots[i].FIELD``) for a plot that cannot be drawn."""
    key = f"plots[{index}]"
    for field in ("x", "y", "facet", "hue"):
        v = getattr(p, field)
        if v is not None and v not in AXES:
            raise SpecError(f"{key}.{field}", v, f"not a runs axis; known: {', '.join(AXES)}")
    if p.kind == "phase_diagram" and p.value not in VALUES:
        raise SpecError(f"{key}.value", p.value, f"known: {', '.join(VALUES)}")
    if p.kind == "escape_time" and p.x != "init_scale":
        raise SpecError(f"{key}.x", p.x, "escape times are drawn against init_scale")
    if p.where:
        try:
            con.execute(f"SELECT count(*) FROM runs WHERE sweep = ? AND ({p.where})", [sweep])
        except duckdb.Error as e:
            raise SpecError(f"{key}.where", p.where, str(e).splitlines()[0]) from None


def render_all(con, sweep: str, spec: SweepSpec | None, out_dir: Path | str) -> list[Rendered]:
    """Render every figure of ``sweep`` from the catalog ``con`` into ``out_dir``."""
    plots, _ = plots_for(con, sweep, spec)
    cfg = spec.analysis if spec is not None else AnalysisConfig()
    done: list[Rendered] = []
    used: set[str] = set()
    for p in plots:
        name = base = _name(p)
        i = 2
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        fig = render(con, sweep, p, cfg)
        if fig is None:
            log.warning("plot %s of sweep %s: nothing to draw, skipped", name, sweep)
            continue
        sql = (
            phase_diagram_sql(sweep, p.x, p.y, p.value, facet=p.facet, where=p.where)
            if p.kind == "phase_diagram"
            else None
        )
        done.append(Rendered(name, p, save(fig, out_dir, name), sql))
    return done


def default_out_dir(store, sweep: str) -> Path:
    """Where figures go without ``--out``: ``STORE/figures/SWEEP`` for a local store,
    ``./figures/SWEEP`` for an object store (copied into the store too, see :func:`plot`)."""
    if store.is_local:
        return Path(store.root) / "figures" / sweep
    return Path("figures") / sweep


def render_store(store, sweep: str, out_dir: Path | str | None = None) -> list[Rendered]:
    """:func:`render_all` on a store (analyzing the sweep first if it has no summaries)."""
    from phasesweep.analysis.analyze import analyze, load_spec
    from phasesweep.storage import open_catalog

    con = open_catalog(store)
    try:
        n = con.execute("SELECT count(*) FROM summaries WHERE sweep = ?", [sweep]).fetchone()[0]
        if n == 0:
            con.close()
            analyze(store, sweep)
            con = open_catalog(store)
        out = Path(out_dir) if out_dir is not None else default_out_dir(store, sweep)
        done = render_all(con, sweep, load_spec(store, sweep), out)
    finally:
        con.close()
    if out_dir is None and not store.is_local:
        for r in done:
            for p in r.paths:
                store.fs.put_file(str(p), f"{store.root}/figures/{sweep}/{p.name}")
    return done


def plot(store, sweep: str, out_dir: Path | str | None = None) -> list[Path]:
    """Regenerate every figure of ``sweep``; returns the PNG and SVG paths written.

    ``store``: a ``storage.Store`` or URI. Runs ``analyze`` first if the sweep has
    no summaries yet. Without ``out_dir`` the figures go to :func:`default_out_dir`;
    for an object store they are also uploaded to ``STORE/figures/SWEEP/``.
    """
    from phasesweep.storage import Store

    store = store if isinstance(store, Store) else Store.open(store)
    return [p for r in render_store(store, sweep, out_dir) for p in r.paths]
