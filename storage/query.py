"""Read-only SQL over a store, for ``phasesweep query`` and other untrusted input."""

from __future__ import annotations

import duckdb
import pyarrow as pa
from phasesweep.storage.catalog import create_views
from phasesweep.storage.store import Store, as_store

_READ_TYPES = (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN)

#: DuckDB settings of a query connection: no file, network or extension access by
#: DuckDB itself, no scans of Python variables, and no way to change any of that.
_LOCKED = {
    "enable_external_access": False,
    "python_enable_replacements": False,
    "lock_configuration": True,
}


class ReadOnlyQueryError(ValueError):
    """The SQL given to ``run_query`` is not a single read-only statement."""


def run_query(store_or_uri: Store | str | None, sql: str) -> tuple[list[str], list[tuple]]:
    """Run one read-only SQL statement over the catalog views: ``(column_names, rows)``.

    ``rows`` is a list of tuples of Python values (``None`` for NULL, ``float``,
    ``int``, ``str``, lists, tz-aware ``datetime``), converted through Arrow (DuckDB's own ``fetchall``
    needs pytz for ``TIMESTAMP WITH TIME ZONE`` columns such as ``finished_at``).
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

    Beyond the statement check, the query runs on a :func:`read_only_connection`:
    it cannot reach any file, so it cannot change the store. The whole result
    is materialised in memory: add a LIMIT for large outputs.
    """
    statement = _read_only_statement(sql)
    con = read_only_connection(store_or_uri)
    try:
        return con.sql(statement).to_arrow_table()
    except duckdb.PermissionException as e:
        raise ReadOnlyQueryError(f"query needs access that queries do not get: {e}") from e
    finally:
        con.close()


def read_only_connection(store_or_uri: Store | str | None) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with the catalog views, confined to the store.

    The views scan Arrow datasets registered from Python; DuckDB's own file and
    extension access is switched off and its configuration locked, so nothing run
    on the connection can read or write a file: it may create in-memory tables,
    never change the store. The file lists are taken now (see ``storage.catalog``).
    """
    store = as_store(store_or_uri)
    con = duckdb.connect(config=_LOCKED)
    try:
        create_views(con, store, via_arrow=True)
    except BaseException:
        con.close()
        raise
    return con


def _read_only_statement(sql: str) -> str:
    """The text of the single read-only statement in ``sql``, else ``ReadOnlyQueryError``."""
    statements = duckdb.extract_statements(sql)
    for statement in statements:
        text = statement.query.strip()
        if statement.type not in _READ_TYPES:
            raise ReadOnlyQueryError(
                f"{statement.type.name} statement not allowed, queries are read-only: {text!r}"
            )
        if statement.type == duckdb.StatementType.EXPLAIN and _has_analyze(text):
            raise ReadOnlyQueryError(
                f"EXPLAIN ANALYZE executes its statement, not allowed: {text!r}"
            )
    if len(statements) != 1:
        raise ReadOnlyQueryError(f"expected exactly one SQL statement, got {len(statements)}")
    return statements[0].query


def _has_analyze(text: str) -> bool:
    """Whether ``text`` has the keyword ANALYZE/ANALYSE, by DuckDB's tokenizer."""
    tokens = duckdb.tokenize(text)
    ends = [start for start, _ in tokens[1:]] + [len(text)]
    return any(
        kind == duckdb.token_type.keyword
        and text[start:end].strip().upper() in ("ANALYZE", "ANALYSE")
        for (start, kind), end in zip(tokens, ends, strict=True)
    )
