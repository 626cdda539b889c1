"""The store on S3, against a moto server on the loopback interface."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from moto.server import ThreadedMotoServer
from phasesweep.storage import (
    DamagedFileWarning,
    Store,
    compact,
    open_catalog,
    run_query,
    verify,
)
from phasesweep.storage import _store as store_mod


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """Endpoint URL of a moto S3 server on 127.0.0.1 (a free port), stopped afterwards."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_store(s3_server, monkeypatch, request) -> Store:
    """An empty store at ``s3://<fresh bucket>/results`` on the moto server."""
    monkeypatch.setenv("PHASESWEEP_S3_ENDPOINT", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    bucket = request.node.name.replace("_", "-").lower()[:60]
    store = Store.open(f"s3://{bucket}/results/")
    store.fs.mkdir(bucket)
    return store


def test_s3_round_trip(s3_store, store_make_chunk):
    assert s3_store.uri.startswith("s3://") and s3_store.uri.endswith("/results")
    assert s3_store.sweeps() == [] and s3_store.done_run_ids("s") == set()
    con = open_catalog(s3_store)
    assert con.sql("SELECT count(*) FROM trajectories").fetchall() == [(0,)]

    tables = store_make_chunk(["r1", "r2"], steps=4)
    s3_store.write_chunk("s", "c0", tables)
    s3_store.write_chunk("other", "c0", store_make_chunk(["x1"], seed=1))
    s3_store.write_spec("s", "name: s\n")
    assert s3_store.done_run_ids("s") == {"r1", "r2"}
    assert s3_store.sweeps() == ["other", "s"]
    assert s3_store.read_spec("s") == "name: s\n"
    (entry,) = s3_store.manifest("s")
    assert entry["run_ids"] == ["r1", "r2"]
    assert [f["path"].split("/")[0] for f in entry["files"]] == ["trajectories", "layers", "runs"]

    con = open_catalog(s3_store)  # DuckDB reads s3:// through the registered s3fs
    got = con.sql("SELECT sweep, run_id, step, train_loss FROM trajectories ORDER BY ALL")
    rows = [r for r in got.fetchall() if r[0] == "s"]
    assert [r[1:3] for r in rows] == [(r, s) for r in ("r1", "r2") for s in range(4)]
    assert [r[3] for r in rows] == tables["trajectories"].column("train_loss").to_pylist()
    assert con.sql("SELECT sweep, count(*) FROM layers GROUP BY ALL ORDER BY 1").fetchall() == [
        ("other", 6),
        ("s", 16),
    ]

    got = run_query(s3_store.uri, "SELECT sweep, count(*) AS n FROM runs GROUP BY ALL ORDER BY 1")
    assert got == (["sweep", "n"], [("other", 1), ("s", 2)])


def test_s3_uncommitted_attempt_is_invisible(s3_store, store_make_chunk, monkeypatch):
    real_put = store_mod.put_atomic

    def put_until_runs(fs, path, data, **kwargs):
        if "/runs/" in path:
            raise ConnectionError("worker lost")
        real_put(fs, path, data, **kwargs)

    tables = store_make_chunk(["r1"], steps=3)
    monkeypatch.setattr(store_mod, "put_atomic", put_until_runs)
    with pytest.raises(ConnectionError):
        s3_store.write_chunk("s", "c0", tables)
    monkeypatch.undo()
    assert len(s3_store.files("trajectories", "s")) == 1
    assert s3_store.done_run_ids("s") == set()
    s3_store.write_chunk("s", "c0", tables)
    con = open_catalog(s3_store)
    assert con.sql("SELECT count(*) FROM trajectories").fetchall() == [(3,)]
    assert run_query(s3_store, "SELECT count(*) AS n FROM trajectories") == (["n"], [(3,)])


def test_s3_write_analysis_replaces(s3_store, store_make_table, store_make_chunk, store_current):
    from phasesweep.storage import schema

    # the runs of the plateaus, with current summaries: the view shows their plateaus
    s3_store.write_chunk("s", "c0", store_make_chunk(["a", "b", "c"]))
    summaries = store_make_table(schema.SUMMARIES, 3, run_id=["a", "b", "c"])
    s3_store.write_analysis("s", "summaries", store_current(s3_store, "s", summaries))
    first = store_make_table(schema.PLATEAUS, 3, run_id=["a", "a", "b"])
    second = store_make_table(schema.PLATEAUS, 1, seed=1, run_id=["c"])
    s3_store.write_analysis("s", "plateaus", first)
    s3_store.write_analysis("s", "plateaus", second)
    assert run_query(s3_store, "SELECT run_id FROM plateaus") == (["run_id"], [("c",)])
    assert len(s3_store.files("plateaus")) == 1


@pytest.mark.ray
def test_cli_sweep_into_s3_store_and_resume(s3_store, tiny_spec, phasesweep_cli):
    """`phasesweep run --store s3://…` end to end: Ray trials write straight to the object store."""
    spec = tiny_spec(
        {
            "name": "ons3",
            "train.steps": 30,
            "train.log_points": 6,
            "execution.max_chunk_size": 1024,  # the default: chunks as the CPUs ask
            "grid.seed": [0, 1],
        }
    )
    args = ["run", str(spec), "--store", s3_store.uri, "--no-progress"]
    first = phasesweep_cli(args)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert run_query(s3_store, "SELECT status, count(*) FROM runs GROUP BY ALL")[1] == [
        ("completed", 4)
    ]
    assert run_query(s3_store, "SELECT count(*) FROM trajectories")[1] == [(4 * 6,)]
    again = phasesweep_cli(args)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0 and "skipping 4 already stored; training 0" in err
    assert s3_store.read_spec("ons3") is not None


def test_s3_damaged_object_is_skipped_then_repaired(s3_store, store_make_chunk):
    s3_store.write_chunk("s", "c0", store_make_chunk(["r1"], steps=3))
    s3_store.write_chunk("s", "c1", store_make_chunk(["r2"], steps=3, seed=1))
    s3_store.write_chunk("t", "c0", store_make_chunk(["x1"], steps=3, seed=2))
    (bad,) = [p for p in s3_store.files("runs", "s") if "/part-c1-" in p]
    s3_store.fs.pipe_file(bad, s3_store.fs.cat_file(bad)[:-20])  # a truncated object
    with pytest.warns(DamagedFileWarning, match="part-c1-"):
        assert s3_store.done_run_ids("s") == {"r1"}
    assert [d.path for d in s3_store.damaged_files()] == [bad]
    with pytest.warns(DamagedFileWarning):
        assert run_query(s3_store, "SELECT sweep, count(*) FROM runs GROUP BY ALL ORDER BY 1")[
            1
        ] == [("s", 1), ("t", 1)]

    report = verify(s3_store, "s", repair=True, min_age_s=0)
    assert any("unreadable file" in p for p in report.problems)
    assert s3_store.fs.exists(f"{s3_store.root}/quarantine/{s3_store.relative(bad)}")
    assert s3_store.damaged_files() == [] and verify(s3_store, min_age_s=0).ok
    assert len(s3_store.files("trajectories", "s")) == 1  # c1's rows: orphans, dropped


def test_s3_compact_keeps_answers(s3_store, store_make_chunk):
    for c in range(4):
        s3_store.write_chunk("s", f"c{c}", store_make_chunk([f"r{c}"], steps=3, seed=c))
    sql = "SELECT * EXCLUDE (attempt) FROM {} ORDER BY ALL"
    before = [run_query(s3_store, sql.format(t))[1] for t in ("runs", "trajectories", "layers")]
    assert compact(s3_store, "s").actions
    assert [len(s3_store.files(t, "s")) for t in ("runs", "trajectories", "layers")] == [1, 1, 1]
    after = [run_query(s3_store, sql.format(t))[1] for t in ("runs", "trajectories", "layers")]
    assert after == before and verify(s3_store, min_age_s=0).ok
