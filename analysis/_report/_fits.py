"""The report's table of fitted escape-time slopes (``scaling_fits``), and why a fit group
has no slope: which step of the fit's filter its runs missed (counted in SQL)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from phasesweep.analysis._style import fmt
from phasesweep.analysis.config import AnalysisConfig
from phasesweep.storage._catalog import sql_string
from phasesweep.storage.schema import FIT_GROUP_COLUMNS

#: The fits' x columns as the report names them.
_FIT_X = {
    "log_init_scale": "log α",
    "log_inv_init_scale": "log(1/α)",
    "log_log_inv_init_scale": "log log(1/α)",
}


def fit_stats_sql(sweep: str, cfg: AnalysisConfig, keys: Sequence[str]) -> str:
    """One row per fit group (``keys``: depth and the fit's group axes): how many of its
    completed runs pass each step of the fit's filter (:func:`analysis._analyze.fit_mask`,
    in that order), and the widest span in decades of the passing runs' init scales per
    seed (``decades``; ``decades_below_1``: of those below 1, what the log-log fit uses).
    Aggregated in SQL: bounded memory for any number of runs."""
    cols = ", ".join(f"r.{k}" for k in keys)
    group = ", ".join(keys)
    regimes = ", ".join(sql_string(r) for r in cfg.fit_regimes) or "NULL"
    plateau = "coalesce(s.n_plateaus, 0) >= 1" if cfg.fit_require_plateau else "true"
    top = (
        "true" if cfg.fit_init_scale_max is None else f"r.init_scale <= {cfg.fit_init_scale_max!r}"
    )
    on = " AND ".join(f"c.{k} IS NOT DISTINCT FROM d.{k}" for k in keys)
    return f"""
WITH p AS (
  SELECT {cols}, r.seed, r.init_scale,
         s.escape_time IS NOT NULL AS escaped,
         coalesce(s.regime IN ({regimes}), false) AS in_regimes,
         {plateau} AS plateau,
         {top} AS in_range
  FROM runs r JOIN summaries s ON s.sweep = r.sweep AND s.run_id = r.run_id
  WHERE r.sweep = {sql_string(sweep)} AND r.status = 'completed'
),
c AS (
  SELECT {group}, count(*) AS completed,
         count(*) FILTER (WHERE escaped) AS escaped,
         count(*) FILTER (WHERE escaped AND in_regimes) AS in_regimes,
         count(*) FILTER (WHERE escaped AND in_regimes AND plateau) AS plateau,
         count(*) FILTER (WHERE escaped AND in_regimes AND plateau AND in_range) AS passing
  FROM p GROUP BY {group}
),
d AS (
  SELECT {group}, max(decades) AS decades, max(decades_below_1) AS decades_below_1 FROM (
    SELECT {group}, seed, log10(max(init_scale) / min(init_scale)) AS decades,
           log10(max(init_scale) FILTER (WHERE init_scale < 1)
                 / min(init_scale) FILTER (WHERE init_scale < 1)) AS decades_below_1
    FROM p WHERE escaped AND in_regimes AND plateau AND in_range AND init_scale > 0
    GROUP BY {group}, seed
  ) GROUP BY {group}
)
SELECT c.*, d.decades, d.decades_below_1 FROM c LEFT JOIN d ON {on}
"""


def fit_reason(x: str, stats: dict | None, cfg: AnalysisConfig) -> str:
    """Why a fit group has no slope, from its :func:`fit_stats_sql` row (None: unknown)."""
    if stats is None or not stats.get("completed"):
        return "no completed run in this group"
    steps = [  # the count of runs that pass each step, and what the step asks of a run
        ("escaped", f"escaped (loss fell by analysis.escape_min_drop = {cfg.escape_min_drop:g})"),
        ("in_regimes", f"is in analysis.fit_regimes ({', '.join(cfg.fit_regimes)})"),
        ("plateau", "left a plateau (analysis.fit_require_plateau)"),
        ("passing", f"has init_scale ≤ analysis.fit_init_scale_max = {cfg.fit_init_scale_max}"),
    ]
    nouns = ["completed runs", "runs that escaped", "remaining runs", "remaining runs"]
    have = stats["completed"]
    for (key, what), noun in zip(steps, nouns):
        if not stats[key]:
            return f"none of the {have} {noun} {what}"
        have = stats[key]
    span = stats["decades_below_1" if x == "log_log_inv_init_scale" else "decades"]
    below = " below α = 1" if x == "log_log_inv_init_scale" else ""
    if span is None or span != span or span <= 0:
        return f"{have} runs pass, but no seed has them at two init scales{below}"
    if span < cfg.fit_min_decades - 1e-9:
        return (
            f"{have} runs pass, but no seed's init scales{below} span analysis.fit_min_decades"
            f" = {cfg.fit_min_decades:g} decades (the widest: {span:.2g})"
        )
    return "too few points per seed"


def fits_display(
    fits: pd.DataFrame, stats: pd.DataFrame | None = None, cfg: AnalysisConfig | None = None
) -> pd.DataFrame:
    """The scaling_fits rows as the report shows them; ``stats`` (:func:`fit_stats_sql`
    rows) say why a row has no slope."""
    cfg = cfg or AnalysisConfig()
    columns = ["depth", "group", "fit", "slope", "CI", "theory slope", "theory", "points"]
    columns += ["seeds", "note"]
    if fits.empty:
        return pd.DataFrame(columns=columns)
    keys = ["depth", *(c for c in FIT_GROUP_COLUMNS if c in fits and fits[c].notna().any())]
    by_group = {}
    if stats is not None:
        for rec in stats.to_dict("records"):
            by_group[tuple(_key(rec[k]) for k in keys)] = rec
    rows = []
    for f in fits.sort_values(["depth", "x"]).to_dict("records"):
        group = ", ".join(
            f"{c} {fmt(f[c])}" for c in FIT_GROUP_COLUMNS if c in f and not _missing(f[c])
        )
        y = "log t" if f["y"] == "log_escape_time" else "t"
        ci = (
            f"[{f['ci_low']:.3g}, {f['ci_high']:.3g}] ({f['confidence']:.0%}, {f['ci_method']})"
            if not _missing(f["ci_low"])
            else ""
        )
        fitted = not _missing(f["slope"])
        stat = by_group.get(tuple(_key(f.get(k)) for k in keys))
        rows.append(
            {
                "depth": int(f["depth"]),
                "group": group,
                "fit": f"{y} vs {_FIT_X.get(f['x'], f['x'])}",
                "slope": float(f["slope"]) if fitted else None,
                "CI": ci,
                "theory slope": None if _missing(f["theory_slope"]) else float(f["theory_slope"]),
                "theory": f["theory"],
                "points": int(f["n_points"]),
                "seeds": int(f["n_seeds"]),
                "note": "" if fitted else "no fit: " + fit_reason(f["x"], stat, cfg),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA


def _key(v: Any) -> Any:
    """A group key value comparable between the fits and the stats frames."""
    if _missing(v):
        return None
    return float(v) if isinstance(v, int | float | np.number) else v
