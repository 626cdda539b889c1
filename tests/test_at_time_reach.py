"""An ``analysis.at_time`` that no run reaches is caught where it is first knowable
(issue 26, item 1): at plan time an exit-2 error naming the key, the grid's final time and
the fix; at ``analyze`` of stored runs a one-line warning with a fix that works.

The final time of a config (:func:`pipeline.grid._horizon.final_time`) is checked against the
trainer's own clock, and the grid's largest final time (found at the grid's corners)
against every point of an expanded grid.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from conftest import TINY_SPEC
from phasesweep.analysis._analyze import Reach
from phasesweep.pipeline import _axes
from phasesweep.pipeline.grid import _grid, expand, make_chunks
from phasesweep.pipeline.grid._horizon import final_time, grid_final_time
from phasesweep.pipeline.spec import SpecError, load_spec_and_raw, validate_spec
from phasesweep.pipeline.train._trainer import train_chunk
from phasesweep.storage import run_query
from test_figures_sweeps import train_into_store

import phasesweep
from phasesweep._cli import main

U = np.finfo(np.float64).eps


@pytest.mark.parametrize(
    "train",
    [
        {"lr_schedule": "constant"},
        {"lr_schedule": "cosine", "lr_min_frac": 0.2},
        {"lr_schedule": "cosine"},
        {"lr_schedule": "norm_adaptive", "lr_c": 0.01},
    ],
    ids=["constant", "cosine", "cosine_to_0", "norm_adaptive"],
)
def test_final_time_is_the_trainers_clock(train):
    scaling = {"lr": 0.1, "lr_scaling": {"init_scale_power": -1.0}}
    spec = validate_spec({**TINY_SPEC, "train": {**TINY_SPEC["train"], **scaling, **train}})
    points = {p.run_id: p for p in expand(spec)}
    for chunk in make_chunks(list(points.values()), spec):
        runs = train_chunk(chunk)["runs"].to_pandas()
        for rid, t in zip(runs["run_id"], runs["final_time"]):
            bound = final_time(points[rid].config)
            steps = points[rid].config.train.steps
            if train["lr_schedule"] == "norm_adaptive":
                # the rule's min(lr, c ||θ||^(2-L)) takes the norm's branch here: below lr·steps
                assert 0 < t < bound * (1 - 1e-3)
            else:  # a sum of `steps` rounded terms against the closed form
                assert abs(t - bound) <= 2 * steps * U * bound


def test_grid_final_time_is_the_largest_over_every_point():
    # every axis that sets the clock, with exponents of both signs (init scales on both
    # sides of 1), so the largest time is not at the largest value of every axis
    grid = {
        "lr": [0.05, 0.01, 0.1],
        "init_scale": {"logspace": [-1, 1, 3]},
        "depth": [2, 3],
        "width": [4, 8],
        "train.steps": {"range": [10, 31, 10]},
        "train.lr_schedule": ["constant", "cosine"],
        "train.lr_min_frac": [0.0, 0.5],
        "train.lr_scaling.init_scale_depth_power": [-2.0, 1.0],
        "train.lr_scaling.width_power": [-1.0, 0.5],
    }
    spec = validate_spec({**TINY_SPEC, "execution": {"max_points": 10**5}, "grid": grid})
    naive = max(final_time(p.config) for p in expand(spec))
    assert grid_final_time(spec) == naive
    # the largest is not simply every axis at its largest value
    top = {k: [max(_axes.axis_values(k, v))] for k, v in grid.items() if k != "train.lr_schedule"}
    assert grid_final_time(validate_spec({**TINY_SPEC, "grid": top})) < naive


def test_grid_final_time_of_a_huge_grid_is_computed_without_expanding_it(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the grid was expanded")

    monkeypatch.setattr(_grid, "iter_points", refuse)
    monkeypatch.setattr(_grid, "expand", refuse)
    spec = validate_spec(
        {
            **TINY_SPEC,
            "train": {"lr": 0.01, "steps": 300, "lr_scaling": {"init_scale_power": -2.0}},
            "execution": {"max_points": 10**8},
            "grid": {"init_scale": {"linspace": [0.1, 1.0, 10_000]}, "seed": {"range": [0, 1000]}},
        }
    )
    assert grid_final_time(spec) == pytest.approx(300 * 0.01 * 0.1**-2, rel=4 * U)


def test_run_with_at_time_past_every_run_exits_2_naming_the_fix(tmp_path, capsys):
    # the README's scaled-down quickstart without its at_time: 300 steps of lr 0.5 end at t = 150
    store = tmp_path / "store"
    args = ["run", "sweeps/quickstart.yaml", "--store", str(store)]
    args += ["--set", "train.steps=300", "--set", "grid.seed=[0]"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "analysis.at_time = 1500" in err and "t = 150 " in err, err
    assert "at most 150," in err and "train.steps to at least 3000" in err, err
    assert not store.exists()  # nothing written
    # the fix it names works
    assert main([*args, "--set", "analysis.at_time=150", "--dry-run"]) == 0
    # the same from Python
    spec, _ = load_spec_and_raw("sweeps/quickstart.yaml", ["train.steps=300", "grid.seed=[0]"])
    with pytest.raises(SpecError, match="analysis.at_time"):
        phasesweep.plan(spec, store)
    assert not store.exists()


def test_at_time_on_a_grid_of_learning_rates_is_checked_against_the_largest(tmp_path, capsys):
    # lr 0.01 ... 0.1 over 100 steps: the runs end at t = 1 ... 10; t = 5 is reached by some
    spec = {**TINY_SPEC, "train": {"steps": 100}, "grid": {"lr": [0.01, 0.1]}}
    assert phasesweep.plan({**spec, "analysis": {"at_time": 10.0}}, tmp_path / "s").todo
    with pytest.raises(SpecError) as e:
        phasesweep.plan({**spec, "analysis": {"at_time": 10.1}}, tmp_path / "s")
    assert "t = 10 " in str(e.value) and "at most 10," in str(e.value)
    assert "train.steps to at least 101," in str(e.value)


def test_analyze_of_stored_runs_warns_in_one_line_and_its_advice_works(
    tmp_path, phasesweep_cli, caplog
):
    # runs stored before the check (or by a norm-adaptive schedule that fell short): the
    # quickstart's at_time 1500 with 200 steps of lr 0.5 (t = 100)
    overrides = ["train.steps=200", "grid.width=[16]", "grid.seed=[0]", "grid.init_scale=[0.1, 1]"]
    store, sweep = train_into_store(tmp_path / "store", "quickstart", overrides)
    proc = phasesweep_cli(["analyze", sweep, "--store", store.root])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "analysis.at_time = 1500" in err and "2 of 2 completed runs" in err, err
    assert "(they end by t = 100)" in err and "regime is NULL" in err, err
    assert "--set analysis.at_time=100 " in err, err
    regimes = run_query(store.root, "SELECT count(regime) FROM summaries")[1]
    assert regimes == [(0,)]
    # the advice: relaunch the same spec with the new at_time (nothing trains), analyze again
    sets = [a for o in overrides for a in ("--set", o)]
    relaunch = ["run", "sweeps/quickstart.yaml", "--store", store.root, "--no-progress", *sets]
    assert main([*relaunch, "--set", "analysis.at_time=100"]) == 0
    with caplog.at_level(logging.WARNING):
        assert main(["analyze", sweep, "--store", store.root]) == 0
    assert not [r for r in caplog.records if "at_time" in r.getMessage()]
    regimes = run_query(store.root, "SELECT count(regime), min(eval_time) FROM summaries")[1]
    assert regimes == [(2, 100.0)]
    assert math.isfinite(regimes[0][1])


def test_reach_counts_completed_runs_and_suggests_a_time_every_run_reaches():
    status = np.array(["completed", "completed", "completed", "diverged", "failed"], dtype=object)
    ends = np.array([1.0 / 3.0, 10.0, np.nan, 0.5, np.nan])
    line = Reach.of(5.0, status, ends).line(5.0)
    # the run without a finite loss does not stop before at_time: it has no end at all
    assert "1 of 3 completed runs (they end by t = 0.333333)" in line
    # rounded down, so the suggested time is reached by the run ending at 1/3
    assert "every run with a finite loss reaches t = 0.333333:" in line
    assert "at_time=0.333333 " in line
    assert Reach.of(1.0 / 3.0, status[:2], ends[:2]).line(1.0 / 3.0) is None
    assert Reach.of(5.0, status, ends).line(None) is None
