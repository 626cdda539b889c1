"""The report's Gallery section: the checks ``phasesweep gallery`` stored for the sweep
(``gallery_checks``), one row per check of a result: the measured value with its interval,
the paper's value with the tolerance, the verdict and a link to the figure.

A check is a verdict on the runs it read. Where the sweep's runs changed since (new,
extended or retrained runs: their count or latest ``finished_at`` no longer matches the
row's stamp), the verdict is STALE instead of PASS or FAIL, with the command that checks
the runs as they are. A check that read a sweep with grid points not done (failed after
retries, or not yet trained) is INCOMPLETE, whatever it found of the rest, with the command
that trains them and checks again.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from urllib.parse import quote

from phasesweep.analysis._report._page import PAGE_ENV

#: The sweep's checks, each with whether its stamp matches the sweep's runs now and whether
#: it read part of the grid (NULL: checked before that was counted).
GALLERY_SQL = """
SELECT g.*, (g.source_runs = now.runs
             AND g.source_finished_at IS NOT DISTINCT FROM now.finished_at) AS current,
       coalesce(g.source_missing_points, 0) > 0 AS incomplete
FROM gallery_checks AS g,
     (SELECT count(*) AS runs, max(finished_at) AS finished_at FROM runs
      WHERE sweep = $sweep) AS now
WHERE g.sweep = $sweep
ORDER BY g.result, g.label
"""

_SECTION = """\
<h2>Gallery</h2>
<p>The checks of <code>phasesweep gallery</code> on this sweep: {{ passed }} of
{{ rows | length }} pass{% if incomplete %}; {{ incomplete }} are incomplete (they read a
sweep with grid points not done: failed after retries, or not yet trained){% endif %}
{%- if stale %}; {{ stale }} are stale (the sweep's runs changed since they ran){% endif %}
{%- if command %}: <code>{{ command }}</code> trains what is missing and checks again{% endif %}.
A check passes when
the 95 % interval of the measured value comes within the tolerance of the paper's value
(for a bound: when its low end is at most the bound plus the tolerance).</p>
<table id="gallery-checks"><thead><tr><th class="l">result</th><th class="l">check</th>
<th>measured [interval]</th><th>expected</th><th class="l">tolerance from</th>
<th class="l">verdict</th><th class="l">figure</th></tr></thead><tbody>
{%- for r in rows %}
<tr><td class="l" title="{{ r.paper }}">{{ r.result }}</td><td class="l">{{ r.label }}</td>
<td>{{ r.measured }}</td><td>{{ r.expected }}</td><td class="l">{{ r.why }}</td>
<td class="l {{ r.verdict | lower }}">{{ r.verdict }}</td><td class="l">
{%- if r.href %}<a href="{{ r.href }}">{{ r.figure }}</a>{% else %}{{ r.figure }}{% endif %}</td></tr>
{%- endfor %}
</tbody></table>
"""


def gallery_rows(con, sweep: str, page_dir: Path | str) -> list[dict]:
    """The sweep's ``gallery_checks`` as the section shows them, one dict per check:
    ``result``, ``paper``, ``label``, ``measured`` ("0.98 [0.95, 1.01] (95 %, n = 30)"),
    ``expected`` ("1 ± 0.05", or "≤ 1 + 0.05" for a bound), ``why`` (where the tolerance
    comes from), ``verdict`` (PASS, FAIL, INCOMPLETE or STALE), ``figure`` (its file name,
    or why there is none) and ``href`` (the figure relative to ``page_dir``, the report's
    folder; None when it is not a file there). ``con``: an open catalog."""
    frame = con.execute(GALLERY_SQL, {"sweep": sweep}).df()
    rows = []
    for r in frame.to_dict("records"):
        relation = "{e:g} ± {t:g}" if r["bound"] == "equal" else "≤ {e:g} + {t:g}"
        figure, href = _figure_link(r["figure"], Path(page_dir))
        rows.append(
            {
                "result": r["result"],
                "paper": r["paper"],
                "label": r["label"],
                "measured": f"{r['estimate']:.3g} [{r['ci_low']:.3g}, {r['ci_high']:.3g}] "
                f"({r['confidence'] * 100:g} %, n = {r['n_points']})",
                "expected": relation.format(e=r["expected"], t=r["tolerance"]),
                "why": r["why_tolerance"],
                "verdict": _verdict(r),
                "figure": figure,
                "href": href,
            }
        )
    return rows


def _verdict(row: dict) -> str:
    """STALE where the sweep's runs changed since the check, else INCOMPLETE where it read
    part of the grid, else PASS or FAIL."""
    if not row["current"]:
        return "STALE"
    if row["incomplete"]:
        return "INCOMPLETE"
    return "PASS" if row["passed"] else "FAIL"


def _figure_link(path: str | None, page_dir: Path) -> tuple[str, str | None]:
    """(text, href) of a check's figure: its file name and its path relative to the page
    (a URL path), or why there is no link."""
    if path is None or path != path:
        return "not drawn", None
    if not Path(path).is_file():
        return f"{Path(path).name} (not found)", None
    relative = os.path.relpath(path, page_dir.resolve())
    return Path(path).name, quote(Path(relative).as_posix())


def gallery_section(rows: list[dict], sweep: str) -> str:
    """The section's HTML (escaped by its template) for :func:`gallery_rows` of ``sweep``;
    "" for none. The command that checks stale and incomplete results again asks for
    ``--full`` where ``sweep`` is their ``--full`` sweep (``gallery_NAME_full``, the
    gallery's name for it)."""
    if not rows:
        return ""
    again = sorted({r["result"] for r in rows if r["verdict"] in ("STALE", "INCOMPLETE")})
    full = ["--full"] if again and all(sweep == f"gallery_{n}_full" for n in again) else []
    return PAGE_ENV.from_string(_SECTION).render(
        rows=rows,
        passed=sum(r["verdict"] == "PASS" for r in rows),
        incomplete=sum(r["verdict"] == "INCOMPLETE" for r in rows),
        stale=sum(r["verdict"] == "STALE" for r in rows),
        command=shlex.join(["phasesweep", "gallery", *again, *full]) if again else "",
    )
