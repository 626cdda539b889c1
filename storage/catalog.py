"""DuckDB catalog over a store: one view per table, ``sweep`` as a column.

Views: ``runs``, ``trajectories``, ``layers`` (chunk tables), ``summaries``,
``plateaus``, ``scaling_fits`` (analysis tables) and ``manifest``. Each has the
``sweep`` column first, then (at least) the columns of ``storage.schema``;
columns that older files lack are NULL. ``attempt`` stays visible for debugging.

- ``runs`` holds one committed row per run. A run_id with several rows (a
  'failed' run trained again on relaunch, or a duplicate commit, which the
  writers avoid, see ``Store``) shows its earliest row that is not 'failed',
  else its earliest row.
- ``trajectories`` and ``layers`` hold only rows whose ``(sweep, run_id,
  attempt)`` is in ``runs``: rows of an attempt that died before its commit, or
  of a duplicate commit, are never seen.

The catalog is a snapshot: the file lists are taken when it is opened (``runs``
first, so every run it shows has all of its rows); reopen it to see later chunks.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from phasesweep.storage import schema
from phasesweep.storage.manifest import manifest_table
from phasesweep.storage.store import Store, as_store

#: Parquet-backed tables, ``runs`` first (see the snapshot note above).
_TABLES = {
    "runs": schema.RUNS,
    "trajectories": schema.TRAJECTORIES,
    "layers": schema.LAYERS,
    **schema.ANALYSIS_TABLES,
}
_SWEEP = pa.field("sweep", pa.string())

#: The SQL of each view over ``_raw`` (the table's rows, ``sweep`` included), in order.
_VIEWS = {
    "runs": """
SELECT sweep, * EXCLUDE (sweep) FROM _raw
QUALIFY row_number() OVER (
    PARTITION BY sweep, run_id
    ORDER BY status IS NOT DISTINCT FROM 'failed', finished_at NULLS LAST, attempt
) = 1""",
    **{
        table: """
SELECT t.sweep, t.* EXCLUDE (sweep) FROM _raw AS t
SEMI JOIN runs AS r ON t.sweep = r.sweep AND t.run_id = r.run_id AND t.attempt = r.attempt"""
        for table in ("trajectories", "layers")
    },
    **{table: "SELECT sweep, * EXCLUDE (sweep) FROM _raw" for table in schema.ANALYSIS_TABLES},
}


def open_catalog(store_or_uri: Store | str | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the store's views (see the module docstring).

    Works on an empty or missing store (empty views with the schema's columns).
    Local stores are read by DuckDB's own Parquet reader, object stores through
    the store's fsspec file system (``register_filesystem``; no httpfs needed).
    The connection is the caller's: it can create tables, write files, etc.;
    for untrusted SQL use ``run_query``.
    """
    store = as_store(store_or_uri)
    con = duckdb.connect()
    if not store.is_local:
        con.register_filesystem(store.fs)
    create_views(con, store, via_arrow=False)
    return con


def create_views(con: duckdb.DuckDBPyConnection, store: Store, *, via_arrow: bool) -> None:
    """Create the catalog views on ``con``; they are the only names it lists (``SHOW TABLES``).

    ``via_arrow=False``: read Parquet with DuckDB's ``read_parquet`` (fast; needs
    DuckDB file access). ``via_arrow=True``: scan ``pyarrow.dataset`` objects,
    which keeps working after DuckDB's own file access is switched off
    (``run_query``). The raw rows enter each view as a relation (``_raw`` inside its
    SQL), not as a named object, so no internal name shows up beside the views.
    """
    for table, table_schema in _TABLES.items():
        target = table_schema.append(_SWEEP)
        paths = store.files(table)
        empty = con.from_arrow(target.empty_table())
        if not paths:
            raw = empty
        elif via_arrow:
            raw = con.from_arrow(
                ds.dataset(
                    paths,
                    schema=target,
                    format="parquet",
                    filesystem=store.arrow_fs,
                    partitioning=ds.HivePartitioning(pa.schema([_SWEEP])),
                    partition_base_dir=store.table_dir(table),
                )
            )
        else:
            urls = ", ".join(_sql_string(store.url(p)) for p in paths)
            # The empty typed table adds schema columns that older files lack, as NULL.
            raw = empty.query(
                "_empty",
                f"FROM read_parquet([{urls}], hive_partitioning = true, "
                f"union_by_name = true, hive_types = {{'sweep': VARCHAR}}) "
                f"UNION ALL BY NAME FROM _empty",
            )
        raw.query("_raw", _VIEWS[table]).create_view(table)
    con.from_arrow(manifest_table(store.manifest())).create_view("manifest")


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
