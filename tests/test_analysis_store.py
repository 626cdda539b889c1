"""``analyze`` end to end on a real store, against the closed forms the synthetic sweep is built from."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import yaml
from calibration import logged_times, synthetic_sweep, two_layer_escape_time
from phasesweep.analysis import analyze, phase_diagram_sql
from phasesweep.analysis._analyze import analyze_frames
from phasesweep.storage import Store, open_catalog
from phasesweep.storage.schema import PLATEAUS, SCALING_FITS, SUMMARIES

ALPHAS = tuple(np.logspace(-4, 0, 9))
WIDTHS = (16, 256)
SWEEP = "synth"


def _diverge(alpha, width):
    return alpha >= 1.0 and width >= 256


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store.open(str(tmp_path_factory.mktemp("store")))
    tables = synthetic_sweep(
        init_scales=ALPHAS,
        widths=WIDTHS,
        depths=(2, 3),
        seeds=(0, 1, 2),
        steps=10**5,  # t up to 1000: depth 3 below alpha 1e-3 does not converge
        diverge=_diverge,
        fail_first=True,
    )
    st.write_chunk(SWEEP, "c0", tables)
    spec = {
        "name": SWEEP,
        "description": "synthetic",
        # the power law t ∝ alpha^-(L-2) is asymptotic: fit the small inits only
        "analysis": {"fit_init_scale_max": 0.1},
        "grid": {
            "init_scale": list(map(float, ALPHAS)),
            "width": list(WIDTHS),
            "depth": [2, 3],
            "seed": [0, 1, 2],
        },
    }
    st.write_spec(SWEEP, yaml.safe_dump(spec))
    return st


def _kd_final(alpha, width):
    return 1.0 / (1.0 + alpha**2 * width / 4.0)


def test_analyze_writes_tables(store):
    counts = analyze(store, SWEEP)
    n_runs = len(ALPHAS) * len(WIDTHS) * 2 * 3
    assert counts["summaries"] == n_runs
    con = open_catalog(store)
    s = con.execute("SELECT * FROM summaries WHERE sweep = ?", [SWEEP]).df()
    r = con.execute("SELECT * FROM runs WHERE sweep = ?", [SWEEP]).df()
    assert set(SUMMARIES.names) <= set(s.columns)
    assert set(PLATEAUS.names) <= set(con.execute("FROM plateaus LIMIT 0").df().columns)
    assert set(SCALING_FITS.names) <= set(con.execute("FROM scaling_fits LIMIT 0").df().columns)
    df = r.merge(s, on=["sweep", "run_id"], suffixes=("_run", ""))
    # failed run: no regime, no escape, no plateau count
    failed = df[df["status"] == "failed"]
    assert len(failed) == 1 and failed["regime"].isna().all()
    assert failed["escape_time"].isna().all() and failed["n_plateaus"].isna().all()
    # diverged runs: labelled, and never an escape time or plateau count
    div = df[df["status"] == "diverged"]
    assert len(div) == sum(_diverge(a, w) for a in ALPHAS for w in WIDTHS) * 2 * 3
    assert (div["regime"] == "diverged").all()
    assert div["escape_time"].isna().all() and div["n_plateaus"].isna().all()
    # completed, converged runs: lazy iff the final kernel distance is below 0.1
    ok = df[(df["status"] == "completed") & (df["loss_ratio"] < 0.1)]
    assert len(ok) > 0
    expect = np.where(_kd_final(ok["init_scale"], ok["width"]) < 0.1, "lazy", "rich")
    assert (ok["regime"].to_numpy() == expect).all()
    assert (ok["order_parameter"] == "kernel_distance").all()
    assert (ok["lazy_threshold"] == 0.1).all()
    # not_converged: the loss did not reach 10 % of L0 (depth 3 at the smallest inits,
    # whose escape t ≈ alpha^-1 / s is beyond t = 1000); they have no escape time
    nc = df[df["regime"] == "not_converged"]
    assert set(nc["init_scale"].round(6)) == {1e-4, round(10**-3.5, 6)}
    assert (nc["depth_run"] if "depth_run" in nc else nc["depth"]).eq(3).all()
    assert (nc["loss_ratio"] > 0.1).all() and nc["escape_time"].isna().all()


def test_escape_time_of_depth_two_runs_is_the_logistic_crossing(store):
    analyze(store, SWEEP)
    con = open_catalog(store)
    df = con.execute(
        "SELECT r.init_scale, r.seed, s.escape_time, s.escape_time_010, s.escape_time_090, "
        "s.initial_train_loss AS l0, s.final_train_loss AS lend, s.extra_escape_times "
        "FROM runs r JOIN summaries s USING (sweep, run_id) "
        "WHERE r.sweep = ? AND r.depth = 2 AND r.status = 'completed' AND r.init_scale < 0.1",
        [SWEEP],
    ).df()
    assert len(df) > 0
    s = 2.0  # the synthetic teacher's singular value
    for row in df.itertuples():
        u0 = row.init_scale**2 * (1 + 0.1 * row.seed)
        for eps, got in (
            (0.5, row.escape_time),
            (0.1, row.escape_time_010),
            (0.9, row.escape_time_090),
        ):
            theta = row.l0 - eps * (row.l0 - row.lend)
            u = s - math.sqrt(2 * theta)
            # 100 log-spaced points over 5 decades (12 % apart): interpolation error < 3 %
            assert got == pytest.approx(two_layer_escape_time(s, u0, u / s), rel=0.03)
        assert list(row.extra_escape_times) == pytest.approx(
            [row.escape_time_010, row.escape_time_090]
        )


def test_analyze_is_idempotent_and_uses_spec_thresholds(store, tmp_path):
    first = analyze(store, SWEEP)
    again = analyze(store, SWEEP)
    assert first == again
    con = open_catalog(store)
    assert con.execute("SELECT count(*) FROM summaries").fetchone()[0] == first["summaries"]
    # a spec with another threshold changes the labels accordingly
    original = store.read_spec(SWEEP)
    spec = yaml.safe_load(original)
    spec["analysis"]["lazy_threshold"] = 0.5
    store.write_spec(SWEEP, yaml.safe_dump(spec))
    try:
        analyze(store, SWEEP)
        con = open_catalog(store)
        df = con.execute(
            "SELECT r.init_scale, r.width, s.regime FROM runs r JOIN summaries s "
            "USING (sweep, run_id) WHERE r.sweep = ? AND s.regime IN ('lazy', 'rich')",
            [SWEEP],
        ).df()
        expect = np.where(_kd_final(df["init_scale"], df["width"]) < 0.5, "lazy", "rich")
        assert (df["regime"].to_numpy() == expect).all()
        assert (expect == "lazy").sum() > 0
    finally:
        store.write_spec(SWEEP, original)
        analyze(store, SWEEP)


def test_phase_diagram_sql_cells(store):
    analyze(store, SWEEP)
    con = open_catalog(store)
    sql = phase_diagram_sql(SWEEP, "init_scale", "width", "kernel_distance", facet="depth")
    cells = con.execute(sql).df()
    assert len(cells) == len(ALPHAS) * len(WIDTHS) * 2
    # the failed run is still a run of its cell (counted in n_runs and n_failed)
    assert (cells["n_runs"] == 3).all()
    assert cells["n_failed"].sum() == 1
    for row in cells.itertuples():
        if _diverge(row.x, row.y):
            assert row.n_diverged == 3 and pd.isna(row.value) and row.regime == "diverged"
            continue
        assert row.n_diverged == 0
        # converged cells: the mean over seeds of the known final kernel distance
        if row.regime in ("lazy", "rich"):
            assert row.value == pytest.approx(_kd_final(row.x, row.y), rel=1e-3)
    # a where clause narrows the runs
    one = con.execute(
        phase_diagram_sql(SWEEP, "init_scale", "width", "escape_time", where="seed = 0")
    ).df()
    assert one["n_runs"].max() == 2  # two depths per cell, one seed
    with pytest.raises(ValueError, match="unknown phase-diagram axis"):
        phase_diagram_sql(SWEEP, "init_scale; DROP", "width")


def test_scaling_fits_queryable(store):
    analyze(store, SWEEP)
    con = open_catalog(store)
    fits = con.execute(
        "SELECT depth, width, x, slope, ci_low, ci_high, theory_slope, n_seeds "
        "FROM scaling_fits WHERE sweep = ? ORDER BY depth, width, x",
        [SWEEP],
    ).df()
    # grouped by the grid axis width; depth 2 has three fits, depth 3 one
    assert len(fits) == len(WIDTHS) * 4
    d3 = fits[(fits["depth"] == 3) & (fits["x"] == "log_init_scale") & fits["slope"].notna()]
    assert len(d3) > 0
    assert (d3["theory_slope"] == -1).all()
    for row in d3.itertuples():
        # theory -1; the finite range (up to alpha 0.1) steepens it by ~5 %
        assert row.slope == pytest.approx(-1.0, abs=0.1)
        assert row.n_seeds == 3


def _big_frames(n_runs, n_points=100):
    t = logged_times(0.01, 10**5, n_points)
    rng = np.random.default_rng(0)
    alpha = 10 ** rng.uniform(-3, 0, n_runs)
    lam = 1.0 / np.log(1 / alpha + 1)
    ids = np.array([f"r{i:07d}" for i in range(n_runs)], dtype=object)
    tt = np.tile(t, n_runs)
    shift = np.repeat(1 / lam, len(t))
    loss = 1.0 / (1.0 + np.exp(np.minimum((tt - shift) * 3.0, 700))) + 1e-4
    traj = pd.DataFrame(
        {
            "run_id": np.repeat(ids, len(t)),
            "time": tt,
            "train_loss": loss,
            "test_loss": loss,
            "param_rel_change": 0.5,
            "kernel_distance": np.repeat(alpha, len(t)),
            "act_flip_frac": np.nan,
            "transversal_grad_sq": np.nan,
        }
    )
    runs = pd.DataFrame(
        {
            "run_id": ids,
            "status": "completed",
            "init_scale": alpha,
            "width": 64,
            "depth": 2,
            "noise_sigma": 0.0,
            "lr": 0.01,
            "seed": np.arange(n_runs) % 5,
            "activation": "relu",
            "initial_train_loss": np.nan,
            "final_train_loss": np.nan,
        }
    )
    return runs, traj


def test_analyze_frames_speed():
    runs, traj = _big_frames(5000)
    t0 = time.perf_counter()
    out = analyze_frames(runs, traj)
    dt = time.perf_counter() - t0
    assert out["summaries"].num_rows == 5000
    assert isinstance(out["plateaus"], pa.Table)
    assert dt < 30, f"analyze of 5000 runs took {dt:.1f}s"


@pytest.mark.slow
def test_analyze_frames_1e5_runs():
    runs, traj = _big_frames(100_000)
    t0 = time.perf_counter()
    out = analyze_frames(runs, traj)
    dt = time.perf_counter() - t0
    assert out["summaries"].num_rows == 100_000
    assert dt < 300, f"analyze of 1e5 runs took {dt:.1f}s"
