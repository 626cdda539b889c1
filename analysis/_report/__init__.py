"""``phasesweep report``: one self-contained HTML page per sweep.

The page says what made it (phasesweep version, git commit of the code, command
line, the launch's own command line when the store records it), what the sweep
cost (wall time, devices, nodes), what it is (the spec's header comment and
description), the counts of runs by status, regime and plateaus (with why a run has
no regime), every figure of ``phasesweep plot``, the SQL behind the phase diagrams,
the fitted-slope table (with why a fit is missing), the gallery's checks of the sweep
(with their verdicts) and the spec. It is one file that can be mailed or archived alone:
every figure is embedded as a PNG ``data:`` URI, and its SVG too, as a download link; no
external resource, no script. Empty tables are left out.

:func:`report` reads the parts from the store; the page and its tables are
:mod:`._page`, the fitted slopes :mod:`._fits`, the gallery's checks :mod:`._gallery_checks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from phasesweep.analysis._report._fits import fit_stats_sql
from phasesweep.analysis._report._gallery_checks import gallery_rows, gallery_section
from phasesweep.analysis._report._page import (
    ReportFigure,
    provenance,
    regime_counts,
    regime_note,
    report_html,
)
from phasesweep.storage.schema import FIT_GROUP_COLUMNS

__all__ = ["report"]


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
        counts = regime_counts(con, sweep, ctx.cfg.at_time)
        status, regimes = (
            counts.groupby(key, as_index=False, dropna=False)["runs"]
            .sum()
            .sort_values(["runs", key], ascending=[False, True], ignore_index=True)
            for key in ("status", "regime")
        )
        plateau_counts = ctx.df(
            "SELECT n_plateaus AS plateaus, count(*) AS runs FROM summaries "
            "WHERE sweep = ? AND n_plateaus IS NOT NULL GROUP BY 1 ORDER BY 1"
        )
        fits = ctx.df("SELECT * FROM scaling_fits WHERE sweep = ?")
        fit_stats = None
        if len(fits) and fits["slope"].isna().any():
            keys = ["depth", *(c for c in FIT_GROUP_COLUMNS if c in fits and fits[c].notna().any())]
            fit_stats = con.execute(fit_stats_sql(sweep, ctx.cfg, keys)).df()
        refined = boundaries_frame(con, sweep)
        gallery = gallery_section(gallery_rows(con, sweep, out), sweep)
        prov = provenance(con, sweep, command, launch)
        spec, spec_text, cfg = ctx.spec, ctx.spec_text, ctx.cfg
    figs = [
        ReportFigure(
            r.name,
            next(p for p in r.paths if p.suffix == ".png").read_bytes(),
            r.caption,
            r.sql,
            next((p.read_bytes() for p in r.paths if p.suffix == ".svg"), None),
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
        regime_note=regime_note(counts, sweep, cfg.at_time, store.uri),
        fit_stats=fit_stats,
        cfg=cfg,
        gallery=gallery,
    )
    page = write_file(prepare_dir(out), "report.html", text.encode("utf-8"))
    if out_dir is None and store.local_path("figures") is None:
        upload(store, sweep, [page])
    return page
