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
- ``summaries`` holds only current rows: those whose ``source_finished_at`` is their
  run's ``finished_at`` in ``runs`` (a run trained again since, or no longer stored,
  has no summary until it is analyzed again: :data:`UNANALYZED_SQL`); ``plateaus`` the
  rows of the runs with a current summary.

:func:`run_batches` reads a sweep's runs and their trajectories as these views show
them, a batch of runs at a time, for work too large to read whole (``analyze``).

The catalog is a snapshot: the file lists are taken when it is opened (``runs``
first, so every run it shows has all of its rows, then the others, then ``runs``
again: if that changed, a compaction removed files meanwhile and the lists are
taken anew); reopen it to see later chunks. Damaged files (``Store.readable_files``)
are left out of the lists and reported as ``DamagedFileWarning``s, so one bad file
costs its own rows, never the other files' or another sweep's.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
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
#: ``trajectories`` and ``layers`` join ``runs`` (one row per sweep and run_id: the join
#: keeps each row at most once, as a semi join would) by an inner join, through which
#: DuckDB carries a filter on ``sweep`` to both scans: a query of one sweep then plans no
#: read of another sweep's ``runs`` files (``storage._query.damage_read``).
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
JOIN (SELECT sweep, run_id, attempt FROM runs) AS r
ON t.sweep = r.sweep AND t.run_id = r.run_id AND t.attempt = r.attempt"""
        for table in ("trajectories", "layers")
    },
    # a summary is shown while it is current: its run's runs row is the one it was computed
    # from (the analysis follows the store). Its finished_at says so (compaction keeps it,
    # a new commit of the run has a new one); a row without one (a synthetic store) is
    # matched by its attempt. A row written before the source was recorded is not current.
    "summaries": """
SELECT s.sweep, s.* EXCLUDE (sweep) FROM _raw AS s
SEMI JOIN runs AS r
    ON s.sweep = r.sweep AND s.run_id = r.run_id AND s.source_attempt IS NOT NULL
    AND s.source_finished_at IS NOT DISTINCT FROM r.finished_at
    AND (r.finished_at IS NOT NULL OR s.source_attempt = r.attempt)""",
    "plateaus": """
SELECT p.sweep, p.* EXCLUDE (sweep) FROM _raw AS p
SEMI JOIN summaries AS s ON p.sweep = s.sweep AND p.run_id = s.run_id""",
    **{
        table: "SELECT sweep, * EXCLUDE (sweep) FROM _raw"
        for table in schema.ANALYSIS_TABLES
        if table not in ("summaries", "plateaus")
    },
}


#: DuckDB's memory on a catalog connection: with Python, Arrow and the result, a query of
#: a 10⁶-run store stays within ~2 GiB (``SELECT * FROM runs LIMIT 5`` took 1.8 GB without:
#: the runs view's window carries every column).
MEMORY_LIMIT = "1GiB"


@functools.cache
def spill_directory() -> str:
    """A folder of this process (mode 0700, removed at exit) for DuckDB's spilled data."""
    path = tempfile.mkdtemp(prefix="phasesweep-duckdb-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def locked_connection(paths: Sequence[str] = ()) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection whose SQL can read the local files ``paths`` and no
    other file.

    DuckDB's own file, network and extension access is off (``enable_external_access``)
    except for reading exactly ``paths`` (``allowed_paths``: no directory, no glob, no
    temporary file beside them); scans of Python variables are off; and nothing can
    change that (``lock_configuration``). In-memory tables may still be created.

    Its memory is bounded (:data:`MEMORY_LIMIT`); sorts, joins and windows that need more
    spill to a private temporary folder of this process (:func:`spill_directory`).

    DuckDB has no read-only permission for a file: a ``COPY ... TO`` or ``ATTACH``
    *statement* naming one of ``paths`` could write over it. So SQL from outside never
    reaches such a connection unchecked: ``run_query`` takes one read-only statement
    only, and the conditions a spec carries pass :func:`sql_condition`, which refuses
    anything that could end the statement they go into.
    """
    con = duckdb.connect(config={"python_enable_replacements": False})
    # bounded memory: what a query's sorts, joins and windows need beyond it spills
    con.execute("SET memory_limit = ?", [MEMORY_LIMIT])
    con.execute("SET temp_directory = ?", [spill_directory()])
    # allowed_paths can only be set once the database is started, and before the lock
    con.execute("SET allowed_paths = ?", [list(paths)])
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


#: Most files of one table that DuckDB's Parquet reader takes on a locked connection;
#: a table with more is scanned through ``pyarrow.dataset``. The reader binds a view by
#: reading every file's footer first (``union_by_name``: older files may lack newer
#: columns), about 0.7 ms a file: 4.5 s to open 6,000 small files, where the Arrow scan
#: binds nothing (0.3 s) and queries them about as fast. ``phasesweep compact`` merges
#: a sweep's files into a few.
READER_MAX_FILES = 256


def catalog_connection(store: Store, files: dict[str, list[str]]) -> duckdb.DuckDBPyConnection:
    """A :func:`locked_connection` with the catalog views over ``files`` (per table).

    A local store's tables of at most :data:`READER_MAX_FILES` files are read by DuckDB's
    own ``read_parquet`` (their files are the only ones the connection may read); other
    tables, and an object store's, through ``pyarrow.dataset`` (DuckDB reaches no object
    store while locked). The Parquet reader answers a phase-diagram query 5-7× faster:
    it pushes the joins' filters into the scan (0.22 s against 1.47 s at 10 M rows).
    """
    by_duckdb = {
        t for t, paths in files.items() if store.backend.local and len(paths) <= READER_MAX_FILES
    }
    con = locked_connection([p for t in by_duckdb for p in files[t]])
    try:
        create_views(con, store, by_duckdb=by_duckdb, files=files)
    except BaseException:
        con.close()
        raise
    return con


#: How often the file lists are taken anew when compactions keep changing them.
SNAPSHOT_TRIES = 5


def open_catalog(
    store_or_uri: Store | str | None = None, *, external_access: bool = False
) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection with the store's views (see the module docstring).

    Works on an empty or missing store (empty views with the schema's columns).

    By default the connection is locked (:func:`catalog_connection`): SQL on it can read
    the snapshot's files and no other file, reach no network, install or load no
    extension and not unlock itself; it can still create in-memory tables. This is what
    analysis code gets. Give it no statement from outside: those go through
    ``run_query``, which checks them, and conditions through :func:`sql_condition`.
    ``external_access=True`` (trusted maintenance code only) gives an unlocked
    connection (object stores through the store's fsspec file system,
    ``register_filesystem``).
    """
    store = as_store(store_or_uri)
    if not external_access:
        return catalog_connection(store, snapshot(store))
    con = duckdb.connect()
    if not store.backend.local:
        con.register_filesystem(store.fs)
    create_views(con, store, by_duckdb=_TABLES)
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
    by_duckdb: Collection[str],
    files: dict[str, list[str]] | None = None,
) -> None:
    """Create the catalog views on ``con``; they are the only names it lists (``SHOW TABLES``).

    Tables in ``by_duckdb`` are read with DuckDB's ``read_parquet`` (which needs DuckDB
    access to their files: unlocked, or a :func:`locked_connection` allowed them); the
    others are scanned as ``pyarrow.dataset`` objects, which works with DuckDB's own
    file access off. ``files``: the files per table to read (a table left out reads as
    empty); default ``snapshot(store)``.
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
        elif table not in by_duckdb:
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


#: The store tables whose files each view reads beyond its own: the rows of
#: ``trajectories`` and ``layers`` that it shows are those of the runs in ``runs``.
_READS = {
    "trajectories": ("runs",),
    "layers": ("runs",),
    "summaries": ("runs",),
    "plateaus": ("summaries", "runs"),
}


def tables_read(sql: str) -> set[str]:
    """The store tables (``runs``, …, ``manifest``) whose files ``sql`` reads through the
    views it names (from DuckDB's parser; nothing is bound or run). A damaged file of
    any other table cannot change its answer."""
    try:
        with duckdb.connect() as con:
            names = {n.lower() for n in con.get_table_names(sql)}
    except duckdb.Error:  # its binder refuses some queries it could read (a USING join)
        names = {_token(sql, start).lower() for start, kind in duckdb.tokenize(sql)}
    views = names & {*_TABLES, "manifest"}
    return views.union(*(_READS.get(v, ()) for v in views))


def _token(sql: str, start: int) -> str:
    """The word of ``sql`` that starts at ``start`` (a token's offset)."""
    end = start
    while end < len(sql) and (sql[end].isalnum() or sql[end] == "_"):
        end += 1
    return sql[start:end]


def sql_string(text: str) -> str:
    """``text`` as an SQL string literal (single quotes, inner ones doubled): the one
    quoting of values into the SQL that phasesweep writes (DuckDB's standard SQL)."""
    return "'" + text.replace("'", "''") + "'"


#: A ``summaries`` row ``s`` of the ``runs`` row ``r`` (the view shows only current ones).
_SUMMARY_OF_RUN = "s.sweep = r.sweep AND s.run_id = r.run_id"
#: A ``runs`` row ``r`` without a current summary, as a condition on ``r``.
UNANALYZED = f"NOT EXISTS (SELECT 1 FROM summaries AS s WHERE {_SUMMARY_OF_RUN})"
#: The runs of the sweep ``$sweep`` without a current summary (new points, points trained
#: again after a repair, an extended grid, a sweep never analyzed), on a catalog connection.
#: An anti join, not :data:`UNANALYZED`: with the sweep's filter beside it DuckDB plans that
#: correlated subquery 4-5x slower (10⁶ runs: 10.5 against 2.0 s; both evaluate the views'
#: joins and the ``runs`` window twice).
UNANALYZED_SQL = (
    f"SELECT r.* FROM runs AS r ANTI JOIN summaries AS s ON {_SUMMARY_OF_RUN} "
    "WHERE r.sweep = $sweep"
)


def run_batches(
    store: Store | str | None,
    sweep: str,
    run_columns: Sequence[str],
    trajectory_columns: Sequence[str],
    batch_runs: int,
) -> Iterator[tuple[pa.Table, pa.Table]]:
    """``(runs, trajectories)`` of ``sweep``, at most ``batch_runs`` runs at a time: the rows
    the ``runs`` view shows (``run_id``, ``attempt`` and ``run_columns``) and, of those runs,
    the rows the ``trajectories`` view shows (``run_id`` and ``trajectory_columns``, in no
    particular order). Every run is in exactly one batch; the batches follow
    ``(attempt, run_id)``.

    Memory holds the ``runs`` rows asked for and one batch of trajectories, whatever the
    sweep's size: each batch reads only the files that may hold its runs' attempts (by
    their footers' statistics: one file per chunk attempt, a range of runs of a compacted
    one), and of those only the row groups that may hold its runs. The files are one
    snapshot (:func:`snapshot`); a compaction that removes them meanwhile makes the read
    fail (run it again). :func:`run_batch_reads` gives the same batches with their
    trajectories still to read.
    """
    for runs, read in run_batch_reads(store, sweep, run_columns, trajectory_columns, batch_runs):
        yield runs, read()


def run_batch_reads(
    store: Store | str | None,
    sweep: str,
    run_columns: Sequence[str],
    trajectory_columns: Sequence[str],
    batch_runs: int,
    *,
    unanalyzed: bool = False,
) -> Iterator[tuple[pa.Table, ChunkRead]]:
    """The batches of :func:`run_batches`, each with a :class:`ChunkRead` of its
    trajectories instead of the rows: ``analyze`` hands it to the worker process that
    analyzes the batch, which reads them itself (so they never pass through a pipe).
    ``unanalyzed``: only the runs without a current summary (:data:`UNANALYZED_SQL`)."""
    store = as_store(store)
    if batch_runs < 1:
        raise ValueError(f"batch_runs must be at least 1, got {batch_runs}")
    files = snapshot(
        store, sweep, ("trajectories", "summaries") if unanalyzed else ("trajectories",)
    )
    con = catalog_connection(store, {t: files[t] for t in ("runs", "summaries") if t in files})
    try:
        columns = ", ".join(f'"{c}"' for c in dict.fromkeys(["run_id", "attempt", *run_columns]))
        source = UNANALYZED_SQL if unanalyzed else "SELECT * FROM runs WHERE sweep = $sweep"
        runs = con.sql(
            f"SELECT {columns} FROM ({source}) ORDER BY attempt, run_id", params={"sweep": sweep}
        ).to_arrow_table()
    finally:
        con.close()
    index = ChunkFiles(store, "trajectories", files["trajectories"])
    wanted = ["run_id", *trajectory_columns]
    for start in range(0, runs.num_rows, batch_runs):
        # buffers of its own (take copies): a slice would hold (and pickle) the whole sweep's
        # strings. Taken from the slice: a take from the whole table costs time linear in
        # its rows (~25 ms a batch at 10⁶ runs, 12 s in all), from the slice in the batch's.
        part = runs.slice(start, batch_runs)
        batch = part.take(pa.array(range(part.num_rows)))
        yield batch, index.read(batch.select(["run_id", "attempt"]), wanted)


@dataclass(frozen=True)
class _FileRange:
    """One Parquet file, its number of row groups and the (min, max) of its ``attempt`` and
    ``run_id`` (None: unknown, see :func:`_min_max`)."""

    path: str
    row_groups: int
    attempt: tuple[str, str] | None
    run_id: tuple[str, str] | None


@dataclass(frozen=True)
class _AttemptRows:
    """The runs ``run_ids`` of one attempt, and the files that may hold their rows."""

    attempt: str
    run_ids: list[str]
    files: list[_FileRange]


@dataclass(frozen=True)
class ChunkRead:
    """The rows of given runs in a chunk table (``ChunkFiles.read``), read when called:
    ``columns``, in no particular order. Small and picklable (the file list and run ids),
    so another process can read them."""

    store: Store
    schema: pa.Schema
    columns: list[str]
    parts: list[_AttemptRows]

    def __call__(self) -> pa.Table:
        parts = [self.schema.empty_table().select(self.columns)]
        for part in self.parts:
            parts += [self._rows(part, f) for f in part.files]
        return pa.concat_tables(parts)

    def _rows(self, part: _AttemptRows, file: _FileRange) -> pa.Table:
        """The rows of ``part``'s runs in ``file``. A file of several row groups is scanned
        with a filter, which skips those whose statistics rule the runs out; a file of one
        is read whole (it was chosen for its range: nothing could be skipped) and its rows
        picked afterwards, as the scanner's filter costs more than the read (16 ms against
        8 for a file of 40,000 rows)."""
        dataset = ds.dataset(
            [file.path], schema=self.schema, format="parquet", filesystem=self.store.arrow_fs
        )
        if file.row_groups > 1:
            run_id = ds.field("run_id")
            return dataset.to_table(
                columns=self.columns,
                filter=(ds.field("attempt") == part.attempt)
                & (run_id >= min(part.run_ids))
                & (run_id <= max(part.run_ids))
                & run_id.isin(part.run_ids),
            )
        alone = file.attempt == (part.attempt, part.attempt)  # every row of this attempt
        rows = dataset.to_table(columns=self.columns if alone else [*self.columns, "attempt"])
        keep = pc.is_in(rows["run_id"], value_set=pa.array(part.run_ids, pa.string()))
        if not alone:
            keep = pc.and_(keep, pc.equal(rows["attempt"], part.attempt))
        if pc.all(keep).as_py():
            return rows.select(self.columns)
        return rows.filter(keep).select(self.columns)


class ChunkFiles:
    """The files of a chunk table (``trajectories``, ``layers``), found by the attempts and
    runs they may hold, from their footers' statistics: a launch writes one file per chunk
    attempt, a compaction files of one attempt each holding a range of run ids. Reads the
    rows of given runs without scanning the table (:meth:`rows`)."""

    #: footers read at once from an object store
    THREADS = 16

    def __init__(self, store: Store, table: str, paths: Sequence[str]):
        self.store = store
        self.schema = schema.CHUNK_TABLES[table]
        workers = 1 if store.backend.local else self.THREADS
        with ThreadPoolExecutor(workers) as pool:
            ranges = [f for f in pool.map(self._range, paths) if f is not None]
        self.by_attempt: dict[str, list[_FileRange]] = {}
        self.mixed: list[_FileRange] = []  # files of several (or unknown) attempts
        for f in ranges:
            if f.attempt is not None and f.attempt[0] == f.attempt[1]:
                self.by_attempt.setdefault(f.attempt[0], []).append(f)
            else:
                self.mixed.append(f)

    def _range(self, path: str) -> _FileRange | None:
        """The file's ranges; None for a file without rows."""
        meta = pq.read_metadata(path, filesystem=self.store.arrow_fs)
        if meta.num_rows == 0:
            return None
        return _FileRange(
            path, meta.num_row_groups, _min_max(meta, "attempt"), _min_max(meta, "run_id")
        )

    def rows(self, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
        """The rows (``columns``, in no particular order) whose ``(run_id, attempt)`` is a
        row of ``keys``: per attempt, the rows of its runs in the files that may hold them,
        of which only the row groups whose statistics may hold them are read."""
        return self.read(keys, columns)()

    def read(self, keys: pa.Table, columns: Sequence[str]) -> ChunkRead:
        """:meth:`rows`, to read later (or in another process)."""
        parts = []
        by_attempt = keys.group_by("attempt").aggregate([("run_id", "list")]).to_pydict()
        for attempt, run_ids in zip(by_attempt["attempt"], by_attempt["run_id_list"], strict=True):
            lo, hi = min(run_ids), max(run_ids)
            files = self.by_attempt.get(attempt, []) + [
                f for f in self.mixed if _overlaps(f.attempt, attempt, attempt)
            ]
            files = [f for f in files if _overlaps(f.run_id, lo, hi)]
            if files:
                parts.append(_AttemptRows(attempt, run_ids, files))
        return ChunkRead(self.store, self.schema, list(columns), parts)


def _min_max(meta: pq.FileMetaData, column: str) -> tuple[str, str] | None:
    """(min, max) of a string column over a file's row groups, from its footer; None where
    a row group has no statistics or may hold NULLs (or the file lacks the column): then
    every value of the file lies within the range."""
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    if column not in names:
        return None
    j = names.index(column)
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(j).statistics
        if stats is None or not (stats.has_min_max and stats.has_null_count) or stats.null_count:
            return None
        lows.append(stats.min)
        highs.append(stats.max)
    return (min(lows), max(highs)) if lows else None


def _overlaps(span: tuple[str, str] | None, lo: str, hi: str) -> bool:
    return span is None or (span[0] <= hi and span[1] >= lo)
