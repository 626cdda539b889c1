"""The report's page: its jinja2 template (:data:`TEMPLATE`, autoescaped), its tables
(runs by status, regime and plateaus, with why a run has no regime; refined boundaries),
the provenance (what made the page, what the sweep cost) and :func:`report_html`, which
puts the parts together. ``analysis._report.report`` reads the parts from the store.
"""

from __future__ import annotations

import base64
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
from phasesweep.analysis._analyze import Reach
from phasesweep.analysis._report._fits import fits_display
from phasesweep.analysis.config import REACH_RTOL, AnalysisConfig

_CSS = """
body { font-family: -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.45; padding: 0 1em; }
h1 { margin-bottom: 0.1em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em;
  margin-top: 1.8em; }
.meta { color: #666; margin-top: 0; }
.note { color: #555; font-size: 0.9em; max-width: 40em; }
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
td.pass { color: #1a7f37; } td.fail { color: #cf222e; font-weight: bold; }
td.stale, td.incomplete { color: #9a6700; }
"""

#: The page. Every value is escaped (autoescape) unless it is ``Markup``.
TEMPLATE = """\
{%- macro table(t) -%}
<table id="{{ t.id }}"><thead><tr>
{%- for c in t.frame.columns %}<th{% if c in t.left %} class="l"{% endif %}>{{ c }}</th>{% endfor -%}
</tr></thead><tbody>
{%- for row in t.frame.itertuples(index=False) %}<tr>
{%- for c, v in zip(t.frame.columns, row) %}<td{% if c in t.left %} class="l"{% endif %}>
{{- v | cell }}</td>{% endfor %}</tr>{% endfor -%}
</tbody></table>
{%- endmacro -%}
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>phasesweep report — {{ sweep }}</title>
<style>{{ css }}</style></head><body>
<h1>Sweep <code>{{ sweep }}</code></h1>
{% if description %}<p class="meta" id="description">{{ description }}</p>
{% endif -%}
{% if provenance -%}
<dl class="prov" id="provenance">
{%- for key, value, code_id in provenance %}<dt>{{ key }}</dt><dd>
{%- if code_id is none %}{{ value }}{% elif code_id is sameas true %}<code>{{ value }}</code>
{%- else %}<code id="{{ code_id }}">{{ value }}</code>{% endif %}</dd>{% endfor -%}
</dl>
{% else %}<p class="meta">generated {{ generated }} by phasesweep</p>
{% endif -%}
{% if header %}<details open><summary>About this sweep (the spec's header)</summary>
<pre id="spec-header">{{ header }}</pre></details>
{% endif -%}
{% if counts %}<h2>Runs</h2>
<div class="counts">
{%- for c in counts %}<div><h3>{{ c.title }}</h3>{{ table(c) }}
{%- if c.note %}<p class="note" id="{{ c.id }}-note">{{ c.note }}</p>{% endif %}</div>
{%- endfor %}</div>
{% endif -%}
<h2>Figures</h2>
{% for f in figures -%}
<figure id="fig-{{ f.name }}"><img alt="{{ f.name }}" src="data:image/png;base64,{{ f.png | b64 }}">
<figcaption><b>{{ f.name }}</b> {{ f.caption }}
{%- if f.svg %} <a download="{{ f.name }}.svg" href="data:image/svg+xml;base64,{{ f.svg | b64 }}">SVG</a>
{%- endif %}</figcaption>
{% if f.sql %}<details><summary>SQL behind this figure</summary><pre>{{ f.sql }}</pre></details>
{% endif %}</figure>
{% else %}<p>No figures (nothing to draw).</p>
{% endfor -%}
{% if fits %}<h2>Fitted slopes of the escape time</h2>
<p>Per depth (and group of the other grid axes): the slope of the escape time vs the init
scale α, with its confidence interval over seeds, and the theory's slope where it gives one.
A fit takes the completed runs that escaped, in the regimes of
<code>analysis.fit_regimes</code>{{ fits.filters }}, and needs, per seed, escape times at two
or more init scales spanning <code>analysis.fit_min_decades</code> = {{ fits.decades }}
decades; the note of a row without a slope says which of these its runs missed.</p>
{{ table(fits) }}
{% endif -%}
{% if boundaries %}<h2>Refined phase boundaries</h2>
<p>From <code>phasesweep refine</code>: per line of the other axes, where the metric crosses
the level along the axis, with the bracketing interval, the spread of the seeds' own
crossings and the runs used; unbracketed lines say on which side of the level the whole axis
range lies.</p>
{{ table(boundaries) }}
{% endif -%}
{{ gallery | safe }}
<h2>Spec</h2>
{% if header %}<p class="note">As stored, less its header comment (above).</p>
{% endif -%}
<pre id="spec">{{ spec if spec else "(no spec stored)" }}</pre>
</body></html>
"""


def _cell(v: Any) -> str:
    """A table cell's text: empty for NULL, 4 significant digits for a float."""
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


#: The page's jinja2 environment (autoescaped), its filters and globals.
PAGE_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
PAGE_ENV.filters["cell"] = _cell
PAGE_ENV.filters["b64"] = lambda data: base64.b64encode(data).decode("ascii")
PAGE_ENV.globals["zip"] = zip


@dataclass(frozen=True)
class ReportFigure:
    name: str
    png: bytes
    caption: str = ""
    sql: str | None = None
    #: the figure as SVG, embedded as a download link (None: no link).
    svg: bytes | None = None


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


@dataclass(frozen=True)
class _Table:
    """A table of the page: its rows, its element id and its left-aligned columns."""

    frame: pd.DataFrame
    id: str
    left: tuple[str, ...] = ()
    title: str = ""
    note: str = ""
    filters: str = ""
    decades: str = ""

    def __bool__(self) -> bool:
        return len(self.frame) > 0


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


def spec_body(text: str | None) -> str:
    """The spec's YAML after its leading comment block (:func:`spec_header` shows that)."""
    lines = (text or "").splitlines(keepends=True)
    i = 0
    while i < len(lines) and (lines[i].strip().startswith("#") or not lines[i].strip()):
        i += 1
    return "".join(lines[i:])


def code_commit() -> str:
    """The git commit of the phasesweep code that runs, ``+dirty`` if it has local changes;
    "unknown" unless the package's own files are tracked in a git checkout."""
    from phasesweep import _version

    src = Path(_version.__file__).resolve()  # a module of the package's own folder

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
    from phasesweep._version import __version__

    argv = list(command) if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]
    # one pass over the runs (the view's window over all of them is the cost at scale)
    row = con.execute(
        "SELECT sum(wall_seconds), "
        "epoch(max(finished_at)) - min(epoch(finished_at) - coalesce(chunk_wall_seconds, "
        "wall_seconds, 0)), list(DISTINCT device ORDER BY device) FILTER (device IS NOT NULL), "
        "list(DISTINCT node_id ORDER BY node_id) FILTER (node_id IS NOT NULL) "
        "FROM runs WHERE sweep = ?",
        [sweep],
    ).fetchone()
    return Provenance(
        version=__version__,
        commit=code_commit(),
        command=shlex.join(argv),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        wall_seconds=None if row[0] is None else float(row[0]),
        span_seconds=None if row[1] is None else float(row[1]),
        devices=tuple(row[2] or ()),
        nodes=tuple(row[3] or ()),
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


def _provenance_rows(p: Provenance) -> list[tuple[str, str, str | bool | None]]:
    """(term, text, code) rows of the provenance list; code: None plain text, True in
    ``<code>``, a string in ``<code id=...>``."""
    rows: list[tuple[str, str, str | bool | None]] = [
        ("phasesweep", f"{p.version} (commit {p.commit})", None),
        ("report made by", p.command, True),
        ("generated", p.generated, None),
    ]
    if p.launch:
        argv = p.launch.get("argv")
        cmd = shlex.join(map(str, argv)) if isinstance(argv, (list, tuple)) else str(argv or "")
        when = " → ".join(
            str(p.launch[k]) for k in ("started_at", "finished_at") if p.launch.get(k)
        )
        made = ", ".join(f"{k} {p.launch[k]}" for k in ("version", "commit") if p.launch.get(k))
        rows.append(("launched by", cmd, "launch-argv"))
        if made:
            rows.append(("launched with", "phasesweep " + made, None))
        if when:
            rows.append(("launch time", when, None))
    rows.append(
        (
            "wall time",
            f"{duration(p.wall_seconds)} summed over chunks, "
            f"{duration(p.span_seconds)} from first start to last finish",
            None,
        )
    )
    rows.append(("devices", ", ".join(p.devices) or "unknown", None))
    rows.append(("nodes", ", ".join(p.nodes) if p.nodes else "no Ray node recorded (local)", None))
    return rows


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
    regime_note: str = "",
    fit_stats: pd.DataFrame | None = None,
    cfg: AnalysisConfig | None = None,
    gallery: str = "",
) -> str:
    """The report page (a complete HTML document) from its parts; empty tables are left out.

    ``regime_note``: why runs have no regime (shown under the regime counts); ``fit_stats``
    (``analysis._report._fits.fit_stats_sql``) and ``cfg``: why a fit has no slope;
    ``gallery``: the Gallery section, HTML escaped by its own template
    (``analysis._report._gallery_checks``; empty: none)."""
    cfg = cfg or AnalysisConfig()
    counts = [
        _Table(status_counts, "status-counts", ("status",), "By status"),
        _Table(regime_counts, "regime-counts", ("regime",), "By regime", regime_note),
        _Table(
            plateau_counts if plateau_counts is not None else pd.DataFrame(),
            "plateau-counts",
            (),
            "Plateaus per run",
        ),
    ]
    filters = ("" if not cfg.fit_require_plateau else ", that left a plateau") + (
        "" if cfg.fit_init_scale_max is None else f", with init_scale ≤ {cfg.fit_init_scale_max:g}"
    )
    header = spec_header(spec_text)
    return PAGE_ENV.from_string(TEMPLATE).render(
        sweep=sweep,
        css=_CSS,
        description=description,
        provenance=_provenance_rows(provenance) if provenance is not None else None,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        header=header,
        counts=[c for c in counts if c],
        figures=figures,
        fits=_Table(
            fits_display(fits, fit_stats, cfg),
            "slope-table",
            ("group", "fit", "CI", "theory", "note"),
            filters=filters,
            decades=f"{cfg.fit_min_decades:g}",
        ),
        boundaries=_Table(
            boundaries_display(boundaries) if boundaries is not None else pd.DataFrame(),
            "boundaries-table",
            ("line",),
        ),
        gallery=gallery,
        spec=spec_body(spec_text) if header else spec_text,
    )


def regime_counts(con, sweep: str, at_time: float | None) -> pd.DataFrame:
    """The sweep's runs counted by ``status``, ``regime`` ("(none)" for NULL) and ``cause``,
    in one pass over the runs (the view's window over all of them is the cost at scale);
    ``con``: an open catalog. ``cause``, NULL for a run with a regime, is the first of:
    ``failed`` (no trajectory), ``unanalyzed`` (no current summary), ``beyond_at_time``
    (its last finite loss comes before ``at_time``), ``not_finite`` (its loss or order
    parameter is not finite where the regime is read). With the columns that
    :meth:`analysis._analyze.Reach.of_counts` reads: ``short``, ``short_end``, ``first_end``."""
    reach_at = None if at_time is None else at_time * (1.0 - REACH_RTOL)
    return con.execute(
        "SELECT r.status, coalesce(s.regime, '(none)') AS regime, "
        "CASE WHEN s.regime IS NOT NULL THEN NULL "
        "WHEN r.status = 'failed' THEN 'failed' "
        "WHEN s.run_id IS NULL THEN 'unanalyzed' "
        "WHEN s.final_time < $reach::DOUBLE THEN 'beyond_at_time' "
        "ELSE 'not_finite' END AS cause, count(*) AS runs, "
        "count(*) FILTER (WHERE s.final_time < $reach::DOUBLE) AS short, "
        "max(s.final_time) FILTER (WHERE s.final_time < $reach::DOUBLE) AS short_end, "
        "min(s.final_time) AS first_end "
        "FROM runs r LEFT JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id "
        "WHERE r.sweep = $sweep GROUP BY ALL",
        {"reach": reach_at, "sweep": sweep},
    ).df()


def regime_note(counts: pd.DataFrame, sweep: str, at_time: float | None, store: str = "") -> str:
    """Why runs have no regime: a sentence per cause, with its count and what to do (empty
    when every run has one); ``counts``: :func:`regime_counts` of ``sweep``; ``store``: its
    URI, for the command that analyzes the runs without a summary."""
    none = counts[counts["regime"] == "(none)"].groupby("cause")["runs"].sum()
    reach = Reach.of_counts(counts[counts["cause"] != "unanalyzed"])  # of the summaries' ends
    analyze = shlex.join(["phasesweep", "analyze", sweep, *(["--store", store] if store else [])])
    why = {
        "unanalyzed": "not analyzed yet (no current summary: new, extended or retrained since "
        f"the last analysis): run {analyze}",
        "failed": "failed (no trajectory)",
        "beyond_at_time": f"beyond analysis.at_time: {reach.line(at_time)}",
        "not_finite": "with a loss or order parameter that is not finite where the regime is read",
    }
    told = [f"{_runs(n)} {why[c]}." for c in why if (n := int(none.get(c, 0)))]
    return " ".join([f"(none): {_runs(int(none.sum()))} have no regime.", *told]) if told else ""


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"
