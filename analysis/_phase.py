"""Phase diagrams as one SQL query over the catalog views ``runs`` and ``summaries``.

:func:`phase_diagram_sql` returns the exact query the heatmap draws, so it can be
quoted (README) and run by hand: ``phasesweep query "$(python -c ...)"``.
"""

from __future__ import annotations

from phasesweep.storage import sql_condition
from phasesweep.storage._catalog import sql_string
from phasesweep.storage.schema import COLUMNS

#: The ``summaries`` columns a phase diagram can show (``Column.phase``).
_VALUE_COLUMNS = [c for c in COLUMNS["summaries"] if c.phase]
#: Phase-diagram values: name -> column of ``summaries`` (final values per run); a final
#: value is named as the ``trajectories`` column it is the final value of.
VALUES: dict[str, str] = {c.final_of or c.name: c.name for c in _VALUE_COLUMNS}
#: Values that are 0 for a run that did not move: their linear colour scale starts at 0.
FROM_ZERO: frozenset[str] = frozenset(c.final_of or c.name for c in _VALUE_COLUMNS if c.from_zero)

#: ``runs`` columns that can be axes (or facets) of a phase diagram.
AXES = (
    "init_scale",
    "width",
    "depth",
    "noise_sigma",
    "lr",
    "seed",
    "activation",
    "n_train",
    "leaky_slope",
    "input_dim",
    "parameterization",
    "data_kind",
)


def phase_diagram_sql(
    sweep: str,
    x: str = "init_scale",
    y: str = "width",
    value: str = "kernel_distance",
    *,
    facet: str | None = None,
    where: str | None = None,
) -> str:
    """The single query behind a phase diagram: one row per (facet,) x, y cell.

    Columns: ``x``, ``y`` (and ``facet``), ``value`` = mean over the cell's completed
    runs (its seeds) of the final ``value``, ``value_sd``, ``n_runs``,
    ``n_completed``, ``n_diverged``, ``n_failed``, ``n_seeds``, ``n_analyzed`` (runs with
    a current summary: a cell with fewer than ``n_runs`` is "not analyzed", its value is
    NULL rather than the mean of some seeds) and ``regime`` (the most common regime of the
    cell). Diverged runs are counted, never averaged.
    ``where``: an extra SQL condition on the ``runs`` columns (e.g. ``seed = 0``).
    """
    for name in (x, y, facet):
        if name is not None and name not in AXES:
            raise ValueError(f"unknown phase-diagram axis {name!r}; known: {list(AXES)}")
    if value not in VALUES:
        raise ValueError(f"unknown phase-diagram value {value!r}; known: {list(VALUES)}")
    col = VALUES[value]
    keys = ([f"r.{facet} AS facet"] if facet else []) + [f"r.{x} AS x", f"r.{y} AS y"]
    group = (["facet"] if facet else []) + ["x", "y"]
    cond = f"r.sweep = {sql_string(sweep)}"
    if where:
        sql_condition(where)
        cond += (
            f"\n  AND r.run_id IN (SELECT run_id FROM runs WHERE sweep = {sql_string(sweep)}"
            f" AND ({where}))"
        )
    return (
        "SELECT " + ", ".join(keys) + ",\n"
        "       CASE WHEN count(s.run_id) = count(*) THEN\n"
        f"       avg(s.{col}) FILTER (WHERE r.status = 'completed') END AS value,\n"
        "       CASE WHEN count(s.run_id) = count(*) THEN\n"
        f"       stddev_samp(s.{col}) FILTER (WHERE r.status = 'completed') END AS value_sd,\n"
        "       count(*) AS n_runs,\n"
        "       count(*) FILTER (WHERE r.status = 'completed') AS n_completed,\n"
        "       count(*) FILTER (WHERE r.status = 'diverged') AS n_diverged,\n"
        "       count(*) FILTER (WHERE r.status = 'failed') AS n_failed,\n"
        "       count(DISTINCT r.seed) AS n_seeds,\n"
        "       count(s.run_id) AS n_analyzed,\n"
        "       mode(s.regime) AS regime\n"
        "FROM runs AS r\n"
        "LEFT JOIN summaries AS s ON s.sweep = r.sweep AND s.run_id = r.run_id\n"
        f"WHERE {cond}\n"
        f"GROUP BY {', '.join(group)}\n"
        f"ORDER BY {', '.join(group)}"
    )
