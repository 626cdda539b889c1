"""Catalog views over empty and partial stores, and the read-only guard of run_query."""

from __future__ import annotations

import hashlib
import os

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from phasesweep.storage import (
    ReadOnlyQueryError,
    Store,
    open_catalog,
    run_query,
    schema,
    sql_condition,
)
from phasesweep.storage._parquet import parquet_bytes
from phasesweep.storage._writer import put_atomic

VIEWS = {
    "runs": schema.RUNS,
    "trajectories": schema.TRAJECTORIES,
    "layers": schema.LAYERS,
    **schema.ANALYSIS_TABLES,
}


def _columns(con, view: str) -> list[str]:
    return [r[0] for r in con.sql(f"DESCRIBE {view}").fetchall()]


def _count(con, view: str) -> int:
    ((n,),) = con.sql(f"SELECT count(*) FROM {view}").fetchall()
    return n


def _fingerprint(root) -> dict[str, str]:
    """Every file under ``root`` (hidden ones too) -> sha256 of its bytes."""
    return {
        os.path.relpath(os.path.join(d, f), root): hashlib.sha256(
            open(os.path.join(d, f), "rb").read()
        ).hexdigest()
        for d, _, files in os.walk(root)
        for f in files
    }


@pytest.mark.parametrize("make_dir", [False, True], ids=["missing-dir", "empty-dir"])
def test_empty_store_has_typed_views(tmp_path, make_dir):
    root = tmp_path / "store"
    if make_dir:
        root.mkdir()
    con = open_catalog(str(root))
    for view, table_schema in VIEWS.items():
        assert _columns(con, view) == ["sweep", *table_schema.names]
        assert _count(con, view) == 0
    assert _count(con, "manifest") == 0
    assert run_query(str(root), "SELECT * FROM trajectories") == (
        ["sweep", *schema.TRAJECTORIES.names],
        [],
    )
    names, rows = run_query(str(root), "SELECT column_type FROM (DESCRIBE trajectories)")
    assert rows[schema.TRAJECTORIES.names.index("train_loss") + 1] == ("DOUBLE",)
    assert os.path.exists(root) == make_dir  # reading created nothing


def test_store_with_runs_only(tmp_path, store_make_chunk):
    """A chunk whose runs all failed early has no trajectories or layers files."""
    store = Store.open(str(tmp_path))
    tables = store_make_chunk(["r1", "r2"])
    store.write_chunk("s", "c0", {"runs": tables["runs"]})
    assert store.files("trajectories") == [] and store.files("layers") == []
    con = open_catalog(store)
    assert (_count(con, "runs"), _count(con, "trajectories"), _count(con, "layers")) == (2, 0, 0)
    assert _columns(con, "layers") == ["sweep", *schema.LAYERS.names]


def test_views_fill_columns_that_older_files_lack(tmp_path, store_make_chunk):
    """Schema additions stay readable over old files: the missing column reads as NULL."""
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1"]))
    (path,) = store.files("trajectories")
    old = pq.read_table(path).drop_columns(["grad_norm"])
    put_atomic(store.fs, path, parquet_bytes(old))
    con = open_catalog(store)
    got = con.sql("SELECT count(*), count(grad_norm), count(train_loss) FROM trajectories")
    assert got.fetchall() == [(3, 0, 3)]
    assert run_query(store, "SELECT grad_norm FROM trajectories") == (["grad_norm"], [(None,)] * 3)
    _, types = run_query(store, "SELECT column_type FROM (DESCRIBE trajectories)")
    assert types[schema.TRAJECTORIES.names.index("grad_norm") + 1] == ("DOUBLE",)


def test_run_query_matches_open_catalog(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"], steps=5))
    store.write_chunk("u", "c0", store_make_chunk(["r3"], seed=3))
    sql = (
        "SELECT r.sweep, r.run_id, r.init_scale, avg(t.train_loss) AS mean_loss, count(*) AS n "
        "FROM runs r JOIN trajectories t USING (sweep, run_id) GROUP BY ALL ORDER BY run_id"
    )
    names, rows = run_query(store, sql)
    assert names == ["sweep", "run_id", "init_scale", "mean_loss", "n"]
    assert rows == open_catalog(store).sql(sql).fetchall()
    assert [r[4] for r in rows] == [5, 5, 3]
    assert all(isinstance(r[3], float) for r in rows)
    # TIMESTAMP WITH TIME ZONE comes back as an aware datetime (no pytz needed).
    _, ((finished_at,),) = run_query(store, "SELECT max(finished_at) FROM runs")
    assert finished_at.utcoffset().total_seconds() == 0


@pytest.mark.parametrize(
    "sql",
    [
        "WITH x AS (SELECT run_id FROM runs) SELECT count(*) FROM x",
        "FROM runs SELECT count(*)",
        "DESCRIBE runs",
        "SHOW TABLES",
        "SUMMARIZE trajectories",
        "EXPLAIN SELECT * FROM layers WHERE step > 1",
        "VALUES (1, 2)",
        "SELECT 1;",
    ],
)
def test_run_query_accepts_reads(tmp_path, store_make_chunk, sql):
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"]))
    names, rows = run_query(store, sql)
    assert names and rows


def test_run_query_guard(tmp_path, store_make_chunk):
    """No statement can change, remove or add a file of the store."""
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"]))
    store.write_spec("s", "name: s\n")
    before = _fingerprint(tmp_path)
    runs_file = store.files("runs")[0]
    attacks = {
        "COPY (SELECT 1 AS x) TO '{root}/runs/sweep=s/evil.parquet' (FORMAT parquet)": "COPY",
        "COPY runs TO '{runs_file}' (FORMAT parquet)": "COPY",
        "DELETE FROM runs": "DELETE",
        "UPDATE runs SET status = 'failed'": "UPDATE",
        "INSERT INTO runs SELECT * FROM runs": "INSERT",
        "DROP VIEW runs": "DROP",
        "CREATE TABLE t AS SELECT * FROM runs": "CREATE",
        "CREATE OR REPLACE VIEW runs AS SELECT 1": "CREATE",
        "ATTACH '{root}/evil.duckdb' AS evil": "ATTACH",
        "ATTACH '{runs_file}' AS evil": "ATTACH",
        "INSTALL httpfs": "INSTALL statement",
        "LOAD httpfs": "LOAD",
        "SET enable_external_access = true": "SET",
        "RESET lock_configuration": "SET",
        "PRAGMA enable_profiling": "PRAGMA",
        "CALL pragma_version()": "CALL",
        "EXPORT DATABASE '{root}/dump'": "EXPORT",
        "CHECKPOINT": "CALL",
        "SELECT 1; DELETE FROM runs": "DELETE",
        "SELECT 1; SELECT 2": "exactly one",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO '{root}/x.csv'": "ANALYZE",
        "EXPLAIN (ANALYZE) CREATE TABLE t AS SELECT 1": "ANALYZE",
        "SELECT * FROM read_parquet('{root}/runs/**/*.parquet')": "access",
        "SELECT * FROM read_text('{spec_file}')": "access",
        "SELECT * FROM read_text('/etc/hostname')": "access",
        "SELECT * FROM glob('{root}/*')": "access",
        "": "exactly one",
    }
    (spec_file,) = tmp_path.rglob("s.yaml")
    for template, message in attacks.items():
        sql = template.format(root=tmp_path, runs_file=runs_file, spec_file=spec_file)
        with pytest.raises(ReadOnlyQueryError, match=message):
            run_query(store, sql)
    # the one thing beyond the views: reading the tables' own files, which they show anyway
    assert run_query(store, f"SELECT count(*) FROM read_parquet('{runs_file}')")[1] == [(2,)]
    assert _fingerprint(tmp_path) == before


def test_run_query_cannot_reach_python_variables(tmp_path):
    secret = pa.table({"password": ["hunter2"]})  # noqa: F841  (a replacement-scan target)
    with pytest.raises(duckdb.CatalogException):
        run_query(str(tmp_path), "SELECT * FROM secret")


def test_run_query_reports_sql_errors(tmp_path):
    with pytest.raises(duckdb.ParserException):
        run_query(str(tmp_path), "SELEC 1")
    with pytest.raises(duckdb.BinderException):
        run_query(str(tmp_path), "SELECT no_such_column FROM runs")


def test_query_connection_is_hardened_without_the_statement_check(
    tmp_path, store_make_chunk, monkeypatch
):
    """Defence in depth: with the statement check bypassed, DuckDB itself refuses every
    file but the tables' own, every extension and every change of its settings. (The
    tables' files it would let a COPY or ATTACH statement write over: keeping those
    statements out is the statement check's job, tested above.)"""
    from phasesweep.storage import _query as query_mod

    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1"]))
    store.write_spec("s", "name: s\n")
    (spec_file,) = tmp_path.rglob("s.yaml")
    before = _fingerprint(tmp_path)
    monkeypatch.setattr(query_mod, "_read_only_statement", lambda sql: sql)
    attacks = [
        f"COPY (SELECT 1 AS x) TO '{tmp_path}/runs/sweep=s/evil.parquet' (FORMAT parquet)",
        f"COPY runs TO '{tmp_path}/evil.csv'",
        f"ATTACH '{tmp_path}/evil.duckdb' AS evil",
        f"EXPORT DATABASE '{tmp_path}/dump'",
        f"SELECT * FROM read_text('{spec_file}')",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "SET allowed_paths = ['/etc/hostname']",
        "SET lock_configuration = false",
        "SET python_enable_replacements = true",
        "DELETE FROM runs",
    ]
    for sql in attacks:
        with pytest.raises((ReadOnlyQueryError, duckdb.Error), match="ermission|locked|base table"):
            run_query(store, sql)
    # DDL only changes the throwaway in-memory connection.
    run_query(store, "DROP VIEW summaries")
    run_query(store, "CREATE TABLE t AS SELECT * FROM trajectories")
    assert _fingerprint(tmp_path) == before
    assert run_query(store, "SELECT count(*) AS n FROM runs") == (["n"], [(1,)])


def test_catalog_for_analysis_cannot_reach_files(tmp_path, store_make_chunk):
    """SQL a spec carries (a plot's ``where``) runs on open_catalog's connection: locked."""
    store = Store.open(str(tmp_path / "store"))
    store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"]))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pq.write_table(pa.table({"width": [1, 2]}), elsewhere / "x.parquet")
    before = _fingerprint(tmp_path)
    con = open_catalog(store)
    wheres = [
        "width IN (SELECT 1 FROM read_csv('/etc/passwd'))",
        f"width IN (SELECT width FROM read_parquet('{elsewhere}/*'))",
        "width IN (SELECT length(content) FROM read_text('/etc/hostname'))",
        f"width IN (SELECT 1 FROM glob('{elsewhere}/*'))",
        f"width IN (SELECT 1 FROM read_parquet('{tmp_path}/store/runs/**/*.parquet'))",
    ]
    for where in wheres:
        with pytest.raises(duckdb.PermissionException):
            con.execute(f"SELECT run_id FROM runs WHERE sweep = ? AND ({where})", ["s"]).fetchall()
    statements = [
        f"COPY (SELECT 1 AS x) TO '{elsewhere}/y.csv'",
        f"COPY runs TO '{tmp_path}/store/runs/sweep=s/evil.parquet' (FORMAT parquet)",
        f"ATTACH '{elsewhere}/evil.duckdb' AS evil",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET python_enable_replacements = true",
    ]
    for sql in statements:
        with pytest.raises(duckdb.Error, match="ermission|locked|disabled"):
            con.execute(sql)
    assert _fingerprint(tmp_path) == before
    # what analysis does still works
    assert con.execute("SELECT count(*) FROM runs WHERE sweep = ?", ["s"]).fetchall() == [(2,)]
    con.execute("CREATE TEMP TABLE t AS SELECT * FROM trajectories")
    assert con.sql("SELECT count(*) FROM t").fetchall() == [(6,)]
    # the unlocked catalog is opt-in (trusted maintenance code) and reads the same rows
    full = open_catalog(store, external_access=True)
    assert full.sql("SELECT * FROM layers ORDER BY ALL").fetchall() == (
        con.sql("SELECT * FROM layers ORDER BY ALL").fetchall()
    )


@pytest.mark.parametrize(
    "where",
    [
        "seed = 0",
        "width IN (16, 64) AND init_scale < 1e-2",
        "activation = 'a;b'",  # a semicolon in a string literal is data
        "run_id IN (SELECT run_id FROM runs WHERE status = 'completed')",
    ],
)
def test_sql_condition_takes_one_condition(where):
    assert sql_condition(where) == where


@pytest.mark.parametrize(
    "where",
    [
        "seed = 0; COPY runs TO 'x.parquet'",
        "seed = 0);(SELECT 1",
        "seed = 0;",
        "seed = (0",
        "seed = 0) ORDER BY (1",
        "1 = 1) UNION SELECT (1",
        "seed = 0, width = 16",
        "",
    ],
)
def test_sql_condition_refuses_what_could_leave_its_statement(where):
    with pytest.raises(ReadOnlyQueryError, match="not one SQL condition"):
        sql_condition(where)


def test_conditions_from_outside_cannot_write_over_the_tables(tmp_path, store_make_chunk):
    """A plot's ``where`` goes into SQL on open_catalog's connection, which could write
    over the tables' files with a COPY statement: the condition check keeps statements
    out wherever a ``where`` is put into SQL (figures, the phase-diagram query)."""
    from phasesweep.analysis import phase_diagram_sql
    from phasesweep.analysis.figures._kind import selected_runs

    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"]))
    runs_file = store.files("runs")[0]
    before = _fingerprint(tmp_path)
    evil = f"1 = 1); COPY (SELECT 1) TO '{runs_file}' (FORMAT csv, USE_TMP_FILE false); SELECT (1"
    with pytest.raises(ReadOnlyQueryError, match="not one SQL condition"):
        selected_runs(evil)
    with pytest.raises(ReadOnlyQueryError, match="not one SQL condition"):
        phase_diagram_sql("s", where=evil)
    assert _fingerprint(tmp_path) == before
    con = open_catalog(store)
    runs = selected_runs("run_id = 'r1'")
    assert con.execute(f"SELECT run_id FROM {runs}", ["s"]).fetchall() == [("r1",)]


def test_both_readers_of_the_locked_catalog_give_the_same_views(
    tmp_path, store_make_chunk, monkeypatch
):
    """Tables of few files are read by DuckDB's Parquet reader, tables of many through
    pyarrow.dataset (``READER_MAX_FILES``): every view has the same rows either way, and
    a table's files are readable by SQL only when DuckDB reads them."""
    from phasesweep.storage import _catalog

    store = Store.open(str(tmp_path))
    for c in range(3):
        store.write_chunk("s", f"c{c}", store_make_chunk([f"r{c}a", f"r{c}b"], seed=c))
    store.write_chunk("t", "c0", store_make_chunk(["r9"], seed=9))
    views = ["runs", "trajectories", "layers", "manifest"]

    def rows(con):
        return {v: con.sql(f"SELECT * FROM {v} ORDER BY ALL").fetchall() for v in views}

    by_duckdb = rows(open_catalog(store))
    monkeypatch.setattr(_catalog, "READER_MAX_FILES", 2)  # runs/trajectories/layers: 4 files
    con = open_catalog(store)
    assert rows(con) == by_duckdb and len(by_duckdb["runs"]) == 7
    with pytest.raises(duckdb.PermissionException):
        con.sql(f"SELECT count(*) FROM read_parquet('{store.files('runs')[0]}')").fetchall()
