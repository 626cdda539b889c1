"""A damaged store: readers skip and report; ``verify``/``--repair`` and ``compact`` (real files)."""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from phasesweep.storage import (
    DamagedFileWarning,
    Store,
    compact,
    open_catalog,
    run_query,
    schema,
    verify,
)
from phasesweep.storage import _store as store_mod


def _fill(store: Store, make) -> dict[str, set[str]]:
    """Two sweeps of three chunks each; returns the run ids per sweep."""
    ids = {}
    for k, sweep in enumerate(("a", "b")):
        ids[sweep] = set()
        for c in range(3):
            run_ids = [f"{sweep}{c}_{j}" for j in range(2)]
            store.write_chunk(sweep, f"c{c}", make(run_ids, steps=4, seed=10 * k + c))
            ids[sweep].update(run_ids)
    return ids


def _file_of(store: Store, table: str, sweep: str, chunk: str) -> str:
    (path,) = [p for p in store.files(table, sweep) if f"/part-{chunk}-" in p]
    return path


def _truncate(path: str, keep: float = 0.5) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep))


def _entry_of(store: Store, sweep: str, chunk: str) -> str:
    (path,) = [p for p in store.manifest_paths(sweep) if os.path.basename(p).startswith(chunk)]
    return path


def _age_all(root) -> None:
    """Make every file look two hours old (orphans are only dropped past a minimum age)."""
    old = datetime.now().timestamp() - 7200
    for d, _, files in os.walk(root):
        for f in files:
            os.utime(os.path.join(d, f), (old, old))


def _damage(store: Store) -> dict[str, str]:
    """Zero-byte runs file (a/c1), truncated trajectories (a/c2) and manifest entry (b/c0)."""
    paths = {
        "zero": _file_of(store, "runs", "a", "c1"),
        "truncated": _file_of(store, "trajectories", "a", "c2"),
        "entry": _entry_of(store, "b", "c0"),
    }
    open(paths["zero"], "wb").close()
    _truncate(paths["truncated"])
    _truncate(paths["entry"], 0.3)
    return paths


def test_readers_skip_and_report_damaged_files(tmp_path, store_make_chunk, phasesweep_cli):
    store = Store.open(str(tmp_path))
    ids = _fill(store, store_make_chunk)
    bad = _damage(store)

    assert sorted(d.path for d in store.damaged_files()) == sorted(bad.values())
    assert [d.path for d in store.damaged_files("b")] == [bad["entry"]]
    with pytest.warns(DamagedFileWarning, match="sweep=a/part-c1-"):
        assert store.done_run_ids("a") == ids["a"] - {"a1_0", "a1_1"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sweep b's data files are whole: no warning
        assert store.done_run_ids("b") == ids["b"]
    with pytest.warns(DamagedFileWarning, match="manifest unreadable|entry unreadable"):
        assert [e["chunk_id"] for e in store.manifest("b")] == ["c1", "c2"]

    with pytest.warns(DamagedFileWarning) as seen:
        con = open_catalog(store)
    assert {p for p in bad.values() if any(p in str(w.message) for w in seen)} == set(bad.values())
    got = con.sql("SELECT sweep, count(*) FROM runs GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [("a", 4), ("b", 6)]
    got = con.sql("SELECT sweep, count(*) FROM trajectories GROUP BY ALL ORDER BY 1").fetchall()
    assert got == [("a", 4 * 2), ("b", 6 * 4)]  # a/c1 uncommitted, a/c2 trajectories lost
    assert con.sql("SELECT count(*) FROM layers WHERE sweep = 'b'").fetchall() == [(6 * 4 * 2,)]
    with pytest.warns(DamagedFileWarning):
        assert run_query(store, "SELECT count(*) AS n FROM runs")[1] == [(10,)]


def _cli(phasesweep_cli, *args: str) -> tuple[int, str, str]:
    proc = phasesweep_cli(list(args))
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def test_status_and_query_say_what_damage_leaves_out_in_one_line(
    tmp_path, store_make_chunk, phasesweep_cli
):
    """What the user sees: one line on stderr naming the files and the fix, no Python
    warning; status exits 1; a query that reads a damaged table gives no answer (exit 1)
    unless --allow-partial; one that does not read it answers as usual."""
    store = Store.open(str(tmp_path))
    _fill(store, store_make_chunk)
    bad = _damage(store)  # runs of a, trajectories of a, a manifest entry of b
    at = ["--store", str(tmp_path)]

    def one_line(err: str, *paths: str) -> None:
        assert len(err.splitlines()) == 1, err
        assert "Warning" not in err and "Traceback" not in err, err
        assert all(p in err for p in paths) and "phasesweep verify --repair" in err, err

    code, out, err = _cli(phasesweep_cli, "status", *at)
    assert code == 1 and "completed" in out
    one_line(err, *bad.values())
    code, out, err = _cli(phasesweep_cli, "status", "b", *at)
    assert code == 1 and re.search(r"b\s+completed\s+6\n", out)  # b's runs files are whole
    one_line(err, bad["entry"])

    sql = "SELECT sweep, count(*) AS n FROM trajectories GROUP BY ALL ORDER BY 1"
    code, out, err = _cli(phasesweep_cli, "query", sql, *at)
    assert code == 1 and out == ""
    one_line(err, bad["zero"], bad["truncated"])  # trajectories shows committed runs only
    assert "--allow-partial" in err and bad["entry"] not in err
    code, out, err = _cli(phasesweep_cli, "query", sql, *at, "--allow-partial", "--format", "csv")
    assert code == 0 and out.splitlines() == ["sweep,n", "a,8", "b,24"]
    one_line(err, bad["zero"], bad["truncated"])
    code, out, err = _cli(phasesweep_cli, "query", "SELECT count(*) FROM manifest", *at)
    assert code == 1 and out == ""
    one_line(err, bad["entry"])
    # summaries shows the rows of stored runs (it reads runs, damaged); scaling_fits does not
    code, out, err = _cli(phasesweep_cli, "query", "SELECT count(*) FROM summaries", *at)
    assert code == 1 and out == ""
    one_line(err, bad["zero"])
    code, out, err = _cli(phasesweep_cli, "query", "SELECT count(*) FROM scaling_fits", *at)
    assert code == 0 and err == "" and out.split()[-3:] == ["0", "(1", "row)"]


#: Queries whose answers hold no row of sweep ``a``: DuckDB's plan prunes its partitions.
_NOT_OF_A = [
    "SELECT count(*) AS n FROM trajectories WHERE sweep = 'b'",
    "SELECT count(*) AS n FROM trajectories WHERE sweep <> 'a'",
    "SELECT count(*) AS n FROM layers l JOIN runs r USING (sweep, run_id) WHERE r.sweep = 'b'",
    "SELECT count(*) AS n FROM runs WHERE sweep = 'b'",
]
#: Queries whose answers hold rows of sweep ``a``'s trajectories.
_OF_A = [
    "SELECT count(*) AS n FROM trajectories WHERE sweep = 'a'",
    "SELECT sweep, count(*) AS n FROM trajectories GROUP BY ALL ORDER BY ALL",
]


@pytest.mark.parametrize("table", ["trajectories", "runs"])
def test_a_damaged_file_blocks_only_the_answers_it_is_part_of(
    tmp_path, store_make_chunk, capsys, table
):
    """One file of sweep ``a`` damaged (its trajectories, or its runs: the commit of its
    trajectories): a query whose filters leave sweep ``a`` out answers exactly what the
    whole store answered, exit 0 and nothing on stderr; one that reads it refuses (exit 1,
    naming the file) and ``--allow-partial`` answers from the rest, saying so."""
    from phasesweep._cli import main

    store = Store.open(str(tmp_path))
    _fill(store, store_make_chunk)
    whole = {sql: run_query(store, sql)[1] for sql in _NOT_OF_A + _OF_A}
    damaged = _file_of(store, table, "a", "c2")
    _truncate(damaged)
    at = ["--store", str(tmp_path), "--format", "json"]

    def rows(out: str) -> list[tuple]:
        return [tuple(r.values()) for r in json.loads(out)]

    for sql in _NOT_OF_A:
        assert main(["query", sql, *at]) == 0, sql
        out, err = capsys.readouterr()
        assert err == "" and rows(out) == whole[sql], (sql, err)
    for sql in _OF_A:
        assert main(["query", sql, *at]) == 1, sql
        out, err = capsys.readouterr()
        assert out == "" and damaged in err and "--allow-partial" in err, (sql, err)
        assert main(["query", sql, *at, "--allow-partial"]) == 0, sql
        out, err = capsys.readouterr()
        with pytest.warns(DamagedFileWarning):
            partial = run_query(store, sql)[1]
        assert rows(out) == partial != whole[sql] and "a partial answer" in err, (sql, err)
    # runs is not read by a query of trajectories' sweep b alone, and is by one of runs
    sql = "SELECT count(*) AS n FROM runs"
    assert main(["query", sql, *at]) == (1 if table == "runs" else 0)
    capsys.readouterr()


def test_verify_clean_store(tmp_path, store_make_chunk, phasesweep_cli):
    store = Store.open(str(tmp_path))
    _fill(store, store_make_chunk)
    report = verify(store, min_age_s=0)
    assert report.ok and report.problems == [] and report.actions == []
    proc = phasesweep_cli(["verify", "--store", str(tmp_path)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert out.startswith("ok")
    proc = phasesweep_cli(["verify", "Bad Name", "--store", str(tmp_path)])
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "SWEEP" in err and "Traceback" not in err


def test_verify_and_compact_of_an_unknown_sweep_or_store_exit_2(
    tmp_path, store_make_chunk, phasesweep_cli
):
    store = Store.open(str(tmp_path / "store"))
    _fill(store, store_make_chunk)
    before = sorted(p for p in tmp_path.rglob("*"))
    for command in ("verify", "compact"):
        proc = phasesweep_cli([command, "nope", "--store", store.root])
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (out, err)
        assert "no sweep 'nope'" in err and "it holds: a, b" in err and len(err.splitlines()) == 1
        proc = phasesweep_cli([command, "--store", str(tmp_path / "typo")])
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and "no store there" in err, err
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written


def _orphan_and_leftovers(store: Store, make, monkeypatch) -> None:
    """In sweep b: an attempt killed before its commit, a writer's temp file, a lost entry."""
    real_put = store_mod.put_atomic

    def put_until_runs(fs, path, data, root=None):
        if "/runs/" in path:
            raise ConnectionError("worker lost")
        real_put(fs, path, data, root=root)

    monkeypatch.setattr(store_mod, "put_atomic", put_until_runs)
    with pytest.raises(ConnectionError):
        store.write_chunk("b", "c9", make(["b9_0"], steps=4, seed=99))
    monkeypatch.undo()
    tmp = f"{store.root}/layers/sweep=b/.part-c8-0123456789ab.parquet.1a2b3c4d.tmp"
    with open(tmp, "wb") as f:
        f.write(b"PAR1 half")
    os.unlink(_entry_of(store, "b", "c2"))


def test_verify_lists_problems_and_repair_fixes_them(
    tmp_path, store_make_chunk, monkeypatch, phasesweep_cli
):
    store = Store.open(str(tmp_path))
    ids = _fill(store, store_make_chunk)
    bad = _damage(store)
    _orphan_and_leftovers(store, store_make_chunk, monkeypatch)
    # a duplicate commit of one run of sweep b
    store.write_chunk("b", "c7", store_make_chunk(["b0_0"], steps=4, seed=7))

    fresh = verify(store)  # everything is new: orphans and temp files may be writes under way
    assert not any("orphan" in p or "temp file" in p for p in fresh.problems)
    _age_all(tmp_path)

    proc = phasesweep_cli(["verify", "--store", str(tmp_path)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    expect = [
        ("a", "unreadable file", bad["zero"]),
        ("a", "unreadable file", bad["truncated"]),
        ("a", "no committed runs file", "manifest/sweep=a/c1-"),  # its runs file is unreadable
        ("a", "orphan file", "trajectories/sweep=a/part-c1-"),  # ... so its rows are orphans
        ("a", "orphan file", "layers/sweep=a/part-c1-"),
        ("a", "disagrees with its manifest entry", "runs/sweep=a/part-c2-"),  # trajectories lost
        ("a", "completed run a2_0 has no trajectories rows", ""),
        ("b", "damaged manifest entry", bad["entry"]),
        ("b", "has no manifest entry", "runs/sweep=b/part-c0-"),
        ("b", "has no manifest entry", "runs/sweep=b/part-c2-"),
        ("b", "orphan file", "trajectories/sweep=b/part-c9-"),
        ("b", "orphan file", "layers/sweep=b/part-c9-"),
        ("b", "leftover temp file", "layers/sweep=b/.part-c8-"),
        ("b", "run b0_0 has 2 committed rows", ""),
    ]
    for sweep, what, where in expect:
        rel = os.path.relpath(where, tmp_path) if where.startswith("/") else where
        hits = [p for p in problems if p.startswith(f"problem: {sweep}: ") and what in p]
        assert [p for p in hits if rel in p], (what, rel, problems)
    assert len(problems) == len(expect) + 1, "\n".join(problems)  # a2_1 lost its rows too
    # the reader's message is kept whole: no line ends mid-sentence
    (unreadable,) = [p for p in problems if "unreadable file" in p and "part-c2-" in p]
    assert unreadable.endswith("Either the file is corrupted or this is not a parquet file.")

    report = verify(store, repair=True)
    assert len(report.problems) == len(problems) and report.actions
    # what the repair leaves is what a verify then finds: the duplicate only
    assert report.left == ["b: run b0_0 has 2 committed rows that are not 'failed'"]
    assert not report.ok
    quarantined = sorted(
        os.path.relpath(os.path.join(d, f), tmp_path / "quarantine")
        for d, _, fs in os.walk(tmp_path / "quarantine")
        for f in fs
    )
    lost_attempt = os.path.basename(bad["truncated"]).removeprefix("part-c2-")
    assert quarantined == sorted(
        [
            os.path.relpath(bad["zero"], tmp_path),
            os.path.relpath(bad["truncated"], tmp_path),
            os.path.relpath(bad["entry"], tmp_path),
            _entry_path_a_c1(report),
            # a/c2 lost its trajectories: the whole attempt goes, so its runs are not done
            f"runs/sweep=a/part-c2-{lost_attempt}",
            f"layers/sweep=a/part-c2-{lost_attempt}",
            f"manifest/sweep=a/c2-{lost_attempt.removesuffix('.parquet')}.json",
        ]
    )
    assert not [f for d, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]
    assert [p for p in store.files("trajectories", "b") if "/part-c9-" in p] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing damaged is read any more
        con = open_catalog(store)
        assert store.damaged_files() == []
        entries = {e["chunk_id"] for e in store.manifest("b")}
    assert entries == {"c0", "c1", "c2", "c7"}
    assert con.sql("SELECT count(*) FROM runs WHERE sweep = 'b'").fetchall() == [(6,)]
    assert store.done_run_ids("b") == ids["b"]
    # a relaunch trains again exactly the runs whose rows were lost
    assert store.done_run_ids("a") == ids["a"] - {"a1_0", "a1_1", "a2_0", "a2_1"}

    # what is left cannot be repaired: the duplicate
    left = verify(store, repair=True)
    assert left.problems == left.left == ["b: run b0_0 has 2 committed rows that are not 'failed'"]
    assert left.actions == []  # repairing again changes nothing
    proc = phasesweep_cli(["verify", "b", "--store", str(tmp_path), "--repair"])
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1 and not [x for x in out.splitlines() if x.startswith("repaired")]
    assert "not repaired: b: run b0_0 has 2 committed rows" in out and "ok:" not in out


def _entry_path_a_c1(report) -> str:
    """The quarantined manifest entry of a/c1, as named in the repair report."""
    (line,) = [a for a in report.actions if "quarantined quarantine/manifest/sweep=a/c1-" in a]
    return line.split("quarantined quarantine/", 1)[1]


#: Queries whose answers compaction must not change (every column but ``attempt``); exact
#: aggregates only, as a float sum depends on the order DuckDB's threads meet the rows.
QUERIES = [
    "SELECT * EXCLUDE (attempt) FROM runs ORDER BY ALL",
    "SELECT * EXCLUDE (attempt) FROM trajectories ORDER BY ALL",
    "SELECT * EXCLUDE (attempt) FROM layers ORDER BY ALL",
    "SELECT sweep, status, count(*), min(final_train_loss), max(wall_seconds) FROM runs "
    "GROUP BY ALL ORDER BY ALL",
    "SELECT r.run_id, r.init_scale, list(t.train_loss ORDER BY t.step), count(*) FROM runs r "
    "JOIN trajectories t USING (sweep, run_id) GROUP BY ALL ORDER BY ALL",
    "SELECT l.sweep, l.layer, max(l.fro_norm), count(*) FROM layers l "
    "JOIN runs r USING (sweep, run_id) WHERE r.status = 'completed' GROUP BY ALL ORDER BY ALL",
    "SELECT * FROM summaries ORDER BY ALL",
]


def _answers(store: Store) -> list[list[tuple]]:
    con = open_catalog(store)
    return [con.sql(q).fetchall() for q in QUERIES]


def _messy_store(store: Store, make, make_table, monkeypatch) -> None:
    """Sweep a: failed runs retried, a duplicate commit, an uncommitted attempt, summaries;
    sweep b: one chunk."""
    early = datetime(2026, 1, 1, tzinfo=timezone.utc)
    failed = make(["a0", "a1"], finished_at=early)["runs"]
    status = failed.column_names.index("status")
    store.write_chunk(
        "a", "c0", {"runs": failed.set_column(status, "status", pa.array(["failed"] * 2))}
    )
    for c in range(1, 6):
        store.write_chunk("a", f"c{c}", make([f"a{c}_0", f"a{c}_1"], steps=5, seed=c))
    store.write_chunk("a", "c0", make(["a0"], steps=5, seed=40))  # a0 retried, a1 stays failed
    store.write_chunk("a", "c6", make(["a3_0"], steps=5, seed=41))  # a duplicate commit
    real_put = store_mod.put_atomic

    def put_until_runs(fs, path, data, root=None):
        if "/runs/" in path:
            raise ConnectionError("worker lost")
        real_put(fs, path, data, root=root)

    monkeypatch.setattr(store_mod, "put_atomic", put_until_runs)
    with pytest.raises(ConnectionError):
        store.write_chunk("a", "c7", make(["a7"], steps=5, seed=42))
    monkeypatch.undo()
    store.write_chunk("b", "c0", make(["b0"], steps=3, seed=50))
    store.write_analysis("a", "summaries", make_table(schema.SUMMARIES, 3, seed=51))


def test_compact_keeps_every_answer(tmp_path, store_make_chunk, store_make_table, monkeypatch):
    store = Store.open(str(tmp_path))
    _messy_store(store, store_make_chunk, store_make_table, monkeypatch)
    before = _answers(store)
    assert len(before[0]) == 13 and len(before[1]) == 11 * 5 + 3  # a1 failed: no rows
    orphans = [
        p for t in ("trajectories", "layers") for p in store.files(t, "a") if "/part-c7-" in p
    ]
    assert len(orphans) == 2

    report = compact(store, "a", rows_per_file=5)
    assert report.actions and _answers(store) == before
    # raw files: one row per run (the one the view showed), no old chunk file left
    runs = pa.concat_tables(pq.read_table(p) for p in store.files("runs", "a"))
    assert sorted(runs.column("run_id").to_pylist()) == sorted(
        r[1] for r in before[0] if r[0] == "a"
    )
    assert len(set(runs.column("attempt").to_pylist())) == 1
    (attempt,) = set(runs.column("attempt").to_pylist())
    traj = pa.concat_tables(
        pq.read_table(p) for p in store.files("trajectories", "a") if p not in orphans
    )
    assert traj.num_rows == 11 * 5 and set(traj.column("attempt").to_pylist()) == {attempt}
    assert len(store.files("trajectories", "a")) == 11 + 1  # 55 rows in files of 5, orphan
    assert len(store.files("layers", "a")) == 22 + 1  # 110 rows
    assert len(store.files("runs", "a")) == 3  # 12 runs, one commit in 3 files
    assert [p for p in store.files("runs", "a") if "/part-" in p] == []
    assert all(p in store.files(t, "a") for t, p in zip(("trajectories", "layers"), orphans))
    assert store.files("runs", "b") and len(store.files("runs", "b")) == 1  # other sweep untouched
    (entry,) = store.manifest("a")
    assert entry["attempt"] == attempt and entry["n_runs"] == 12
    assert {f["path"] for f in entry["files"]} == {
        store.relative(p)
        for t in schema.CHUNK_TABLES
        for p in store.files(t, "a")
        if p not in orphans
    }

    assert verify(store, "a", min_age_s=0).problems == [
        f"a: orphan file {store.relative(p)} (no committed runs file)" for p in orphans
    ]
    again = compact(store, rows_per_file=10**6)  # every sweep: a merges its files, b has one
    assert _answers(store) == before
    assert [len(store.files(t, "a")) for t in ("trajectories", "layers", "runs")] == [
        2,
        2,
        1,
    ]  # the orphans stay
    assert len(again.actions) == 1 and compact(store).actions == []  # then nothing to do
    report = verify(store, min_age_s=0)
    assert report.problems == [
        f"a: orphan file {store.relative(p)} (no committed runs file)" for p in orphans
    ]
    assert verify(store, "b", min_age_s=0).ok


def test_compaction_never_shows_a_row_twice_or_zero_times(tmp_path, store_make_chunk):
    """A reader opening catalogs all through repeated compactions always gets the same answer."""
    store = Store.open(str(tmp_path))
    for c in range(8):
        store.write_chunk(
            "s", f"c{c}", store_make_chunk([f"r{c}_{j}" for j in range(3)], steps=4, seed=c)
        )
    sql = (
        "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM trajectories), "
        "(SELECT count(*) FROM layers), (SELECT count(DISTINCT (run_id, step)) FROM trajectories)"
    )
    expected = [(24, 96, 192, 96)]
    seen, errors, stop = [], [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.append(run_query(store, sql)[1])
            except Exception as e:
                errors.append(e)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for k in range(12):
            compact(store, "s", rows_per_file=40 + k)  # a different split each time
    finally:
        stop.set()
        thread.join()
    print(f"{len(seen)} answers")
    assert seen and all(answer == expected for answer in seen), [a for a in seen if a != expected]
    assert errors == []  # run_query takes new lists when a file went away
    assert run_query(store, sql)[1] == expected


def test_compact_command(tmp_path, store_make_chunk, phasesweep_cli):
    store = Store.open(str(tmp_path))
    _fill(store, store_make_chunk)
    before = _answers(store)
    proc = phasesweep_cli(["compact", "a", "--store", str(tmp_path)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert out.startswith("a: merged 9 files into 3")
    # no attempt id such as -8204209236316072701f649ce: when, in words
    assert re.fullmatch(
        r"a: merged 9 files into 3, \d+ runs: one attempt, compacted at "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\n",
        out,
    ), out
    assert _answers(store) == before and len(store.files("runs")) == 1 + 3  # b untouched
    proc = phasesweep_cli(["compact", "a", "--store", str(tmp_path)])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and out.strip() == "nothing to compact", err


@pytest.mark.parametrize("rows_per_file", [10, 7])
def test_repair_of_a_compacted_file_drops_exactly_the_runs_with_rows_in_it(
    tmp_path, store_make_chunk, rows_per_file
):
    """A compacted sweep (runs of 5 steps and 2 layers; 10 rows per file: no run spans two
    files, 7: runs do), one middle trajectories file truncated: after --repair the store
    verifies clean and the runs no longer done are exactly those that had rows in it
    (read before the damage), whole or in part."""
    store = Store.open(str(tmp_path))
    run_ids = [f"r{i:02d}" for i in range(8)]
    for c in range(2):
        tables = store_make_chunk(run_ids[4 * c : 4 * c + 4], steps=5, depth=2, seed=c)
        runs = tables["runs"]
        for name, value in (("steps", 4), ("depth", 2)):  # the last step logged: 4
            column = pa.array([value] * runs.num_rows, pa.int64())
            runs = runs.set_column(runs.column_names.index(name), name, column)
        store.write_chunk("s", f"c{c}", {**tables, "runs": runs})
    compact(store, "s", rows_per_file=rows_per_file)
    files = store.files("trajectories", "s")
    assert len(files) >= 3
    victim = files[len(files) // 2]
    had_rows = set(pq.read_table(victim).column("run_id").to_pylist())
    _truncate(victim)

    report = verify(store, repair=True)
    assert any("unreadable file" in p for p in report.problems)
    assert verify(store).ok, verify(store).problems
    assert store.done_run_ids("s") == set(run_ids) - had_rows
    con = open_catalog(store)
    shown = con.sql("SELECT run_id, count(*) FROM trajectories GROUP BY ALL").fetchall()
    assert dict(shown) == {r: 5 for r in set(run_ids) - had_rows}  # every run shown is whole
    assert con.sql("SELECT count(*) FROM layers").fetchall() == [(10 * len(shown),)]


def test_repair_then_relaunch_trains_exactly_what_was_lost(
    tmp_path, tiny_spec, phasesweep_cli, shared_ray
):
    """The user's way: a sweep, one chunk's trajectories file truncated, ``verify
    --repair``; then verify exits 0, status counts the lost points as remaining and a
    relaunch trains exactly those."""
    store = tmp_path / "store"
    spec = tiny_spec()  # two chunks of three points
    run = ["run", str(spec), "--store", str(store), "--no-progress", "--address", shared_ray]

    def cli(*args: str) -> tuple[int, str, str]:
        proc = phasesweep_cli(list(args))
        out, err = proc.communicate(timeout=300)
        return proc.returncode, out, err

    assert cli(*run)[0] == 0
    victim = sorted((store / "trajectories" / "sweep=tiny").glob("*.parquet"))[0]
    lost = set(pq.read_table(victim).column("run_id").to_pylist())
    assert len(lost) == 3
    _truncate(str(victim))
    code, out, _ = cli("verify", "--store", str(store), "--repair")
    # everything found is repaired: exit 0, so `verify --repair && phasesweep run …` chains
    assert code == 0 and "problem: " in out and "repaired: " in out, out
    assert out.splitlines()[-1].startswith("ok: ") and "not repaired" not in out, out
    code, out, err = cli("verify", "--store", str(store))
    assert code == 0 and out.startswith("ok"), out + err
    code, out, _ = cli("status", "tiny", "--store", str(store))
    assert code == 0 and "3 of 6 points done, 3 remaining" in out
    code, _, err = cli(*run)
    assert code == 0 and "skipping 3 already stored; training 3" in err, err
    assert cli("verify", "--store", str(store))[0] == 0
    _, rows = run_query(store, "SELECT run_id, count(*) FROM trajectories GROUP BY ALL")
    assert len(rows) == 6 and {n for _, n in rows} == {5}
    assert {r for r, _ in rows} >= lost
