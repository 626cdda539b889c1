"""``phasesweep report``: one self-contained HTML page per sweep.

The page holds the sweep's spec, the counts of runs by status and by regime,
every figure of ``phasesweep plot`` (PNG embedded as ``data:`` URIs, so the
file can be mailed or archived alone: no external resource, no script), the
SQL behind the phase diagrams, and the fitted-slope table.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from phasesweep.analysis.style import fmt

_CSS = """
body { font-family: -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.45; padding: 0 1em; }
h1 { margin-bottom: 0.1em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em;
  margin-top: 1.8em; }
.meta { color: #666; margin-top: 0; }
pre { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 4px; padding: 0.8em;
      overflow-x: auto; font-size: 0.85em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #d0d7de; padding: 0.3em 0.7em; text-align: right; }
th { background: #f0f3f6; } td.l, th.l { text-align: left; }
figure { margin: 1.2em 0; } figure img { max-width: 100%; height: auto;
  border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9em; }
.counts { display: flex; gap: 2.5em; flex-wrap: wrap; }
"""


@dataclass(frozen=True)
class ReportFigure:
    name: str
    png: bytes
    caption: str = ""
    sql: str | None = None


def _table(df: pd.DataFrame, table_id: str, left: tuple[str, ...] = ()) -> str:
    head = "".join(
        f'<th class="{"l" if c in left else ""}">{html.escape(str(c))}</th>' for c in df.columns
    )
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, rec):
            text = "" if v is None or (isinstance(v, float) and pd.isna(v)) else v
            if isinstance(text, float):
                text = f"{text:.4g}"
            cls = ' class="l"' if c in left else ""
            cells.append(f"<td{cls}>{html.escape(str(text))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def fits_display(fits: pd.DataFrame) -> pd.DataFrame:
    """The scaling_fits rows as the report shows them."""
    if fits.empty:
        return pd.DataFrame(
            columns=[
                "depth",
                "group",
                "fit",
                "slope",
                "CI",
                "theory slope",
                "theory",
                "points",
                "seeds",
                "note",
            ]
        )
    rows = []
    for f in fits.sort_values(["depth", "x"]).itertuples(index=False):
        group = ", ".join(
            f"{c} {fmt(getattr(f, c))}"
            for c in ("width", "activation", "noise_sigma", "lr")
            if getattr(f, c) is not None and not pd.isna(getattr(f, c))
        )
        y = "log t" if f.y == "log_escape_time" else "t"
        x = {
            "log_init_scale": "log α",
            "log_inv_init_scale": "log(1/α)",
            "log_log_inv_init_scale": "log log(1/α)",
        }.get(f.x, f.x)
        ci = (
            f"[{f.ci_low:.3g}, {f.ci_high:.3g}] ({f.confidence:.0%}, {f.ci_method})"
            if pd.notna(f.ci_low)
            else ""
        )
        rows.append(
            {
                "depth": int(f.depth),
                "group": group,
                "fit": f"{y} vs {x}",
                "slope": None if pd.isna(f.slope) else float(f.slope),
                "CI": ci,
                "theory slope": None if pd.isna(f.theory_slope) else float(f.theory_slope),
                "theory": f.theory,
                "points": int(f.n_points),
                "seeds": int(f.n_seeds),
                "note": ""
                if pd.notna(f.slope)
                else "no fit: needs escape times over the required decades of α per seed "
                "(analysis.fit_min_decades) in the fitted regimes",
            }
        )
    return pd.DataFrame(rows)


def report_html(
    sweep: str,
    *,
    spec_text: str | None,
    status_counts: pd.DataFrame,
    regime_counts: pd.DataFrame,
    fits: pd.DataFrame,
    figures: list[ReportFigure],
    plateau_counts: pd.DataFrame | None = None,
    description: str = "",
) -> str:
    """The report page (a complete HTML document) from its parts."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>phasesweep report — {html.escape(sweep)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Sweep <code>{html.escape(sweep)}</code></h1>",
        f'<p class="meta">{html.escape(description)} — generated {now} by phasesweep</p>',
        "<h2>Runs</h2>",
        '<div class="counts">',
        "<div><h3>By status</h3>" + _table(status_counts, "status-counts", ("status",)) + "</div>",
        "<div><h3>By regime</h3>" + _table(regime_counts, "regime-counts", ("regime",)) + "</div>",
    ]
    if plateau_counts is not None and len(plateau_counts):
        parts.append(
            "<div><h3>Plateaus per run</h3>" + _table(plateau_counts, "plateau-counts") + "</div>"
        )
    parts.append("</div>")
    parts.append("<h2>Figures</h2>")
    if not figures:
        parts.append("<p>No figures (nothing to draw).</p>")
    for f in figures:
        b64 = base64.b64encode(f.png).decode("ascii")
        parts.append(
            f'<figure id="fig-{html.escape(f.name)}">'
            f'<img alt="{html.escape(f.name)}" src="data:image/png;base64,{b64}">'
            f"<figcaption><b>{html.escape(f.name)}</b> {html.escape(f.caption)}</figcaption>"
        )
        if f.sql:
            parts.append(
                "<details><summary>SQL behind this figure</summary>"
                f"<pre>{html.escape(f.sql)}</pre></details>"
            )
        parts.append("</figure>")
    parts.append("<h2>Fitted slopes of the escape time</h2>")
    parts.append(
        "<p>Per depth (and group of the other grid axes): the slope of the escape time "
        "vs the init scale α, with its confidence interval over seeds, and the theory's "
        "slope where it gives one.</p>"
    )
    parts.append(
        _table(fits_display(fits), "slope-table", ("group", "fit", "CI", "theory", "note"))
    )
    parts.append("<h2>Spec</h2>")
    parts.append(
        f'<pre id="spec">{html.escape(spec_text) if spec_text else "(no spec stored)"}</pre>'
    )
    parts.append("</body></html>")
    return "\n".join(parts)


_CAPTIONS = {
    "phase_diagram": "Colour: final order parameter, mean over seeds; red contour: the "
    "lazy/rich threshold; hatched grey: every run of the cell diverged.",
    "escape_time": "Markers: geometric mean over seeds (bars: min–max); solid: fitted laws; "
    "dotted: theory slopes drawn through the data's centre (slope only).",
    "loss_curves": "Train loss vs gradient-flow time, log–log, coloured by init scale; "
    "shaded boxes: detected plateaus (time span × level ±25 %).",
    "singular_values": "Top singular values of each layer (top row: W_l(t); bottom row: "
    "W_l(t) − W_l(0)).",
    "transversal": "Final transversal variation mean ‖P⊥ ∇ₓf‖² vs noise σ, by depth "
    "(mean ± sd over seeds).",
}


def report(store, sweep: str, out_dir: Path | str | None = None) -> Path:
    """Write ``report.html`` for ``sweep`` into ``out_dir`` (default: the figures folder).

    ``store``: a ``storage.Store`` or URI. Regenerates the figures (as ``plot``)
    into the same folder, running ``analyze`` first if the sweep has no summaries.
    Returns the path of the page.
    """
    from phasesweep.analysis.analyze import load_spec
    from phasesweep.analysis.plotting import default_out_dir, render_store
    from phasesweep.storage import Store, open_catalog

    store = store if isinstance(store, Store) else Store.open(store)
    out = Path(out_dir) if out_dir is not None else default_out_dir(store, sweep)
    rendered = render_store(store, sweep, out)
    spec = load_spec(store, sweep)
    con = open_catalog(store)
    try:
        status = con.execute(
            "SELECT status, count(*) AS runs FROM runs WHERE sweep = ? GROUP BY status "
            "ORDER BY runs DESC, status",
            [sweep],
        ).df()
        regimes = con.execute(
            "SELECT coalesce(s.regime, '(none)') AS regime, count(*) AS runs "
            "FROM runs r LEFT JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id "
            "WHERE r.sweep = ? GROUP BY 1 ORDER BY runs DESC, regime",
            [sweep],
        ).df()
        plateau_counts = con.execute(
            "SELECT n_plateaus AS plateaus, count(*) AS runs FROM summaries "
            "WHERE sweep = ? AND n_plateaus IS NOT NULL GROUP BY 1 ORDER BY 1",
            [sweep],
        ).df()
        fits = con.execute("SELECT * FROM scaling_fits WHERE sweep = ?", [sweep]).df()
    finally:
        con.close()
    figs = [
        ReportFigure(
            r.name,
            next(p for p in r.paths if p.suffix == ".png").read_bytes(),
            _CAPTIONS.get(r.spec.kind, ""),
            r.sql,
        )
        for r in rendered
    ]
    text = report_html(
        sweep,
        spec_text=store.read_spec(sweep),
        status_counts=status,
        regime_counts=regimes,
        fits=fits,
        figures=figs,
        plateau_counts=plateau_counts,
        description=spec.description if spec is not None else "",
    )
    out.mkdir(parents=True, exist_ok=True)
    page = out / "report.html"
    page.write_text(text, encoding="utf-8")
    if out_dir is None and not store.is_local:
        store.fs.put_file(str(page), f"{store.root}/figures/{sweep}/report.html")
    return page
