"""Analysis at scale: batched reading and analysis, streamed analysis partitions, memory.

``analyze`` reads a sweep a batch of runs at a time (``storage._catalog.run_batches``) and
streams its partitions (``Store.analysis_writer``): checked against the catalog views and
against the whole-sweep analysis (:func:`analysis._analyze.analyze_frames`), row for row.
"""

from __future__ import annotations

import math
import os
import re
from datetime import datetime, timezone

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from phasesweep.storage import Store, compact, open_catalog, schema
from phasesweep.storage._catalog import run_batches

EARLY = datetime(2026, 1, 1, tzinfo=timezone.utc)
LATE = datetime(2026, 1, 2, tzinfo=timezone.utc)


def _set(table: pa.Table, column: str, values) -> pa.Table:
    if column not in table.column_names:
        return table.append_column(column, pa.array(values))
    return table.set_column(table.column_names.index(column), column, pa.array(values))


@pytest.fixture
def messy_store(tmp_path, store_make_chunk):
    """A store whose views must choose: several chunks, a run committed twice (the earlier
    commit shows), failed runs with trajectory rows retried by a later attempt, an attempt
    that died before its commit, a file of two attempts, and another sweep."""
    store = Store.open(str(tmp_path / "store"))
    for c in range(4):
        ids = [f"r{c}{i}" for i in range(5)]
        store.write_chunk("s", f"c{c}", store_make_chunk(ids, steps=4, seed=c, finished_at=LATE))
    store.write_chunk(
        "s", "dup", store_make_chunk(["r00", "r11"], steps=4, seed=7, finished_at=EARLY)
    )
    failed = store_make_chunk(["f1", "f2"], steps=3, seed=8, finished_at=EARLY)
    failed["runs"] = _set(failed["runs"], "status", ["failed", "failed"])
    store.write_chunk("s", "c9", failed)
    store.write_chunk("s", "c9", store_make_chunk(["f1"], steps=4, seed=9, finished_at=LATE))
    dead = store_make_chunk(["r20", "z1"], steps=4, seed=10)
    orphan = schema.to_table("trajectories", _set(dead["trajectories"], "attempt", ["dead"] * 8))
    store.put(f"{store.table_dir('trajectories')}/sweep=s/part-c2-dead.parquet", _parquet(orphan))
    store.write_chunk("t", "c0", store_make_chunk(["r00", "t1"], steps=4, seed=11))
    # one file holding the trajectories of two committed attempts (c1 and c3)
    paths = [p for p in store.files("trajectories", "s") if "-c1-" in p or "-c3-" in p]
    merged = pa.concat_tables([pq.read_table(p) for p in paths])
    store.put(f"{store.table_dir('trajectories')}/sweep=s/part-merged-x.parquet", _parquet(merged))
    for p in paths:
        os.remove(p)
    return store


def _parquet(table: pa.Table) -> bytes:
    from phasesweep.storage._parquet import parquet_bytes

    return parquet_bytes(table)


def _views(store: Store, sweep: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    con = open_catalog(store)
    runs = con.sql(
        "SELECT run_id, attempt, status, seed FROM runs WHERE sweep = ? ORDER BY run_id",
        params=[sweep],
    ).df()
    traj = con.sql(
        "SELECT run_id, step, train_loss FROM trajectories WHERE sweep = ? ORDER BY run_id, step",
        params=[sweep],
    ).df()
    return runs, traj


def _batched(store: Store, sweep: str, batch_runs: int):
    batches = list(
        run_batches(store, sweep, ["status", "seed"], ["step", "train_loss"], batch_runs)
    )
    runs = pd.concat([r.to_pandas() for r, _ in batches], ignore_index=True)
    traj = pd.concat([t.to_pandas() for _, t in batches], ignore_index=True)
    # every batch's trajectory rows belong to its own runs
    for r, t in batches:
        assert set(t["run_id"].to_pylist()) <= set(r["run_id"].to_pylist())
    return (
        batches,
        runs.sort_values("run_id", ignore_index=True),
        traj[["run_id", "step", "train_loss"]].sort_values(["run_id", "step"], ignore_index=True),
    )


@pytest.mark.parametrize("batch_runs", [1, 3, 7, 1000])
def test_run_batches_show_what_the_views_show(messy_store, batch_runs):
    want_runs, want_traj = _views(messy_store, "s")
    assert len(want_runs) == 22 and (want_runs["status"] == "failed").sum() == 1  # f2
    batches, runs, traj = _batched(messy_store, "s", batch_runs)
    assert all(r.num_rows <= batch_runs for r, _ in batches)
    assert len(batches) == -(-len(want_runs) // batch_runs)
    pd.testing.assert_frame_equal(runs, want_runs)
    pd.testing.assert_frame_equal(traj, want_traj)


def test_run_batches_of_a_compacted_store(messy_store, store_make_chunk):
    """Compacted files hold many attempts' runs, sorted, a run's rows may straddle two
    files; chunks committed after the compaction add files of their own."""
    compact(messy_store, "s", rows_per_file=5)  # 5 rows per file: runs straddle files
    messy_store.write_chunk("s", "late", store_make_chunk(["r30", "n1"], steps=4, seed=12))
    want_runs, want_traj = _views(messy_store, "s")
    assert "n1" in set(want_runs["run_id"])
    for batch_runs in (1, 4, 100):
        _, runs, traj = _batched(messy_store, "s", batch_runs)
        pd.testing.assert_frame_equal(runs, want_runs)
        pd.testing.assert_frame_equal(traj, want_traj)


def test_run_batches_read_only_the_files_of_their_attempts(messy_store, monkeypatch):
    """A batch of one run opens its attempt's trajectories file, not the sweep's (and the
    file of two attempts where its attempt may be in it)."""
    import pyarrow.dataset as ds
    from phasesweep.storage import _catalog

    opened = []
    real = ds.dataset

    def spy(paths, *args, **kwargs):
        opened.extend(os.path.basename(p) for p in paths)
        return real(paths, *args, **kwargs)

    monkeypatch.setattr(_catalog.ds, "dataset", spy)
    merged_runs = 0
    for runs, traj in run_batches(messy_store, "s", [], ["step"], 1):
        (attempt,) = runs["attempt"].to_pylist()
        own = [p for p in opened if p != "part-merged-x.parquet"]
        if "part-merged-x.parquet" in opened and len(traj) and not own:
            merged_runs += 1
        else:
            assert own == [next(p for p in own if attempt in p)]
        opened.clear()
    assert merged_runs == 9  # the runs of c1 and c3 but r11, shown from its earlier commit


def test_run_batches_of_an_empty_or_unknown_sweep(tmp_path):
    store = Store.open(str(tmp_path))
    assert list(run_batches(store, "nothing", ["status"], ["time"], 10)) == []
    with pytest.raises(ValueError, match="batch_runs"):
        list(run_batches(store, "nothing", [], [], 0))


def test_analysis_writer_streams_and_replaces_atomically(
    tmp_path, store_make_table, store_make_chunk, store_current, monkeypatch
):
    from phasesweep.storage import _parquet

    store = Store.open(str(tmp_path))
    folder = tmp_path / "plateaus" / "sweep=s"
    # the runs of the plateaus, with current summaries: the view shows their plateaus
    ids = [f"run_id-{i}" for i in range(5)]
    store.write_chunk("s", "c0", store_make_chunk(ids))
    summaries = store_make_table(schema.SUMMARIES, len(ids), run_id=ids)
    store.write_analysis("s", "summaries", store_current(store, "s", summaries))

    def stored() -> pa.Table:  # in a fixed order (the view joins the runs' summaries)
        sql = "SELECT * EXCLUDE (sweep) FROM plateaus ORDER BY ALL"
        return open_catalog(store).sql(sql).to_arrow_table()

    def ordered(rows: pa.Table) -> pa.Table:
        return duckdb.sql("SELECT * FROM rows ORDER BY ALL").to_arrow_table()

    parts = [store_make_table(schema.PLATEAUS, n, seed=n) for n in (3, 0, 5, 4)]
    want = ordered(schema.to_table("plateaus", pa.concat_tables(parts)))
    monkeypatch.setattr(_parquet, "STREAM_ROW_GROUP", 4)  # row groups of >= 4 rows
    with store.analysis_writer("s", "plateaus") as write:
        for p in parts:
            write(p)
        assert stored().num_rows == 0  # nothing visible before the block ends
    assert stored().equals(want)
    assert pq.read_metadata(folder / "data.parquet").num_row_groups == 2  # 3+0+5, then 4

    # an error inside the block: the old partition stays, no file is left behind
    with pytest.raises(RuntimeError, match="half-way"), store.analysis_writer("s", "plateaus") as w:
        w(parts[2])
        raise RuntimeError("half-way")
    assert os.listdir(folder) == ["data.parquet"] and stored().equals(want)
    # so does a table that does not fit the schema
    with pytest.raises(ValueError, match="plateaus"), store.analysis_writer("s", "plateaus") as w:
        w(parts[2])
        w(pa.table({"nonsense": [1]}))
    assert os.listdir(folder) == ["data.parquet"] and stored().equals(want)
    # write_analysis is the one-table case
    store.write_analysis("s", "plateaus", parts[3])
    assert stored().equals(ordered(schema.to_table("plateaus", parts[3])))


# --------------------------------------------------------------------------- analyze


_ORDER = {
    "summaries": ["run_id"],
    "plateaus": ["run_id", "plateau_index"],
    "scaling_fits": ["depth", "x", "width", "activation", "noise_sigma", "lr"],
}


def _stored(store: Store, sweep: str) -> dict[str, pd.DataFrame]:
    con = open_catalog(store)
    return {  # in the store's types (DuckDB names the time zone Etc/UTC)
        name: schema.to_table(
            name,
            con.sql(
                f"SELECT * EXCLUDE (sweep) FROM {name} WHERE sweep = ?", params=[sweep]
            ).to_arrow_table(),
        )
        .to_pandas()
        .sort_values(order, ignore_index=True)
        for name, order in _ORDER.items()
    }


def _whole_sweep(store: Store, sweep: str) -> dict[str, pd.DataFrame]:
    """The analysis of the whole sweep at once, read through the catalog views."""
    from phasesweep.analysis._analyze import (
        RUN_COLUMNS,
        TRAJECTORY_COLUMNS,
        analyze_frames,
        fit_group_axes,
    )
    from phasesweep.analysis.config import stored_sweep

    spec = stored_sweep(store.read_spec(sweep), sweep)
    con = open_catalog(store)
    runs = con.execute(
        f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE sweep = ? ORDER BY run_id", [sweep]
    ).df()
    traj = con.execute(
        f"SELECT run_id, step, time, {', '.join(TRAJECTORY_COLUMNS)} FROM trajectories "
        "WHERE sweep = ? ORDER BY run_id, time, step",
        [sweep],
    ).df()
    cfg = spec.analysis if spec is not None else None
    tables = analyze_frames(runs, traj, cfg, fit_group_axes(runs, spec))
    # analyze records what each summary was computed from: the run's stored runs row
    source = (
        open_catalog(store)
        .sql("SELECT run_id, attempt, finished_at FROM runs WHERE sweep = ?", params=[sweep])
        .df()
        .set_index("run_id")
    )
    summaries = tables["summaries"].to_pandas()
    summaries["source_attempt"] = summaries["run_id"].map(source["attempt"])
    summaries["source_finished_at"] = summaries["run_id"].map(source["finished_at"])
    tables = {**tables, "summaries": schema.to_table("summaries", summaries)}
    return {
        name: tables[name].to_pandas().sort_values(order, ignore_index=True)
        for name, order in _ORDER.items()
    }


def _check_batched_equals_whole(
    store: Store, sweep: str, batch_sizes, workers: int = 0
) -> dict[str, pd.DataFrame]:
    from phasesweep.analysis import analyze

    want = _whole_sweep(store, sweep)
    assert len(want["summaries"]) and len(want["scaling_fits"])
    for batch_runs in batch_sizes:
        counts = analyze(store, sweep, batch_runs=batch_runs, workers=workers)
        got = _stored(store, sweep)
        assert counts == {name: len(frame) for name, frame in want.items()}
        for name in _ORDER:
            pd.testing.assert_frame_equal(got[name], want[name], check_exact=True, obj=name)
    return want


@pytest.mark.process
def test_batched_analysis_equals_the_whole_sweep(tmp_path):
    """The closed-form sweep (failed, diverged and not converged runs among them), stored
    as chunks of uneven sizes, analyzed in batches of 1, 7 and all runs."""
    import yaml
    from calibration import synthetic_sweep

    alphas = tuple(np.logspace(-4, 0, 9))
    tables = synthetic_sweep(
        init_scales=alphas,
        widths=(16, 256),
        depths=(2, 3),
        seeds=(0, 1, 2),
        steps=10**5,
        diverge=lambda a, w: a >= 1.0 and w >= 256,
        fail_first=True,
    )
    store = Store.open(str(tmp_path))
    ids = tables["runs"]["run_id"].to_pylist()
    for k, (lo, hi) in enumerate([(0, 5), (5, 40), (40, 41), (41, len(ids))]):
        keep = pa.array(ids[lo:hi])
        chunk = {n: t.filter(pc.is_in(t["run_id"], keep)) for n, t in tables.items()}
        store.write_chunk("synth", f"c{k}", chunk)
    spec = {
        "name": "synth",
        "analysis": {"fit_init_scale_max": 0.1, "extra_escape_eps": [0.3], "at_time": 50.0},
        "grid": {"init_scale": list(map(float, alphas)), "width": [16, 256], "depth": [2, 3]},
    }
    store.write_spec("synth", yaml.safe_dump(spec))
    want = _check_batched_equals_whole(store, "synth", [1, 10_000])
    _check_batched_equals_whole(store, "synth", [7], workers=2)  # batches in 2 processes
    s = want["summaries"]
    assert set(s["regime"].dropna()) == {"rich", "not_converged", "diverged"}
    assert s["regime"].isna().sum() == 1  # the failed run
    assert want["scaling_fits"]["slope"].notna().any() and len(want["plateaus"]) > 0


def test_batched_analysis_of_a_trained_sweep(tmp_path):
    """A sweep trained by the pipeline, one store file per chunk of 4 points."""
    import yaml
    from phasesweep.pipeline.grid import expand, make_chunks
    from phasesweep.pipeline.run._trial import train_and_store
    from phasesweep.pipeline.spec import validate_spec

    raw = {
        "name": "trained",
        "model": {"depth": 2, "width": 8, "init": "antisymmetric"},
        "data": {"n_train": 8, "n_test": 8, "input_dim": 3, "seed": 0},
        "train": {"steps": 300, "log_points": 30, "lr": 0.5},
        "metrics": {"probe_size": 4},
        "execution": {"max_chunk_size": 4},
        "grid": {"init_scale": [0.01, 0.1, 1.0, 3.0], "width": [8, 32], "seed": [0, 1]},
    }
    spec = validate_spec(raw)
    store = Store.open(str(tmp_path))
    store.write_spec("trained", yaml.safe_dump(raw))
    for chunk in make_chunks(expand(spec), spec):
        train_and_store(store.uri, "trained", chunk, "cpu")
    assert len(store.files("trajectories", "trained")) >= 4
    _check_batched_equals_whole(store, "trained", [1, 3, 100])


def test_batched_analysis_of_a_scale_sweep(tmp_path):
    from calibration import write_scale_sweep

    store = Store.open(str(tmp_path))
    n = write_scale_sweep(store, "scale", 1, runs_per_file=40, steps=400, log_points=40)
    assert len(store.files("trajectories", "scale")) == 8 * -(-16 // 40)
    want = _check_batched_equals_whole(store, "scale", [9])
    assert len(want["summaries"]) == n == 128


# --------------------------------------------------------------------------- plateaus


def _curves(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """Loss curves of every kind the detector meets: closed forms with 0-3 plateaus, noisy
    ones, a lazy one, and the edge cases (short, unsorted with repeated and missing times,
    non-positive or non-finite losses)."""
    from calibration import (
        lazy_loss,
        logged_times,
        two_layer_linear_loss,
        xor_relu_loss,
    )

    t = logged_times(0.01, 20000, 80)
    out = [
        (t, two_layer_linear_loss(t, (4.0, 1.0, 0.25), u0)) for u0 in (1e-8, 1e-6, 1e-4, 1e-2, 1.0)
    ]
    out += [(t, xor_relu_loss(t)), (t, lazy_loss(t, [0.3, 0.01], [1.0, 0.2]))]
    out += [
        (t, two_layer_linear_loss(t, (2.0, 0.5), 1e-5) * (1 + 0.03 * rng.standard_normal(len(t))))
        for _ in range(6)
    ]
    shuffled = rng.permutation(len(t))
    loss = two_layer_linear_loss(t, (4.0, 1.0), 1e-6)
    dup_t, dup_l = np.concatenate([t, t[::7]])[:], np.concatenate([loss, loss[::7] * 1.5])
    holes = loss.copy()
    holes[::9] = np.nan
    holes[5] = np.inf
    out += [
        (t[shuffled], loss[shuffled]),
        (dup_t, dup_l),
        (t, holes),
        (t[:2], loss[:2]),
        (t[:3], loss[:3]),
        (t, np.zeros(len(t))),
        (t, -loss),
        (np.array([]), np.array([])),
    ]
    return out


@pytest.mark.parametrize("options", [{}, {"contrast": 10.0, "min_drop": 0.3}])
def test_plateaus_of_many_runs_at_once_are_each_runs_own(options):
    """plateau_frame finds its candidates for all runs in one pass; every run gets exactly
    what detect_plateaus finds on that run alone, wherever it sits among the others."""
    from phasesweep.analysis import _series as ser
    from phasesweep.analysis._plateaus import PLATEAU_COLUMNS, detect_plateaus, plateau_frame

    rng = np.random.default_rng(3)
    curves = _curves(rng)
    order = rng.permutation(np.repeat(np.arange(len(curves)), 3))  # each curve 3 times
    ids = np.array([f"r{k:03d}" for k in range(len(order))], dtype=object)
    frame = pd.DataFrame(
        {
            "run_id": np.repeat(ids, [len(curves[c][0]) for c in order]),
            "time": np.concatenate([curves[c][0] for c in order]),
            "train_loss": np.concatenate([curves[c][1] for c in order]),
        }
    )
    skip = np.zeros(len(ids), dtype=bool)
    skip[::5] = True
    got, counts = plateau_frame(
        ser.from_frame(frame, ["train_loss"], run_ids=ids), skip=skip, **options
    )
    rows = []
    for k, c in enumerate(order):
        if skip[k]:
            assert counts[k] == -1
            continue
        found = detect_plateaus(*curves[c], **options)
        assert counts[k] == len(found)
        rows += [
            (ids[k], p.level, p.start, p.end, p.duration, i, p.drop_frac, p.contrast)
            for i, p in enumerate(found)
        ]
    want = pd.DataFrame.from_records(rows, columns=PLATEAU_COLUMNS)
    assert counts.max() >= 3 and (counts == 0).any() and len(want) > 20
    pd.testing.assert_frame_equal(got, want.astype(got.dtypes.to_dict()), check_exact=True)


def test_pairwise_sums_are_numpys_sums_to_the_bit():
    """The plateau selection sums many runs' slices at once and must give the bits a
    per-slice ``np.sum`` gives: every length across numpy's regimes (under 8 values,
    blocks of 8 up to 128, halves beyond), on values over twelve decades, signs mixed."""
    from phasesweep.analysis._series import pairwise_sums

    rng = np.random.default_rng(5)
    lengths = np.array([*range(300), *range(300), 1000, 4097])
    x = rng.standard_normal(lengths.sum() + 7) * 10.0 ** rng.integers(-6, 6, lengths.sum() + 7)
    starts = np.cumsum(lengths) - lengths + 7
    want = np.array([x[a : a + n].sum() for a, n in zip(starts, lengths, strict=True)])
    got = pairwise_sums(x, starts, lengths)
    assert got.tobytes() == want.tobytes()
    assert not np.array_equal(
        got, [math.fsum(x[a : a + n]) for a, n in zip(starts, lengths, strict=True)]
    )


# --------------------------------------------------------------------------- workers


@pytest.mark.process
def test_workers_map_in_order_and_raise_what_the_work_raises():
    import operator

    from phasesweep.analysis._workers import WorkerError, Workers

    with Workers(2) as pool:
        assert list(pool.map(pow, ((i, 2) for i in range(9)))) == [i * i for i in range(9)]
        assert list(pool.map(pow, [])) == []
    with pytest.raises(ZeroDivisionError), Workers(2) as pool:
        list(pool.map(operator.truediv, [(1, 1), (2, 1), (3, 0), (4, 1)]))
    with pytest.raises(WorkerError, match="exit code 7"), Workers(1) as pool:
        list(pool.map(os._exit, [(7,)]))


# --------------------------------------------------------------------------- memory

#: runs of the two scale stores whose peak memories are compared (the large one 4x)
SMALL_RUNS, LARGE_RUNS = 8192, 32768

_PEAK = """
import resource, sys
from phasesweep.analysis import _plotting, analyze, report
store, what, out = sys.argv[1:]

def say_peak():
    print("peak MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

if what == "analyze":
    analyze(store, "scale", batch_runs=512, workers=0)
else:  # the report: plot's figures (render_all, as `plot` draws them), then the page
    render_all = _plotting.render_all

    def figures_then_peak(*args, **kwargs):
        drawn = render_all(*args, **kwargs)
        say_peak()
        return drawn

    _plotting.render_all = figures_then_peak
    report(store, "scale", out)
say_peak()
"""


def _peak_mib(store: Store, what: str, out) -> list[float]:
    """Peak resident memories of a fresh process that runs ``what`` on ``store``, in MiB:
    ``analyze``'s; or the report's, first once its figures are drawn (the figures are
    ``plot``'s own work: ``render_all`` over the sweep opened once), then in all."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _PEAK, store.uri, what, str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(line.split()[-1]) for line in re.findall("^peak MiB .*$", done.stdout, re.M)]


@pytest.fixture(scope="module")
def scale_stores(tmp_path_factory) -> dict[int, Store]:
    """Scale sweeps of SMALL_RUNS and LARGE_RUNS runs, 30 logged steps each."""
    from calibration import write_scale_sweep

    stores = {}
    for n in (SMALL_RUNS, LARGE_RUNS):
        store = Store.open(str(tmp_path_factory.mktemp(f"scale{n}")))
        assert write_scale_sweep(store, "scale", n, runs_per_file=512, log_points=30) == n
        stores[n] = store
    return stores


@pytest.mark.process
def test_analyze_memory_does_not_grow_with_the_runs(scale_stores, tmp_path):
    """4x the runs (and trajectory rows): the peak grows by what is kept per run (the
    runs' rows read at once, the numbers the fits need: +40 MiB measured), not by the
    trajectories (the whole-sweep analysis, ``analyze_frames`` of all rows: +300 MiB)."""
    (small,) = _peak_mib(scale_stores[SMALL_RUNS], "analyze", tmp_path)
    (large,) = _peak_mib(scale_stores[LARGE_RUNS], "analyze", tmp_path)
    con = open_catalog(scale_stores[LARGE_RUNS])
    assert con.execute("SELECT count(*) FROM summaries").fetchone() == (LARGE_RUNS,)
    assert large - small < 120, f"peak {small:.0f} MiB at {SMALL_RUNS} runs, {large:.0f} at 4x"


@pytest.mark.slow
@pytest.mark.process
def test_figures_memory_does_not_grow_with_the_runs(scale_stores, tmp_path):
    """4x the runs: neither the figures (what ``plot`` draws) nor the whole report grow
    by more than 60 MiB; both measured in one process, the figures' peak before the
    report reads its tables."""
    from phasesweep.analysis import analyze

    for store in scale_stores.values():
        if not store.files("summaries", "scale"):
            analyze(store, "scale")
    small = _peak_mib(scale_stores[SMALL_RUNS], "report", tmp_path / "small")
    large = _peak_mib(scale_stores[LARGE_RUNS], "report", tmp_path / "large")
    assert len(small) == len(large) == 2  # the figures' peak, then the report's
    for what, s, n in zip(("figures", "report"), small, large):
        assert n - s < 60, f"{what}: peak {s:.0f} MiB at {SMALL_RUNS} runs, {n:.0f} at 4x"


# --------------------------------------------------------------------------- figures


@pytest.fixture(scope="module")
def figure_store(tmp_path_factory) -> Store:
    """An analyzed scale sweep of 4 seeds (512 runs) in files of 64 runs."""
    from calibration import write_scale_sweep
    from phasesweep.analysis import analyze

    store = Store.open(str(tmp_path_factory.mktemp("figures")))
    write_scale_sweep(store, "scale", 512, runs_per_file=64, steps=400, log_points=30)
    analyze(store, "scale", workers=0)
    return store


def _context(store: Store, with_store: bool = True):
    from phasesweep.analysis._plotting import context
    from phasesweep.analysis.config import stored_sweep

    spec = stored_sweep(store.read_spec("scale"), "scale")
    return context(open_catalog(store), "scale", spec, store if with_store else None)


def test_sample_is_fixed_and_spread_over_facets_and_hues(figure_store):
    ctx = _context(figure_store)
    select = "SELECT run_id, depth, width, seed FROM runs WHERE sweep = ? AND width >= ?"
    everything = ctx.df(select, [64])
    rows, total = ctx.sample(select, ["depth", "width"], 10, ["scale", 64])
    again, _ = ctx.sample(select, ["depth", "width"], 10, ["scale", 64])
    assert total == len(everything) == 384
    pd.testing.assert_frame_equal(rows, again)
    assert set(rows["run_id"]) <= set(everything["run_id"])
    # 2 depths: 5 runs each, taken in turn from the 3 widths (2, 2, 1), by hash(run_id)
    assert rows.groupby("depth").size().tolist() == [5, 5]
    for _, per_depth in rows.groupby("depth"):
        assert sorted(per_depth.groupby("width").size().tolist()) == [1, 2, 2]
    hashed = ctx.df(f"SELECT *, hash(run_id) AS h FROM ({select})", [64])
    first = hashed.sort_values(["h", "run_id"]).groupby(["depth", "width"]).head(1)
    assert set(first["run_id"]) <= set(rows["run_id"])
    # more room than rows: all of them
    rows, total = ctx.sample(select, [], 10_000, ["scale", 64])
    assert len(rows) == total == 384


def test_chunk_rows_from_the_files_equal_the_views(figure_store):
    runs = _context(figure_store).df(
        "SELECT run_id, attempt FROM runs WHERE sweep = ? AND seed = 1 AND width = 16"
    )
    for table, columns in [("trajectories", ["step", "time"]), ("layers", ["step", "layer"])]:
        got = [
            _context(figure_store, with_store)
            .chunk_rows(table, runs, columns)
            .sort_values(["run_id", *columns], ignore_index=True)
            for with_store in (True, False)
        ]
        assert len(got[0]) > len(runs) and set(got[0]["run_id"]) == set(runs["run_id"])
        pd.testing.assert_frame_equal(got[0], got[1])


def test_escape_time_markers_aggregate_every_run(figure_store, monkeypatch):
    """The markers (groups aggregated in SQL) are those of every run's own point, while
    the dots are a sample, said in the title."""
    from phasesweep.analysis import figures
    from phasesweep.analysis._analyze import fit_mask
    from phasesweep.analysis.config import PlotSpec
    from phasesweep.analysis.figures import escape_time

    monkeypatch.setattr(escape_time, "MAX_DOTS", 40)
    ctx = _context(figure_store)
    kind = figures.get("escape_time")
    p = kind.resolve(PlotSpec(kind="escape_time"), ctx)
    data = kind.query(p, ctx)
    points = ctx.df(
        "SELECT r.*, s.escape_time, s.regime, s.n_plateaus FROM runs r JOIN summaries s "
        "USING (sweep, run_id) WHERE r.sweep = ? AND r.status = 'completed' "
        "AND s.escape_time > 0"
    )
    points["in_fit"] = fit_mask(points, ctx.cfg)
    keys = [p.facet, p.hue, "init_scale"]
    cells = ["n", "sum_log", "lo", "hi", "in_fit"]

    def per_cell(groups):
        g = groups[groups["n"] > 0].groupby(keys)
        out = g.agg(n=("n", "sum"), sum_log=("sum_log", "sum"), lo=("lo", "min"))
        return out.join(g.agg(hi=("hi", "max"), in_fit=("in_fit", "all")))[cells]

    want = per_cell(escape_time.escape_groups(points))
    got = per_cell(data["groups"])
    pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-12)
    assert want["in_fit"].any() and not want["in_fit"].all()
    shown, total = data["shown"]
    assert shown == len(data["points"]) <= 40 < total == len(points)
    fig = kind.draw(data, p)
    assert f"{shown} of {total} runs shown" in fig.get_suptitle()


def test_transversal_markers_aggregate_every_run(synthetic_store, monkeypatch):
    from phasesweep.analysis import analyze, figures
    from phasesweep.analysis._plotting import context
    from phasesweep.analysis.config import PlotSpec, stored_sweep
    from phasesweep.analysis.figures import transversal

    grid = {
        "init_scale": [0.01, 0.1],
        "width": [16, 64],
        "depth": [2, 3],
        "seed": [0, 1, 2, 3],
        "noise_sigma": [0.0, 0.1, 0.3],
    }
    store, spec_text = synthetic_store("tv", grid)
    analyze(store, "tv", workers=0)
    monkeypatch.setattr(transversal, "MAX_DOTS", 10)
    ctx = context(open_catalog(store), "tv", stored_sweep(spec_text, "tv"), store)
    kind = figures.get("transversal")
    p = kind.resolve(PlotSpec(kind="transversal", where="init_scale = 0.1"), ctx)
    data = kind.query(p, ctx)
    points = ctx.df(
        "SELECT r.*, s.final_transversal_grad_sq FROM runs r JOIN summaries s "
        "USING (sweep, run_id) WHERE r.sweep = ? AND r.status = 'completed' "
        "AND r.init_scale = 0.1"
    )
    keys = [p.facet, p.hue, p.x]
    want = transversal.transversal_cells(points, keys).sort_values(keys, ignore_index=True)
    got = data["cells"].sort_values(keys, ignore_index=True)[want.columns]
    pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-12)
    assert (want["min_pos"].isna() == (want[p.x] == 0)).all()  # sigma = 0: only zeros
    shown, total = data["shown"]
    assert shown == len(data["points"]) <= 10 < total == len(points)
    assert f"{shown} of {total} runs shown" in kind.draw(data, p).get_suptitle()


def test_loss_curves_draw_a_sample_in_every_facet(figure_store, monkeypatch):
    from phasesweep.analysis import figures
    from phasesweep.analysis.config import PlotSpec
    from phasesweep.analysis.figures import loss_curves

    monkeypatch.setattr(loss_curves, "MAX_CURVES", 12)
    ctx = _context(figure_store)
    kind = figures.get("loss_curves")
    p = kind.resolve(PlotSpec(kind="loss_curves", where="width = 64", facet="depth"), ctx)
    data = kind.query(p, ctx)
    shown, total = data["shown"]
    assert (shown, total) == (12, 128)
    runs = data["runs"]
    assert runs.groupby("depth").size().tolist() == [6, 6]
    assert set(data["traj"]["run_id"]) == set(runs["run_id"])
    assert set(data["plateaus"]["run_id"]) <= set(runs["run_id"]) and len(data["plateaus"])
    fig = kind.draw(data, p)
    assert "12 of 128 runs shown" in fig.get_suptitle()
    panels = [a for a in fig.axes if a.get_visible() and a.lines]
    assert [len(a.lines) for a in panels] == [6, 6]


@pytest.mark.slow
def test_scale_benchmark_at_toy_size(tmp_path):
    """benchmarks/scale_analysis end to end on 128 runs: every command ran, and measured."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed
    from benchmarks import scale_analysis

    res = scale_analysis.measure(100, tmp_path, runs_per_file=32, steps=200, log_points=20)
    assert res["runs"] == 128 and res["files"] == 3 * 8  # a file per table and (depth, width)
    assert res["build_seconds"] is not None
    assert list(res["commands"]) == list(scale_analysis.commands(tmp_path, tmp_path))
    for c in res["commands"].values():
        assert c["seconds"] > 0 and c["cpu_seconds"] > 0 and c["MiB"] > 50
    options = {"runs_per_file": 32, "steps": 200, "log_points": 20}
    root, runs, build = scale_analysis.build_store(100, tmp_path, **options)
    assert (runs, build) == (128, None) and root.is_dir()  # the store is kept
    assert "| 128 | analyze |" in scale_analysis.table([res])


def test_any_value_from_the_footers_equals_the_view(figure_store, tmp_path):
    from calibration import write_scale_sweep

    assert _context(figure_store).any_value("layers", "top_sv")
    assert _context(figure_store, with_store=False).any_value("layers", "top_sv")
    # no singular values anywhere (spectra off): every top_sv NULL
    bare = Store.open(str(tmp_path))
    write_scale_sweep(bare, "scale", 128, runs_per_file=64, steps=100, log_points=10)
    for path in bare.files("layers", "scale"):
        table = pq.read_table(path)
        nulls = pa.nulls(table.num_rows, table.schema.field("top_sv").type)
        table = table.set_column(table.column_names.index("top_sv"), "top_sv", nulls)
        bare.put(path, _parquet(table))
    for with_store in (True, False):
        assert not _context(bare, with_store).any_value("layers", "top_sv")
        assert _context(bare, with_store).any_value("layers", "delta_top_sv")


def test_catalog_memory_is_bounded_and_spills(tmp_path, monkeypatch):
    """A catalog connection keeps DuckDB within MEMORY_LIMIT: a sort that needs more
    spills to the process's private folder (0700) rather than growing, and the limit
    cannot be lifted by SQL."""
    import duckdb
    from phasesweep.storage import _catalog

    con = open_catalog(Store.open(str(tmp_path)))
    limit, folder = con.execute(
        "SELECT current_setting('memory_limit'), current_setting('temp_directory')"
    ).fetchone()
    assert limit == "1.0 GiB" and folder == _catalog.spill_directory()
    assert os.stat(folder).st_mode & 0o777 == 0o700
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("SET memory_limit = '100GB'")
    monkeypatch.setattr(_catalog, "MEMORY_LIMIT", "100MB")
    con = _catalog.locked_connection()
    big_sort = (
        "SELECT count(*) FROM (SELECT md5(range::VARCHAR) AS s FROM range(5000000) ORDER BY s)"
    )
    assert con.execute(big_sort).fetchone() == (5_000_000,)
    assert os.listdir(folder)  # it spilled


def test_reach_adds_up_over_batches_and_from_sql(synthetic_store):
    """How the completed runs reach analysis.at_time: the same numbers from all runs at
    once, summed over batches (analyze) and aggregated in SQL (the report)."""
    from phasesweep.analysis import analyze
    from phasesweep.analysis._analyze import Reach
    from phasesweep.analysis._report._page import regime_counts

    rng = np.random.default_rng(0)
    status = rng.choice(["completed", "diverged", "failed"], 200, p=[0.8, 0.1, 0.1])
    ends = rng.uniform(0, 10, 200)
    ends[::13] = np.nan
    whole = Reach.of(5.0, status, ends)
    parts = sum(
        (Reach.of(5.0, status[i : i + 17], ends[i : i + 17]) for i in range(0, 200, 17)), Reach()
    )
    assert whole == parts and 0 < whole.short < whole.completed < 200
    assert Reach.of(5.0, status[:0], ends[:0]).line(5.0) is None

    grid = {"init_scale": [0.01, 1.0], "width": [16, 256], "depth": [2, 3], "seed": [0, 1]}
    store, _ = synthetic_store("reach", grid, fail_first=True)
    analyze(store, "reach", workers=0)
    con = open_catalog(store)
    runs = con.sql(
        "SELECT r.status, s.final_time, coalesce(s.regime, '(none)') AS regime FROM runs r "
        "JOIN summaries s USING (sweep, run_id)"
    ).df()
    at = 2 * float(np.nanmax(runs["final_time"]))  # beyond every run
    counts = regime_counts(con, "reach", at)
    want = Reach.of(at, runs["status"].to_numpy(object), runs["final_time"].to_numpy(float))
    assert Reach.of_counts(counts) == want and want.short == want.completed and want.line(at)
    assert want.short_end == float(np.nanmax(runs["final_time"]))


def test_tables_read_by_a_using_join():
    """The README's query (a USING join, which DuckDB's get_table_names cannot bind) names
    the tables it reads, so `phasesweep query` answers it."""
    from phasesweep.storage._catalog import tables_read

    readme = (
        "SELECT r.width, r.init_scale, avg(t.kernel_distance) AS kernel_distance "
        "FROM runs r JOIN trajectories t USING (sweep, run_id) "
        "WHERE r.sweep = 'quickstart' AND t.time BETWEEN 90 AND 110 GROUP BY ALL"
    )
    assert tables_read(readme) == {"runs", "trajectories"}
    assert tables_read("SELECT count(*) FROM summaries s JOIN runs USING (run_id)") == {
        "runs",
        "summaries",
    }
