"""The Python API (``import phasesweep``): light to import, the CLI's operations as functions,
checked against the lower layers and against plain pandas."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import duckdb
import numpy as np
import pandas as pd
import pytest
from conftest import TINY_SPEC
from phasesweep.pipeline.grid import expand as grid_expand
from phasesweep.storage import Store, run_query

import phasesweep
from phasesweep import analysis

GRID = {"init_scale": [0.01, 0.1, 1.0, 3.0], "width": [16, 256], "depth": [2], "seed": [0, 1]}


@pytest.fixture(scope="module")
def store(synthetic_store) -> Store:
    s, _ = synthetic_store("synth", GRID)
    return s


@pytest.mark.process
def test_import_is_light_and_every_public_name_resolves():
    code = (
        "import sys, json, phasesweep\n"
        "heavy = ['torch', 'ray', 'duckdb', 'matplotlib', 'pandas', 'pyarrow']\n"
        "before = [m for m in heavy if m in sys.modules]\n"
        "phasesweep.load_spec, phasesweep.SpecError\n"
        "after_spec = [m for m in heavy if m in sys.modules]\n"
        "print(json.dumps([before, after_spec, phasesweep.__all__]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after_spec, names = json.loads(out.stdout)
    assert before == [] and "torch" not in after_spec and "ray" not in after_spec
    assert names == phasesweep.__all__ and "__version__" in names
    for name in names:
        if name == "draw" and not hasattr(analysis, "draw"):
            continue  # the figures API arrives with its own branch; see test_draw_into_axes
        assert getattr(phasesweep, name) is not None, name
        assert name == "__version__" or getattr(phasesweep, name).__doc__, name
    assert set(names) <= set(dir(phasesweep))
    with pytest.raises(AttributeError, match="no_such_name"):
        phasesweep.no_such_name  # noqa: B018


def test_load_spec_applies_overrides_and_names_bad_keys(tmp_path):
    spec = phasesweep.load_spec(TINY_SPEC, ["train.steps=7", "grid.seed=[0, 1, 2, 3]"])
    assert spec.train.steps == 7 and spec.grid["seed"] == [0, 1, 2, 3]
    assert TINY_SPEC["train"]["steps"] == 20  # the caller's dict is not changed
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(TINY_SPEC))  # JSON is YAML
    assert phasesweep.load_spec(path, ["train.steps=7"]) == spec.model_copy(
        update={"grid": TINY_SPEC["grid"]}
    )
    with pytest.raises(phasesweep.SpecError, match=r"model\.width = -3"):
        phasesweep.load_spec(TINY_SPEC, ["model.width=-3"])


def test_expand_and_plan_match_the_pipeline_and_write_nothing(tmp_path):
    points = phasesweep.expand(TINY_SPEC)
    assert len(points) == np.prod([len(v) for v in TINY_SPEC["grid"].values()])
    spec = phasesweep.load_spec(TINY_SPEC)
    assert [p.run_id for p in points] == [p.run_id for p in grid_expand(spec)]
    missing = tmp_path / "store"
    plan = phasesweep.plan(spec, missing, cpus_per_trial=1)
    assert len(plan.todo) == len(points) and plan.skipped == 0
    assert sorted(p.run_id for c in plan.chunks for p in c.points) == sorted(
        p.run_id for p in points
    )
    assert not missing.exists()


def test_connect_is_read_only_with_the_views(store, tmp_path):
    con = phasesweep.connect(store)
    try:
        names = sorted(r[0] for r in con.sql("SHOW TABLES").fetchall())
        assert names == sorted(phasesweep._api.TABLES)
        sql = "SELECT run_id, status FROM runs ORDER BY run_id"
        assert con.sql(sql).fetchall() == run_query(store, sql)[1]
        with pytest.raises(duckdb.Error, match="ermission"):
            con.sql(f"COPY runs TO '{tmp_path}/out.parquet'")
        with pytest.raises(duckdb.Error, match="locked"):
            con.sql("SET enable_external_access = true")
    finally:
        con.close()
    assert not (tmp_path / "out.parquet").exists()


def test_table_by_name_sweep_and_sql(store):
    runs = phasesweep.table("runs", store)
    _, rows = run_query(store, "SELECT run_id FROM runs")
    assert sorted(runs["run_id"]) == sorted(r[0] for r in rows)
    one = phasesweep.table("runs", store.uri, sweep="synth")

    def by_id(df):
        return df.sort_values("run_id").reset_index(drop=True)

    pd.testing.assert_frame_equal(by_id(runs), by_id(one))
    counts = phasesweep.table(
        "SELECT status, count(*) AS n FROM runs GROUP BY status ORDER BY status", store
    )
    assert dict(zip(counts["status"], counts["n"])) == runs["status"].value_counts().to_dict()
    with pytest.raises(phasesweep.SpecError, match="only applies to a table name"):
        phasesweep.table("SELECT 1", store, sweep="synth")
    with pytest.raises(duckdb.Error):
        phasesweep.table("SELECT * FROM runz", store)


def test_unknown_sweep_and_missing_store_errors(store, tmp_path):
    for call in (
        lambda: phasesweep.status("synht", store),
        lambda: phasesweep.table("runs", store, sweep="synht"),
        lambda: phasesweep.phase_diagram("synht", store),
        lambda: phasesweep.analyze("synht", store),
        lambda: phasesweep.plot("synht", store),
        lambda: phasesweep.report("synht", store),
        lambda: phasesweep.verify("synht", store),
        lambda: phasesweep.compact("synht", store),
    ):
        with pytest.raises(phasesweep.UnknownSweepError, match="did you mean 'synth'") as e:
            call()
        assert e.value.close == ["synth"]
    missing = tmp_path / "nothing"
    with pytest.raises(phasesweep.StoreError, match="no store there") as e:
        phasesweep.table("runs", missing)
    assert e.value.uri == str(missing) and not missing.exists()


def test_verify_and_compact_keep_every_answer(synthetic_store):
    store, _ = synthetic_store("kept", GRID)
    sql = "SELECT * FROM runs WHERE sweep = 'kept' ORDER BY run_id"
    before = phasesweep.table(sql, store)
    report = phasesweep.verify("kept", store)
    assert report.ok and report.problems == [] and report.actions == []
    assert phasesweep.compact("kept", store).actions == []  # one chunk: nothing to merge
    assert phasesweep.verify(None, store).ok
    pd.testing.assert_frame_equal(phasesweep.table(sql, store), before)
    with pytest.raises(phasesweep.SpecError, match="invalid argument: SWEEP"):
        phasesweep.verify("Bad Name", store)


def test_no_standing_ray_to_show_or_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("PHASESWEEP_STANDING_DIR", str(tmp_path / "standing"))
    assert phasesweep.standing_address() is None
    assert phasesweep.stop_standing() is False
    assert not (tmp_path / "standing").exists()


def test_phase_diagram_equals_a_pandas_groupby(synthetic_store):
    store, _ = synthetic_store("pd", GRID)
    counts = phasesweep.analyze("pd", store)
    assert counts["summaries"] == len(phasesweep.table("runs", store))
    cells = phasesweep.phase_diagram("pd", store, x="init_scale", y="width")
    runs = phasesweep.table("runs", store, sweep="pd")
    summaries = phasesweep.table("summaries", store, sweep="pd")
    df = runs.merge(summaries[["run_id", "final_kernel_distance"]], on="run_id", how="left")
    done = df[df["status"] == "completed"]
    expected = done.groupby(["init_scale", "width"])["final_kernel_distance"].mean()
    n_runs = df.groupby(["init_scale", "width"]).size()
    assert len(cells) == len(n_runs) == len(GRID["init_scale"]) * len(GRID["width"])
    for cell in cells.itertuples():
        key = (cell.x, cell.y)
        assert cell.n_runs == n_runs[key]
        if key in expected.index:
            assert cell.value == pytest.approx(expected[key], rel=1e-12)
        else:  # every run of the cell diverged: counted, never averaged
            assert pd.isna(cell.value) and cell.n_diverged == cell.n_runs
    with pytest.raises(phasesweep.SpecError, match="unknown phase-diagram axis"):
        phasesweep.phase_diagram("pd", store, x="colour")


@pytest.mark.skipif(not hasattr(analysis, "draw"), reason="the figures branch adds draw")
def test_draw_into_given_axes(synthetic_store):
    from matplotlib import pyplot as plt

    store, _ = synthetic_store("drawn", GRID)
    phasesweep.analyze("drawn", store)
    fig, ax = plt.subplots()
    try:
        returned = phasesweep.draw("loss_curves", store, "drawn", ax=ax, where="width = 16")
        # drawn in the given Axes' place: a subfigure of the same figure holds it
        assert returned is fig and ax not in fig.axes
        assert [a for a in fig.subfigs[-1].axes if a.lines]
        # a faceted figure takes the given Axes' place with its panels, in the same figure
        fig, ax = plt.subplots()
        returned = phasesweep.draw("loss_curves", store, "drawn", ax=ax, facet="width")
        panels = [a for a in fig.axes if a.lines]
        assert returned is fig and len(panels) > 1
    finally:
        plt.close("all")


@pytest.mark.ray
def test_run_and_status_through_the_api(tmp_path):
    import ray

    spec = copy.deepcopy(TINY_SPEC)
    store = tmp_path / "store"
    try:
        outcome = phasesweep.run(spec, store, overrides=["train.steps=10"], progress=False)
        planned = phasesweep.plan(spec, store, overrides=["train.steps=10"])
        again = phasesweep.execute(planned, progress=False)  # run = execute(plan(...))
    finally:
        ray.shutdown()
    assert outcome.trained == 6 and not outcome.failed
    assert again.trained == 0 and again.skipped == 6
    status = phasesweep.status("tiny", store)
    assert status.total == 6 and status.done == 6
    assert run_query(store, "SELECT count(*), max(steps) FROM runs")[1] == [(6, 10)]
