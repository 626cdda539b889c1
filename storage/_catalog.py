"""DuckDB catalog over a store: one view per table, ``sweep`` as a column.

Views: ``runs``, ``trajectories``, ``layers`` (chunk tables), ``summaries``,
``plateaus``, ``scaling_fits``, ``boundaries`` (analysis tables) and ``manifest``. Each has the
``sweep`` column first, then (at least) the columns of ``storage.schema``;
columns that older files lack are NULL. ``attempt`` stays visible for debugging.

- ``runs`` holds one committed row per run. A run_id with several rows (a
  'failed' run trained again on relaunch, or a duplicate commit, which the
  writers avoid, see ``Store``) shows its earliest row that is not 'failed',
  else its earliest row; between equal rows the smallest ``attempt`` wins, and
  the ids compaction gives its merged rows sort before every other attempt id,
  the latest compaction's first (see ``maintenance.compact``).
- ``trajectories`` and ``layers`` hold only rows whose ``(sweep, run_id,
  attempt)`` is in ``runs``: rows of an attempt that died before its commit, or
  of a duplicate commit, are never seen.

The catalog is a snapshot: the file lists are taken when it is opened (``runs``
first, so every run it shows has all of its rows, then the others, then ``runs``
again: if that changed, a compaction removed files meanwhile and the lists are
taken anew); reopen it to see later chunks. Damaged files (``Store.readable_files``)
are left out of the lists and reported as ``DamagedFileWarning``s, so one bad file
costs its own rows, never the other files' or another sweep's.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from phasesweep.storage import schema
from phasesweep.storage._manifest import manifest_table
from phasesweep.storage._store import Store, as_store

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


#: DuckDB settings of a locked connection: no file, network or extension access by
#: DuckDB itself, no scans of Python variables, and no way to change any of that.
LOCKED = {
    "enable_external_access": False,
    "python_enable_replacements": False,
    "lock_configuration": True,
}

#: How often the file lists are taken anew when compactions keep changing them.
SNAPSHOT_TRIES = 5


def open_catalog(
    store_or_uri: Store | str | None = None, *, external_access: bool = False
) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the store's views (see the module docstring).

    Works on an empty or missing store (empty views with the schema's columns).

    By default the connection is locked (``LOCKED``): the views scan Arrow datasets
    registered from Python, and SQL on it (a spec's ``where`` filter included)
    cannot read or write any file, attach databases, install or load extensions,
    or unlock itself; it can still create in-memory tables. This is what analysis
    code gets. ``external_access=True`` (trusted maintenance code only) gives an
    unlocked connection whose views use DuckDB's own ``read_parquet`` (object
    stores through the store's fsspec file system, ``register_filesystem``).
    For untrusted statements use ``run_query``, which also checks the statement.
    """
    store = as_store(store_or_uri)
    if not external_access:
        con = duckdb.connect(config=LOCKED)
        create_views(con, store, via_arrow=True)
        return con
    con = duckdb.connect()
    if not store.is_local:
        con.register_filesystem(store.fs)
    create_views(con, store, via_arrow=False)
    return con


def snapshot(
    store: Store, sweep: str | None = None, tables: tuple[str, ...] = tuple(_TABLES)
) -> dict[str, list[str]]:
    """Readable files per table (``runs`` and ``tables``), of one sweep or of all, listed
    as the module docstring describes."""
    for _ in range(SNAPSHOT_TRIES):
        runs = store.readable_files("runs", sweep)
        lists = {"runs": runs, **{t: store.readable_files(t, sweep) for t in tables if t != "runs"}}
        if store.readable_files("runs", sweep) == runs:
            break
    return lists


def create_views(
    con: duckdb.DuckDBPyConnection,
    store: Store,
    *,
    via_arrow: bool,
    files: dict[str, list[str]] | None = None,
) -> None:
    """Create the catalog views on ``con``; they are the only names it lists (``SHOW TABLES``).

    ``via_arrow=False``: read Parquet with DuckDB's ``read_parquet`` (needs DuckDB
    file access). ``via_arrow=True``: scan ``pyarrow.dataset`` objects registered
    on the connection, which keeps working after DuckDB's own file access is
    switched off (locked connections, ``run_query``). ``files``: the files per
    table to read (a table left out reads as empty); default ``snapshot(store)``.
    The raw rows enter each view as a relation (``_raw`` inside its SQL), not as a
    named object, so no internal name shows up beside the views.
    """
    files = snapshot(store) if files is None else files
    for table, table_schema in _TABLES.items():
        target = table_schema.append(_SWEEP)
        paths = files.get(table, [])
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
            urls = ", ".join(sql_string(store.url(p)) for p in paths)
            # The empty typed table adds schema columns that older files lack, as NULL.
            raw = empty.query(
                "_empty",
                f"FROM read_parquet([{urls}], hive_partitioning = true, "
                f"union_by_name = true, hive_types = {{'sweep': VARCHAR}}) "
                f"UNION ALL BY NAME FROM _empty",
            )
        raw.query("_raw", _VIEWS[table]).create_view(table)
    con.from_arrow(manifest_table(store.manifest())).create_view("manifest")


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal (single quotes, inner ones doubled): the one
    quoting of values into the SQL that phasesweep writes (DuckDB's standard SQL)."""
    return "'" + text.replace("'", "''") + "'"
