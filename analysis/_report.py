"""``phasesweep report``: one self-contained HTML page per sweep.

The page says what made it (phasesweep version, git commit of the code, command
line, the launch's own command line when the store records it), what the sweep
cost (wall time, devices, nodes), what it is (the spec's header comment and
description), the counts of runs by status, regime and plateaus, every figure of
``phasesweep plot`` (PNG embedded as ``data:`` URIs, so the file can be mailed or
archived alone: no external resource, no script; each links to its SVG beside the
page), the SQL behind the phase diagrams, the fitted-slope table and the spec.
Empty tables are left out.
"""

from __future__ import annotations

import base64
import html
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from phasesweep.analysis._style import fmt
from phasesweep.storage.schema import FIT_GROUP_COLUMNS

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
dl.prov { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.prov dt { color: #555; } dl.prov dd { margin: 0; }
"""


@dataclass(frozen=True)
class ReportFigure:
    name: str
    png: bytes
    caption: str = ""
    sql: str | None = None
    #: link to the figure's SVG, relative to the page (None: no link).
    svg: str | None = None


@dataclass(frozen=True)
class Provenance:
    """What made the report and what the sweep cost (see :func:`provenance`)."""

    version: str
    commit: str
    command: str
    generated: str
    wall_seconds: float | None = None  # sum over the sweep's chunks
    span_seconds: float | None = None  # first start to last finish
    devices: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    #: the launch as the store records it: argv, version, commit, started_at, finished_at.
    launch: dict[str, Any] | None = None


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
            for c in FIT_GROUP_COLUMNS
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


def boundaries_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``boundaries`` rows as the report shows them (one row per refined line)."""
    cols = [
        "metric",
        "level",
        "axis",
        "line",
        "boundary",
        "bracket_low",
        "bracket_high",
        "seed_spread",
        "bracketed",
        "side",
        "n_runs",
    ]
    return frame[[c for c in cols if c in frame.columns]].reset_index(drop=True)


def spec_header(text: str | None) -> str:
    """The leading comment block of a spec's YAML (``#`` stripped), or ""."""
    lines = []
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            lines.append(stripped[1:][1:] if stripped[1:2] == " " else stripped[1:])
        elif stripped or lines:
            break
    return "\n".join(lines).strip("\n")


def code_commit() -> str:
    """The git commit of the phasesweep code that runs, ``+dirty`` if it has local changes;
    "unknown" unless the package's own files are tracked in a git checkout."""
    import phasesweep

    src = Path(phasesweep.__file__).resolve()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(src.parent), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()

    try:
        git("ls-files", "--error-unmatch", src.name)  # tracked: a checkout, not a venv copy
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def provenance(
    con, sweep: str, command: Sequence[str] | None = None, launch: dict | None = None
) -> Provenance:
    """The report's provenance; ``con``: the open catalog. ``command``: the command line
    that makes the report (default: this process's ``sys.argv``)."""
    import phasesweep

    argv = list(command) if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]
    row = con.execute(
        "SELECT sum(wall_seconds), "
        "epoch(max(finished_at)) - min(epoch(finished_at) - coalesce(chunk_wall_seconds, "
        "wall_seconds, 0)) FROM runs WHERE sweep = ?",
        [sweep],
    ).fetchone()
    devices = con.execute(
        "SELECT DISTINCT device FROM runs WHERE sweep = ? AND device IS NOT NULL ORDER BY 1",
        [sweep],
    ).fetchall()
    nodes = con.execute(
        "SELECT DISTINCT node_id FROM runs WHERE sweep = ? AND node_id IS NOT NULL ORDER BY 1",
        [sweep],
    ).fetchall()
    return Provenance(
        version=phasesweep.__version__,
        commit=code_commit(),
        command=shlex.join(argv),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        wall_seconds=None if row[0] is None else float(row[0]),
        span_seconds=None if row[1] is None else float(row[1]),
        devices=tuple(r[0] for r in devices),
        nodes=tuple(r[0] for r in nodes),
        launch=launch,
    )


def duration(seconds: float | None) -> str:
    """``seconds`` as "1 h 02 min", "3 min 05 s" or "12.3 s"; "unknown" for None."""
    if seconds is None or seconds != seconds:
        return "unknown"
    s = float(seconds)
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(round(s), 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


def _provenance_html(p: Provenance) -> str:
    rows = [
        ("phasesweep", f"{p.version} (commit {p.commit})"),
        ("report made by", f"<code>{html.escape(p.command)}</code>"),
        ("generated", p.generated),
    ]
    if p.launch:
        argv = p.launch.get("argv")
        cmd = shlex.join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv or "")
        when = " → ".join(
            html.escape(str(p.launch[k])) for k in ("started_at", "finished_at") if p.launch.get(k)
        )
        made = ", ".join(
            f"{k} {html.escape(str(p.launch[k]))}" for k in ("version", "commit") if p.launch.get(k)
        )
        rows.append(("launched by", f'<code id="launch-argv">{html.escape(cmd)}</code>'))
        if made:
            rows.append(("launched with", "phasesweep " + made))
        if when:
            rows.append(("launch time", when))
    rows.append(
        (
            "wall time",
            f"{duration(p.wall_seconds)} summed over chunks, "
            f"{duration(p.span_seconds)} from first start to last finish",
        )
    )
    rows.append(("devices", html.escape(", ".join(p.devices)) or "unknown"))
    rows.append(
        ("nodes", html.escape(", ".join(p.nodes)) if p.nodes else "no Ray node recorded (local)")
    )
    body = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{v if k != 'phasesweep' else html.escape(v)}</dd>"
        for k, v in rows
    )
    return f'<dl class="prov" id="provenance">{body}</dl>'


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
    provenance: Provenance | None = None,
    boundaries: pd.DataFrame | None = None,
) -> str:
    """The report page (a complete HTML document) from its parts; empty tables are left out."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>phasesweep report — {html.escape(sweep)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>Sweep <code>{html.escape(sweep)}</code></h1>",
    ]
    if description:
        parts.append(f'<p class="meta" id="description">{html.escape(description)}</p>')
    if provenance is not None:
        parts.append(_provenance_html(provenance))
    else:
        parts.append(f'<p class="meta">generated {now} by phasesweep</p>')
    header = spec_header(spec_text)
    if header:
        parts.append(
            "<details open><summary>About this sweep (the spec's header)</summary>"
            f'<pre id="spec-header">{html.escape(header)}</pre></details>'
        )
    counts = [
        ("By status", status_counts, "status-counts", ("status",)),
        ("By regime", regime_counts, "regime-counts", ("regime",)),
        ("Plateaus per run", plateau_counts, "plateau-counts", ()),
    ]
    counts = [c for c in counts if c[1] is not None and len(c[1])]
    if counts:
        parts += ["<h2>Runs</h2>", '<div class="counts">']
        parts += [f"<div><h3>{t}</h3>{_table(df, i, left)}</div>" for t, df, i, left in counts]
        parts.append("</div>")
    parts.append("<h2>Figures</h2>")
    if not figures:
        parts.append("<p>No figures (nothing to draw).</p>")
    for f in figures:
        b64 = base64.b64encode(f.png).decode("ascii")
        link = f' <a href="{html.escape(f.svg)}">SVG</a>' if f.svg else ""
        parts.append(
            f'<figure id="fig-{html.escape(f.name)}">'
            f'<img alt="{html.escape(f.name)}" src="data:image/png;base64,{b64}">'
            f"<figcaption><b>{html.escape(f.name)}</b> {html.escape(f.caption)}{link}"
            "</figcaption>"
        )
        if f.sql:
            parts.append(
                "<details><summary>SQL behind this figure</summary>"
                f"<pre>{html.escape(f.sql)}</pre></details>"
            )
        parts.append("</figure>")
    if len(fits):
        parts.append("<h2>Fitted slopes of the escape time</h2>")
        parts.append(
            "<p>Per depth (and group of the other grid axes): the slope of the escape time "
            "vs the init scale α, with its confidence interval over seeds, and the theory's "
            "slope where it gives one.</p>"
        )
        parts.append(
            _table(fits_display(fits), "slope-table", ("group", "fit", "CI", "theory", "note"))
        )
    if boundaries is not None and len(boundaries):
        parts.append("<h2>Refined phase boundaries</h2>")
        parts.append(
            "<p>From <code>phasesweep refine</code>: per line of the other axes, where the "
            "metric crosses the level along the axis, with the bracketing interval, the "
            "spread of the seeds' own crossings and the runs used; unbracketed lines say "
            "on which side of the level the whole axis range lies.</p>"
        )
        parts.append(_table(boundaries_display(boundaries), "boundaries-table", ("line",)))
    parts.append("<h2>Spec</h2>")
    parts.append(
        f'<pre id="spec">{html.escape(spec_text) if spec_text else "(no spec stored)"}</pre>'
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def report(
    store,
    sweep: str,
    out_dir: Path | str | None = None,
    *,
    launch: dict | None = None,
    command: Sequence[str] | None = None,
) -> Path:
    """Write ``report.html`` for ``sweep`` into ``out_dir`` (default: the figures folder).

    ``store``: a ``storage.Store`` or URI. Regenerates the figures (as ``plot``)
    into the same folder, running ``analyze`` first if the sweep has no summaries;
    a figure that cannot be drawn is left out with a warning. The catalog is opened
    once (twice when the sweep must be analyzed first) and the spec loaded once.
    ``launch``: the launch record of the sweep (keys ``argv``, ``version``,
    ``commit``, ``started_at``, ``finished_at``), shown when given; ``command``: the
    command line that makes the report (default ``sys.argv``). Returns the page's path.
    """
    from phasesweep.analysis._boundaries import boundaries_frame
    from phasesweep.analysis._output import prepare_dir, write_file
    from phasesweep.analysis._plotting import default_out_dir, open_sweep, render_all, upload
    from phasesweep.storage._store import as_store

    store = as_store(store)
    out = Path(out_dir) if out_dir is not None else default_out_dir(store, sweep)
    prepare_dir(out, create=False)
    with open_sweep(store, sweep) as ctx:
        rendered = render_all(ctx, out)
        con = ctx.con
        status = ctx.df(
            "SELECT status, count(*) AS runs FROM runs WHERE sweep = ? GROUP BY status "
            "ORDER BY runs DESC, status"
        )
        regimes = ctx.df(
            "SELECT coalesce(s.regime, '(none)') AS regime, count(*) AS runs "
            "FROM runs r LEFT JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id "
            "WHERE r.sweep = ? GROUP BY 1 ORDER BY runs DESC, regime"
        )
        plateau_counts = ctx.df(
            "SELECT n_plateaus AS plateaus, count(*) AS runs FROM summaries "
            "WHERE sweep = ? AND n_plateaus IS NOT NULL GROUP BY 1 ORDER BY 1"
        )
        fits = ctx.df("SELECT * FROM scaling_fits WHERE sweep = ?")
        refined = boundaries_frame(con, sweep)
        prov = provenance(con, sweep, command, launch)
        spec, spec_text = ctx.spec, ctx.spec_text
    figs = [
        ReportFigure(
            r.name,
            next(p for p in r.paths if p.suffix == ".png").read_bytes(),
            r.caption,
            r.sql,
            next((p.name for p in r.paths if p.suffix == ".svg"), None),
        )
        for r in rendered
    ]
    text = report_html(
        sweep,
        spec_text=spec_text,
        status_counts=status,
        regime_counts=regimes,
        fits=fits,
        figures=figs,
        plateau_counts=plateau_counts,
        description=spec.description if spec is not None else "",
        provenance=prov,
        boundaries=refined,
    )
    page = write_file(prepare_dir(out), "report.html", text.encode("utf-8"))
    if out_dir is None and not store.is_local:
        upload(store, sweep, [page])
    return page
