"""Store: layout, round trip, validation, atomic writes and crash behaviour (local file system)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem
from phasesweep.storage import (
    Store,
    UnsafePathError,
    open_catalog,
    resolve_store_uri,
    run_query,
    safe_output_path,
    schema,
)
from phasesweep.storage import _parquet as parquet_mod
from phasesweep.storage import _store as store_mod
from phasesweep.storage import _writer as writer_mod
from phasesweep.storage._claims import Claims
from phasesweep.storage._parquet import encode_tables, parquet_bytes
from phasesweep.storage._writer import put_atomic


def _rows(con, sql: str) -> list[dict]:
    return con.sql(sql).to_arrow_table().to_pylist()


def _scalar(con, sql: str):
    (row,) = con.sql(sql).fetchall()
    return row[0]


def _all_files(root) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


def _expected(table: pa.Table, target: pa.Schema) -> list[dict]:
    """Input rows as the store returns them: cast to the schema, without store-set columns."""
    names = [n for n in target.names if n in table.column_names]
    return table.select(names).cast(pa.schema([target.field(n) for n in names])).to_pylist()


def test_resolve_store_uri(monkeypatch):
    monkeypatch.delenv("PHASESWEEP_STORE", raising=False)
    assert resolve_store_uri(None) == "./results"
    monkeypatch.setenv("PHASESWEEP_STORE", "s3://b/p")
    assert resolve_store_uri(None) == "s3://b/p"
    assert resolve_store_uri("/x/y") == "/x/y"


def test_open_uri_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PHASESWEEP_STORE", raising=False)
    assert Store.open(None).uri == str(tmp_path / "results")
    assert Store.open(f"file://{tmp_path}/st").uri == str(tmp_path / "st")
    assert Store.open("st").uri == str(tmp_path / "st")
    with pytest.raises(ValueError, match="unsupported store URI"):
        Store.open("gopher://x/y")
    assert os.listdir(tmp_path) == []  # opening creates nothing


def test_round_trip_through_catalog(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    tables = store_make_chunk(["r1", "r2", "r3"], steps=4, depth=3)
    store.write_chunk("alpha", "c0", tables)
    con = open_catalog(store)

    runs = _rows(con, "SELECT * FROM runs ORDER BY run_id")
    assert [r.pop("sweep") for r in runs] == ["alpha"] * 3
    attempts = {r.pop("attempt") for r in runs}
    assert len(attempts) == 1 and len(next(iter(attempts))) == 12
    assert {r.pop("chunk_id") for r in runs} == {"c0"}
    assert runs == _expected(tables["runs"], schema.RUNS)

    for name, order in (("trajectories", "run_id, step"), ("layers", "run_id, step, layer")):
        got = _rows(con, f"SELECT * EXCLUDE (sweep, attempt) FROM {name} ORDER BY {order}")
        assert len(got) == tables[name].num_rows
        assert got == _expected(tables[name], schema.CHUNK_TABLES[name])
    # NULLs stay NULL (never a made-up number), float64 bits are exact.
    assert _scalar(con, "SELECT count(*) FROM trajectories WHERE train_loss IS NULL") == 3
    types = dict(con.sql("SELECT column_name, column_type FROM (DESCRIBE trajectories)").fetchall())
    assert types["train_loss"] == "DOUBLE" and types["sweep"] == "VARCHAR"


def test_two_sweeps_are_separate_partitions(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    store.write_chunk("alpha", "c0", store_make_chunk(["a1", "a2"]))
    store.write_chunk("beta-2", "c0", store_make_chunk(["b1"], seed=1))
    assert store.sweeps() == ["alpha", "beta-2"]
    assert store.done_run_ids("alpha") == {"a1", "a2"}
    assert store.done_run_ids("beta-2") == {"b1"}
    runs_files = store.files("runs")
    assert [os.path.basename(os.path.dirname(p)) for p in runs_files] == [
        "sweep=alpha",
        "sweep=beta-2",
    ]
    for p in runs_files + store.files("trajectories") + store.files("layers"):
        assert "sweep" not in pq.read_schema(p).names
    con = open_catalog(store)
    got = con.sql("SELECT sweep, count(*) FROM trajectories GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [("alpha", 6), ("beta-2", 3)]


def test_file_names_and_parquet_settings(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "chunk-7", store_make_chunk(["r1"]))
    (entry,) = store.manifest("s")
    attempt = entry["attempt"]
    for table in ("trajectories", "layers", "runs"):
        (path,) = store.files(table, "s")
        assert os.path.basename(path) == f"part-chunk-7-{attempt}.parquet"
        meta = pq.ParquetFile(path).metadata
        column = meta.row_group(0).column(0)
        assert column.compression == "ZSTD" and column.statistics.has_min_max
        names = meta.schema.names
        encodings = {names[i]: meta.row_group(0).column(i).encodings for i in range(len(names))}
        # dictionaries for the strings and integers (ids, steps), byte-stream-split floats
        integer = "seed" if table == "runs" else "step"
        assert "RLE_DICTIONARY" in encodings["run_id"] and "RLE_DICTIONARY" in encodings[integer]
        if table != "runs":
            float_column = "train_loss" if table == "trajectories" else "fro_norm"
            assert "BYTE_STREAM_SPLIT" in encodings[float_column]
        assert set(pq.read_table(path, columns=["attempt"]).column(0).to_pylist()) == {attempt}

    # Row groups: at most 1,000,000 rows and balanced, so no small trailing group.
    big = pa.table({"x": pa.array(range(1_050_000), pa.float64())})
    meta = pq.ParquetFile(pa.BufferReader(parquet_bytes(big))).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes == [525_000, 525_000]


def test_tables_encode_alike_on_threads(tmp_path, store_make_chunk):
    """A chunk's tables encoded on threads are the bytes of one thread, and a chunk written
    on three threads reads back as one written on one."""
    tables = store_make_chunk(["r1", "r2", "r3"], steps=5, depth=2)
    alone = {name: parquet_bytes(table) for name, table in tables.items()}
    for threads in (1, 2, 3, 8):
        encoded = encode_tables(tables, threads)
        assert list(encoded) == list(tables) and encoded == alone

    store = Store.open(str(tmp_path))
    store.write_chunk("one", "c0", tables)
    store.write_chunk("three", "c0", tables, threads=3)
    con = open_catalog(store)
    for name, order in (("runs", "run_id"), ("trajectories", "run_id, step")):
        one, three = (
            _rows(con, f"SELECT * EXCLUDE (sweep, attempt) FROM {name} "
                       f"WHERE sweep = '{sweep}' ORDER BY {order}")
            for sweep in ("one", "three")
        )  # fmt: skip
        assert one == three and len(one) == tables[name].num_rows


def test_an_encoding_error_on_a_thread_writes_nothing(tmp_path, store_make_chunk, monkeypatch):
    """Every table is encoded before the first file is written: a table that fails to
    encode (here the second of three, on its own thread) leaves no file of the chunk."""
    real = parquet_mod.parquet_bytes

    def failing(table: pa.Table) -> bytes:
        if "layer" in table.column_names:
            raise OSError("encoder out of memory")
        return real(table)

    monkeypatch.setattr(parquet_mod, "parquet_bytes", failing)
    store = Store.open(str(tmp_path))
    with pytest.raises(OSError, match="encoder out of memory"):
        store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"]), threads=3)
    assert _all_files(tmp_path) == []


def test_done_run_ids_counts_only_committed(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    assert store.done_run_ids("s") == set()
    store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"]))
    store.write_chunk("s", "c1", store_make_chunk(["r3"]))
    assert store.done_run_ids("s") == {"r1", "r2", "r3"}
    assert store.done_run_ids("other") == set()


@pytest.mark.parametrize("folder", ["results[v2]", "a*b", "q?", "it's, ok"])
def test_a_root_with_glob_characters_is_taken_literally(tmp_path, store_make_chunk, folder):
    """Listings glob below the root: a root like ``results[v2]`` must not be read as a
    pattern (it matched nothing, so every relaunch trained everything again)."""
    (tmp_path / "results2").mkdir()  # what [v2] would match as a pattern: a decoy
    store = Store.open(str(tmp_path / folder))
    store.write_spec("s", "name: s\n")
    store.write_chunk("s", "c0", store_make_chunk(["r1", "r2"]))
    assert store.done_run_ids("s") == {"r1", "r2"}
    assert store.sweeps() == ["s"]
    assert len(store.manifest("s")) == 1 and len(store.files("runs", "s")) == 1
    assert run_query(store, "SELECT count(*) FROM runs")[1] == [(2,)]
    assert open_catalog(store).sql("SELECT count(*) FROM trajectories").fetchall() == [(6,)]
    # claims read their files by name too: a live holder's points are seen as held
    lease, busy = Claims(store, "s").acquire(["r3", "r4"])
    assert not busy and Claims(store, "s").held(["r3", "r4", "r5"]) == {"r3", "r4"}
    lease.release()


def test_manifest_entries(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    tables = store_make_chunk(["r1", "r2"], steps=5, depth=2)
    store.write_chunk("s", "c0", tables)
    store.write_chunk("s", "c1", store_make_chunk(["r3"]))
    first, second = store.manifest("s")
    assert (first["chunk_id"], first["run_ids"], first["n_runs"]) == ("c0", ["r1", "r2"], 2)
    assert second["chunk_id"] == "c1" and first["finished_at"] <= second["finished_at"]
    assert [f["table"] for f in first["files"]] == ["trajectories", "layers", "runs"]
    for f in first["files"]:
        path = tmp_path / f["path"]
        assert path.stat().st_size == f["bytes"]
        assert pq.read_metadata(path).num_rows == f["rows"] == tables[f["table"]].num_rows
    con = open_catalog(store)
    assert con.sql("SELECT sweep, chunk_id, n_runs FROM manifest ORDER BY chunk_id").fetchall() == [
        ("s", "c0", 2),
        ("s", "c1", 1),
    ]
    assert store.manifest("other") == []


def test_spec_round_trip_and_sweeps(tmp_path):
    store = Store.open(str(tmp_path))
    assert store.read_spec("quick") is None
    text = "name: quick\ngrid:\n  width: [16, 64]  # µ-P later\n"
    store.write_spec("quick", text)
    assert store.read_spec("quick") == text
    store.write_spec("quick", text + "\n")
    assert store.read_spec("quick") == text + "\n"
    assert store.sweeps() == ["quick"]
    with pytest.raises(ValueError, match="sweep name"):
        store.write_spec("Bad Name", text)


def test_compatible_types_are_cast(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    tables = store_make_chunk(["r1", "r2"])
    runs = tables["runs"]
    i = runs.column_names.index("init_scale")
    tables["runs"] = runs.set_column(i, "init_scale", pa.array([1, 3], pa.int32()))
    store.write_chunk("s", "c0", tables)
    got = open_catalog(store).sql("SELECT init_scale FROM runs ORDER BY run_id").fetchall()
    assert got == [(1.0,), (3.0,)]
    assert pq.read_schema(store.files("runs")[0]).field("init_scale").type == pa.float64()


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda t: {**t, "runs": t["runs"].drop_columns(["status"])},
            r"missing columns \['status'\]",
        ),
        (
            lambda t: {**t, "runs": t["runs"].append_column("sweep", pa.array(["s", "s"]))},
            "drop 'sweep'",
        ),
        (
            lambda t: {
                **t,
                "trajectories": t["trajectories"].set_column(
                    t["trajectories"].column_names.index("train_loss"),
                    "train_loss",
                    pa.array(["oops"] * t["trajectories"].num_rows),
                ),
            },
            r"trajectories\.train_loss: cannot store string as double",
        ),
        (
            lambda t: {**t, "runs": pa.concat_tables([t["runs"].slice(0, 1)] * 2)},
            "distinct",
        ),
        (lambda t: {**t, "runs": t["runs"].slice(0, 1)}, "trajectories: holds run_ids"),
        (lambda t: {**t, "runs": t["runs"].slice(0, 0)}, "non-empty 'runs'"),
        (lambda t: {k: v for k, v in t.items() if k != "runs"}, "non-empty 'runs'"),
        (lambda t: {**t, "summaries": t["runs"]}, "unknown chunk tables"),
    ],
)
def test_invalid_chunk_is_rejected_before_writing(tmp_path, store_make_chunk, mutate, message):
    store = Store.open(str(tmp_path))
    with pytest.raises(ValueError, match=message):
        store.write_chunk("s", "c0", mutate(store_make_chunk(["r1", "r2"])))
    assert _all_files(tmp_path) == []


def test_bad_names_are_rejected(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    with pytest.raises(ValueError, match="chunk_id"):
        store.write_chunk("s", "../evil", store_make_chunk(["r1"]))
    with pytest.raises(ValueError, match="sweep name"):
        store.write_chunk("../s", "c0", store_make_chunk(["r1"]))
    with pytest.raises(ValueError, match="unknown analysis table"):
        store.write_analysis("s", "runs", pa.table({}))
    assert _all_files(tmp_path) == []


def test_crash_inside_parquet_writer_leaves_nothing(tmp_path, store_make_chunk, monkeypatch):
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1"]))
    before = _all_files(tmp_path)

    def broken_write_table(table, sink, **kwargs):
        sink.write(b"PAR1 partial bytes")
        raise OSError("disk on fire")

    monkeypatch.setattr(parquet_mod.pq, "write_table", broken_write_table)
    with pytest.raises(OSError, match="disk on fire"):
        store.write_chunk("s", "c1", store_make_chunk(["r2"]))
    assert _all_files(tmp_path) == before
    monkeypatch.undo()
    assert store.done_run_ids("s") == {"r1"}
    assert _scalar(open_catalog(store), "SELECT count(*) FROM trajectories") == 3


def test_crash_after_partial_file_write_leaves_no_file(tmp_path, store_make_chunk, monkeypatch):
    """Bytes are in the temp file when the write dies: neither it nor a .parquet stays."""
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1"]))
    before = _all_files(tmp_path)
    seen_tmp = []
    real_fsync = os.fsync

    def failing_fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith(".tmp"):
            seen_tmp.append((os.path.basename(name), os.fstat(fd).st_size))
            raise OSError("I/O error")
        real_fsync(fd)

    monkeypatch.setattr(writer_mod.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="I/O error"):
        store.write_chunk("s", "c1", store_make_chunk(["r2"]))
    monkeypatch.undo()
    ((tmp_name, size),) = seen_tmp  # the first file (trajectories) died mid-write
    assert tmp_name.startswith(".part-c1-") and size > 0
    assert not tmp_name.endswith((".parquet", ".json"))
    assert _all_files(tmp_path) == before
    assert store.done_run_ids("s") == {"r1"}
    con = open_catalog(store)
    assert con.sql("SELECT DISTINCT run_id FROM trajectories").fetchall() == [("r1",)]


def test_crash_between_trajectories_and_runs(tmp_path, store_make_chunk, monkeypatch):
    store = Store.open(str(tmp_path))
    real_put = store_mod.put_atomic

    def put_until_runs(fs, path, data, **kwargs):
        if "/runs/" in path:
            raise KeyboardInterrupt  # the worker is killed before the commit
        real_put(fs, path, data, **kwargs)

    monkeypatch.setattr(store_mod, "put_atomic", put_until_runs)
    tables = store_make_chunk(["r1", "r2"], steps=4)
    with pytest.raises(KeyboardInterrupt):
        store.write_chunk("s", "c0", tables)
    monkeypatch.undo()
    assert len(store.files("trajectories", "s")) == 1 and len(store.files("layers", "s")) == 1
    assert store.files("runs", "s") == [] and store.manifest("s") == []
    assert store.done_run_ids("s") == set()
    con = open_catalog(store)
    for view in ("runs", "trajectories", "layers"):
        assert _scalar(con, f"SELECT count(*) FROM {view}") == 0

    store.write_chunk("s", "c0", tables)  # the retried attempt
    assert len(store.files("trajectories", "s")) == 2  # orphan rows still on disk...
    assert store.done_run_ids("s") == {"r1", "r2"}
    con = open_catalog(store)
    got = con.sql(
        "SELECT run_id, count(*), count(DISTINCT step), count(DISTINCT attempt) "
        "FROM trajectories GROUP BY run_id ORDER BY run_id"
    ).fetchall()
    assert got == [("r1", 4, 4, 1), ("r2", 4, 4, 1)]  # ...but exactly one copy is visible
    assert _scalar(con, "SELECT count(*) FROM layers") == tables["layers"].num_rows
    (attempt,) = con.sql("SELECT DISTINCT attempt FROM runs").fetchall()[0]
    assert con.sql("SELECT DISTINCT attempt FROM layers").fetchall() == [(attempt,)]


def test_duplicate_commit_shows_earliest_attempt(tmp_path, store_make_chunk):
    """Defensive: if a run is committed twice anyway, the catalog shows one consistent copy."""
    store = Store.open(str(tmp_path))
    early = datetime(2026, 1, 1, tzinfo=timezone.utc)
    late = datetime(2026, 1, 2, tzinfo=timezone.utc)
    store.write_chunk("s", "c1", store_make_chunk(["r1", "r2"], seed=2, finished_at=late))
    first = store_make_chunk(["r1"], seed=1, finished_at=early)
    store.write_chunk("s", "c0", first)
    con = open_catalog(store)
    rows = con.sql("SELECT run_id, chunk_id FROM runs ORDER BY run_id").fetchall()
    assert rows == [("r1", "c0"), ("r2", "c1")]
    got = con.sql("SELECT train_loss FROM trajectories WHERE run_id = 'r1' ORDER BY step")
    assert [r[0] for r in got.fetchall()] == first["trajectories"].column("train_loss").to_pylist()


def test_failed_run_is_not_done_and_a_later_success_wins(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    early = datetime(2026, 1, 1, tzinfo=timezone.utc)
    failed = store_make_chunk(["r1", "r2"], finished_at=early)["runs"]
    failed = failed.set_column(
        failed.column_names.index("status"), "status", pa.array(["failed"] * 2)
    )
    store.write_chunk("s", "c0", {"runs": failed})
    store.write_chunk("s", "c1", store_make_chunk(["r3"]))
    assert store.done_run_ids("s") == {"r3"}
    con = open_catalog(store)
    assert con.sql("SELECT run_id, status FROM runs ORDER BY run_id").fetchall() == [
        ("r1", "failed"),
        ("r2", "failed"),
        ("r3", "completed"),
    ]

    retry = store_make_chunk(["r1"], seed=5)  # the relaunch completes it
    store.write_chunk("s", "c0", retry)
    assert store.done_run_ids("s") == {"r1", "r3"}
    con = open_catalog(store)
    assert con.sql("SELECT run_id, status FROM runs ORDER BY run_id").fetchall() == [
        ("r1", "completed"),
        ("r2", "failed"),
        ("r3", "completed"),
    ]
    got = con.sql("SELECT train_loss FROM trajectories WHERE run_id = 'r1' ORDER BY step")
    assert [r[0] for r in got.fetchall()] == retry["trajectories"].column("train_loss").to_pylist()


def test_write_analysis_replaces_partition(
    tmp_path, store_make_table, store_make_chunk, store_current
):
    store = Store.open(str(tmp_path))
    for sweep in ("s", "t"):  # the runs the summaries are of (the view shows current ones)
        store.write_chunk(sweep, "c0", store_make_chunk(["r1", "r2"]))
    old = store_make_table(schema.SUMMARIES, 2, run_id=["r1", "r2"], regime=["lazy", "rich"])
    store.write_analysis("s", "summaries", store_current(store, "s", old))
    store.write_analysis("t", "summaries", store_current(store, "t", old.slice(0, 1)))
    new = store_make_table(schema.SUMMARIES, 1, seed=1, run_id=["r2"], regime=["diverged"])
    store.write_analysis("s", "summaries", store_current(store, "s", new))
    con = open_catalog(store)
    got = con.sql("SELECT sweep, run_id, regime, escape_time FROM summaries ORDER BY sweep")
    assert got.fetchall() == [
        ("s", "r2", "diverged", new.column("escape_time")[0].as_py()),
        ("t", "r1", "lazy", old.column("escape_time")[0].as_py()),
    ]
    assert len(store.files("summaries", "s")) == 1
    store.write_analysis("s", "summaries", old.slice(0, 0))
    con = open_catalog(store)
    assert con.sql("SELECT sweep FROM summaries").fetchall() == [("t",)]
    assert _all_files(tmp_path / "summaries") == ["sweep=s/data.parquet", "sweep=t/data.parquet"]


def test_concurrent_writers_same_sweep(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    chunks = {f"c{i}": [f"r{i}_{j}" for j in range(3)] for i in range(16)}
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda item: store.write_chunk("s", item[0], store_make_chunk(item[1])),
                chunks.items(),
            )
        )
    expected = {r for ids in chunks.values() for r in ids}
    assert store.done_run_ids("s") == expected
    assert len(store.manifest("s")) == 16
    con = open_catalog(store)
    assert _scalar(con, "SELECT count(*) FROM trajectories") == 3 * len(expected)
    assert not [f for f in _all_files(tmp_path) if f.endswith(".tmp")]


@pytest.mark.parametrize(
    "link",
    ["trajectories", "trajectories/sweep=s", "specs", "manifest/sweep=s"],
)
def test_writes_refuse_directory_links_out_of_the_store(tmp_path, store_make_chunk, link):
    """A directory of the store replaced by a symbolic link to a folder outside it."""
    root, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    (root / link).symlink_to(outside, target_is_directory=True)
    store = Store.open(str(root))
    with pytest.raises(UnsafePathError, match="symbolic link"):
        store.write_chunk("s", "c0", store_make_chunk(["r1"]))
        store.write_spec("s", "name: s\n")
    assert os.listdir(outside) == []


def test_writes_refuse_a_target_link_out_of_the_store(tmp_path):
    root, victim = tmp_path / "store", tmp_path / "victim.txt"
    victim.write_text("precious")
    (root / "specs").mkdir(parents=True)
    (root / "specs" / "s.yaml").symlink_to(victim)
    with pytest.raises(UnsafePathError, match="victim.txt"):
        Store.open(str(root)).write_spec("s", "name: s\n")
    assert victim.read_text() == "precious" and os.path.islink(root / "specs" / "s.yaml")


def test_links_inside_the_store_and_a_linked_root_are_fine(tmp_path, store_make_chunk):
    real = tmp_path / "disk" / "results"
    real.mkdir(parents=True)
    (real / "layers-on-other-folder").mkdir()
    (real / "layers").symlink_to(real / "layers-on-other-folder", target_is_directory=True)
    (tmp_path / "results").symlink_to(real, target_is_directory=True)  # the user's choice
    store = Store.open(str(tmp_path / "results"))
    store.write_chunk("s", "c0", store_make_chunk(["r1"]))
    assert store.done_run_ids("s") == {"r1"}
    assert len(os.listdir(real / "layers-on-other-folder" / "sweep=s")) == 1


def test_safe_output_path(tmp_path):
    out, outside = tmp_path / "figs", tmp_path / "outside"
    outside.mkdir()
    path = safe_output_path(out, "sweep/phase.png")
    assert path == str(out / "sweep" / "phase.png") and (out / "sweep").is_dir()
    put_atomic(LocalFileSystem(), path, b"png", root=str(out))
    assert (out / "sweep" / "phase.png").read_bytes() == b"png"
    for bad in ("../x.png", "/etc/x.png", "a/../../x.png", ""):
        with pytest.raises(UnsafePathError, match="relative path"):
            safe_output_path(out, bad)
    (out / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        safe_output_path(out, "linked/phase.png")
    (outside / "victim").write_text("precious")
    (out / "sweep" / "loss.svg").symlink_to(outside / "victim")
    with pytest.raises(UnsafePathError):
        safe_output_path(out, "sweep/loss.svg")
    with pytest.raises(UnsafePathError):
        put_atomic(LocalFileSystem(), str(out / "sweep" / "loss.svg"), b"x", root=str(out))
    assert (outside / "victim").read_text() == "precious" and os.listdir(outside) == ["victim"]


def test_error_messages_keep_whole_sentences():
    """A report line keeps an error message's whole sentences: all of it when it fits,
    else the sentences that fit (the first alone when it is longer), never half of one."""
    from phasesweep.storage._store import sentences

    two = "Magic bytes not found in footer.\n  Either the file is corrupted or not Parquet."
    assert (
        sentences(two)
        == "Magic bytes not found in footer. Either the file is corrupted or not Parquet."
    )
    assert sentences(two, limit=40) == "Magic bytes not found in footer. …"
    long = "x" * 50 + " ends here. Then more."
    assert sentences(long, limit=20) == "x" * 50 + " ends here. …"
    assert sentences("no full stop at all " * 5, limit=10) == ("no full stop at all " * 5).strip()
