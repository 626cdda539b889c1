"""Read-only SQL over a store, for ``phasesweep query`` and other untrusted input."""

from __future__ import annotations

import difflib
import itertools
import json
import os
import posixpath
import re
import tempfile
import time
from collections.abc import Iterator, Sequence

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from phasesweep.storage import schema
from phasesweep.storage._catalog import (
    SNAPSHOT_TRIES,
    catalog_connection,
    create_views,
    locked_connection,
    snapshot,
    tables_read,
)
from phasesweep.storage._store import Damage, Store, as_store

_READ_TYPES = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)


#: Seconds a query keeps taking the file lists anew while compactions keep replacing the
#: files it read (at least :data:`SNAPSHOT_TRIES` tries): on a loaded machine a query can
#: span several compactions in a row, and a count of tries alone gives up after a few.
SNAPSHOT_PATIENCE_S = 60.0


class ReadOnlyQueryError(ValueError):
    """The SQL given to ``run_query`` is not a single read-only statement."""


def run_query(store_or_uri: Store | str | None, sql: str) -> tuple[list[str], list[tuple]]:
    """Run one read-only SQL statement over the catalog views: ``(column_names, rows)``.

    ``rows`` is a list of tuples of Python values (``None`` for NULL, ``float``,
    ``int``, ``str``, lists, tz-aware ``datetime``), converted through Arrow (DuckDB's own
    ``fetchall`` needs pytz for ``TIMESTAMP WITH TIME ZONE`` columns such as ``finished_at``).
    See :func:`query_table` for what is accepted and how it is confined.
    """
    table = query_table(store_or_uri, sql)
    return table.column_names, list(zip(*(column.to_pylist() for column in table.columns)))


def query_table(store_or_uri: Store | str | None, sql: str) -> pa.Table:
    """Run one read-only SQL statement over the catalog views; the result as an Arrow table.

    Accepted: a single SELECT-like statement (``SELECT``, ``WITH``, ``FROM``,
    ``VALUES``, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``) or ``EXPLAIN`` of one
    (not ``EXPLAIN ANALYZE``, which executes its statement); the statement types
    come from DuckDB's parser. Anything else raises ``ReadOnlyQueryError``
    naming the statement; so does an accepted statement that tries to touch
    files (e.g. ``read_csv``). SQL errors are raised as ``duckdb.Error``.

    Beyond the statement check, the query runs on a locked catalog connection
    (``open_catalog``'s default): it cannot reach any file but the store's tables,
    and the statement check keeps it from writing over those. The whole result is
    materialised in memory: add a LIMIT for large outputs. A query that fails because
    a file went away meanwhile (a compaction) runs again on new lists, for as long as the
    lists keep changing within :data:`SNAPSHOT_PATIENCE_S`.
    """
    statement = _read_only_statement(sql)
    store = as_store(store_or_uri)
    patience = time.monotonic() + SNAPSHOT_PATIENCE_S
    for tries in itertools.count(1):
        files = snapshot(store)
        con = None
        try:
            con = catalog_connection(store, files)
            return con.sql(statement).to_arrow_table()
        except (duckdb.Error, OSError) as e:
            again = tries < SNAPSHOT_TRIES or time.monotonic() < patience
            if again and snapshot(store) != files:
                continue  # a file listed went away (compaction): run it again on new lists
            if isinstance(e, duckdb.PermissionException):
                raise ReadOnlyQueryError(f"query needs access that queries do not get: {e}") from e
            if isinstance(e, duckdb.CatalogException) and con is not None:
                raise _with_our_tables(e, con) from e
            raise
        finally:
            if con is not None:
                con.close()
    raise AssertionError("unreachable: itertools.count does not end")


def damage_read(store: Store, sql: str, damage: Sequence[Damage]) -> list[Damage]:
    """The damaged files of ``damage`` whose rows the answer to ``sql`` (one read-only
    statement) would read if they were whole: those it leaves out.

    A file of a table the statement does not read (:func:`tables_read`) is never one. A
    Parquet file of a table it reads is one unless DuckDB's planner prunes its partition:
    the statement is planned (``EXPLAIN``, nothing runs) over views of the same SQL whose
    only file is an empty stand-in at the damaged file's partition (``{table}/sweep=S``),
    and the file counts unless every scan of it is pruned by a filter on ``sweep``
    (``WHERE sweep = 'b'``, or a join to a table so filtered). A statement that cannot be
    planned so (``EXPLAIN`` of an ``EXPLAIN``) keeps every file of the tables it reads,
    as does a damaged manifest entry when it reads ``manifest``: what cannot be shown
    unread counts as read.
    """
    read = tables_read(sql)
    named = [d for d in damage if store.relative(d.path).split("/")[0] in read]
    partitions = {_partition(store, d) for d in named if d.path.endswith(".parquet")}
    partitions.discard(None)
    if not partitions:
        return named
    statement = _read_only_statement(sql)
    with tempfile.TemporaryDirectory(prefix="phasesweep-probe-") as tmp:
        scanned = {p for p in partitions if _scans(Store.open(tmp), statement, *p)}
    return [d for d in named if _partition(store, d) in scanned | {None}]


def _partition(store: Store, damage: Damage) -> tuple[str, str] | None:
    """``(table, sweep)`` of a damaged Parquet file of a table (None for anything else)."""
    parts = store.relative(damage.path).split("/")
    if len(parts) != 3 or parts[0] not in schema.TABLES or not parts[1].startswith("sweep="):
        return None
    return parts[0], parts[1].removeprefix("sweep=")


def _scans(probe: Store, statement: str, table: str, sweep: str) -> bool:
    """Whether DuckDB's plan of ``statement`` scans partition ``sweep`` of ``table`` (see
    :func:`damage_read`): ``probe`` is an empty folder for the stand-in file."""
    path = f"{probe.table_dir(table)}/sweep={sweep}/standin.parquet"
    os.makedirs(posixpath.dirname(path))
    pq.write_table(schema.TABLES[table].empty_table(), path)
    con = locked_connection([path])
    try:
        create_views(con, probe, by_duckdb={table}, files={table: [path]})
        plan = con.execute(f"EXPLAIN (FORMAT json) {statement}").fetchall()
        nodes = list(_nodes(json.loads(plan[0][1])))
    except (duckdb.Error, ValueError, IndexError):
        return True  # cannot be planned so: counted as read
    finally:
        con.close()
    scans = [n.get("extra_info") or {} for n in nodes if n.get("name") == "READ_PARQUET"]
    # a scan without "Scanning Files: k/n" has no file filter: it reads every file
    return any(not str(info.get("Scanning Files", "")).startswith("0/") for info in scans)


def _nodes(plan: object) -> Iterator[dict]:
    """Every operator of an ``EXPLAIN (FORMAT json)`` plan."""
    for node in plan if isinstance(plan, list) else [plan]:
        if isinstance(node, dict):
            yield node
            yield from _nodes(node.get("children", []))


_NO_TABLE = re.compile(r"(Table with name (\S+) does not exist!)(?:\s*Did you mean \"[^\"]*\"\?)?")


def _with_our_tables(
    error: duckdb.CatalogException, con: duckdb.DuckDBPyConnection
) -> duckdb.CatalogException:
    """``error`` with DuckDB's guess at a table (its own ``duckdb_tables``,
    ``information_schema.tables``…, which a query cannot use) replaced by the store's
    table closest to the name, or the list of the store's tables."""
    found = _NO_TABLE.search(str(error))
    if found is None:
        return error
    ours = sorted(
        name
        for (name,) in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal"
        ).fetchall()
    )
    close = difflib.get_close_matches(found.group(2).lower(), ours, n=1, cutoff=0.7)
    hint = f'Did you mean "{close[0]}"?' if close else f"The store's tables: {', '.join(ours)}."
    return duckdb.CatalogException(_NO_TABLE.sub(f"{found.group(1)} {hint}", str(error), 1))


def _kind(statement: duckdb.Statement) -> str:
    """What ``statement`` is, in the user's words: DuckDB's type, but INSTALL (which its
    parser types as LOAD) called by its name."""
    words = statement.query.split(None, 2)
    if statement.type == duckdb.StatementType.LOAD and "INSTALL" in map(str.upper, words[:2]):
        return "INSTALL"
    return statement.type.name


def _read_only_statement(sql: str) -> str:
    """The text of the single read-only statement in ``sql``, else ``ReadOnlyQueryError``."""
    statements = duckdb.extract_statements(sql)
    for statement in statements:
        text = statement.query.strip()
        if statement.type not in _READ_TYPES:
            raise ReadOnlyQueryError(
                f"{_kind(statement)} statement not allowed, queries are read-only: {text!r}"
            )
        if statement.type == duckdb.StatementType.EXPLAIN and _has_analyze(text):
            raise ReadOnlyQueryError(
                f"EXPLAIN ANALYZE executes its statement, not allowed: {text!r}"
            )
    if len(statements) != 1:
        raise ReadOnlyQueryError(f"expected exactly one SQL statement, got {len(statements)}")
    return statements[0].query


def sql_condition(text: str) -> str:
    """``text`` if it is one SQL condition that can go into a statement's WHERE clause as
    it is (e.g. a plot's ``where``), else ``ReadOnlyQueryError``.

    DuckDB's parser must take it as exactly one expression (``duckdb.SQLExpression``),
    with no ``;`` outside its string literals (the parser lets a trailing one pass): no
    semicolon that could end the statement it goes into and start one that writes (see
    :func:`catalog_connection`), no unbalanced parenthesis or quote that could carry it
    out of its place. The check reads the text alone, so it holds whatever SQL the
    condition is put into. Columns are not bound here: an unknown column fails when the
    statement runs.
    """
    try:
        duckdb.SQLExpression(text)
        problem = None
    except duckdb.Error as e:  # ParserException; InvalidInputException for a list
        problem = str(e)
    # outside the except block: the parser's traceback is not kept alive by ours
    if problem is not None:
        raise ReadOnlyQueryError(f"not one SQL condition: {text!r} ({problem})")
    if any(kind == duckdb.token_type.operator and ";" in token for kind, token in _tokens(text)):
        raise ReadOnlyQueryError(f"not one SQL condition: {text!r} (';' ends a statement)")
    return text


def _tokens(text: str) -> list[tuple[duckdb.token_type, str]]:
    """``text`` as DuckDB's tokenizer splits it: (kind, the token's text with the blanks
    after it)."""
    tokens = duckdb.tokenize(text)
    ends = [start for start, _ in tokens[1:]] + [len(text)]
    return [(kind, text[start:end]) for (start, kind), end in zip(tokens, ends, strict=True)]


def _has_analyze(text: str) -> bool:
    """Whether ``text`` has the keyword ANALYZE/ANALYSE, by DuckDB's tokenizer."""
    return any(
        kind == duckdb.token_type.keyword and token.strip().upper() in ("ANALYZE", "ANALYSE")
        for kind, token in _tokens(text)
    )
