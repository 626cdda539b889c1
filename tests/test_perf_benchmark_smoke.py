"""The benchmark suite's pieces at toy size: structure and consistency, never speed.

Keeps ``benchmarks/`` from rotting: the grid, the plain baselines (which must train
exactly what phasesweep trains), the store benchmark and the report. The Ray pieces
run in their own test.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed

from benchmarks import run as bench  # noqa: E402
from benchmarks import store_bench, training  # noqa: E402


def test_grid_is_the_stated_one():
    spec = training.grid_spec(256, 2000)
    points = training.grid_points(spec)
    assert len(points) == 256 and len({p.run_id for p in points}) == 256
    cfg = points[0].config
    assert (cfg.model.depth, cfg.model.width, cfg.data.n_train, cfg.train.steps) == (
        3,
        64,
        128,
        2000,
    )
    assert cfg.train.optimizer == "gd" and cfg.train.dtype == "float64"
    assert "256 points" in training.describe(spec, 256)
    sub = training.subset(points, 32)
    assert len({p.run_id for p in sub}) == 32 and sub[0] is points[0] and sub[-1] is points[-1]


def test_plain_baseline_trains_what_phasesweep_trains():
    spec = training.grid_spec(4, 12, width=8, n_train=16, log_points=5)
    points = training.grid_points(spec)
    ps = training.phasesweep_inprocess(points)
    plain = training.plain_loop(points[:2])
    assert training.max_rel_diff(plain["final_loss"], ps["final_loss"]) < 1e-9
    reported = []
    training.plain_train(points[0].config, report=lambda *a: reported.append(a))
    assert [r[0] for r in reported] == training.log_steps_of(spec).tolist()
    assert ps["points"] == 4 and ps["trajectory_rows"] == 4 * len(reported)
    assert set(ps) >= {"wall_s", "train_s", "metrics_s", "other_s", "train_flop_rate", "block"}
    assert ps["train_s"] > 0 and ps["metrics_s"] > 0 and ps["wall_s"] >= ps["train_s"]


def test_matmul_peak_reports_a_rate():
    peak = training.matmul_peak(sizes=(64,), seconds=0.01)
    assert peak["flops"] > 0 and peak["size"] == 64 and peak["threads"] == 1


def test_store_benchmark_counts_rows_and_answers_the_query(tmp_path):
    from phasesweep.storage.schema import log_steps

    r = store_bench.store_benchmark(
        str(tmp_path / "s"), rows=4000, chunk_rows=2000, steps=50, log_points=10
    )
    per_run = len(log_steps(50, 10))
    assert r["rows"] == r["catalog_rows"] and r["rows"] >= 2000
    assert r["chunks"] == 2 and r["min_row_group_rows"] == r["rows_per_chunk"]
    assert r["query_runs"] * per_run == r["rows"]  # one final step per run
    assert 0 < r["query_cells"] <= 64 and r["bytes_per_row"] > 0
    tables = store_bench.synthetic_chunk(0, 3, 50, 10, np.random.default_rng(0))
    assert tables["runs"].num_rows == 3
    assert tables["trajectories"].column("transversal_grad_sq").null_count == (
        tables["trajectories"].num_rows
    )


def test_toy_run_without_ray_writes_a_consistent_report(tmp_path):
    rep = bench.run("toy", with_ray=False, out_dir=tmp_path)
    data = json.loads((tmp_path / "toy.json").read_text())
    md = (tmp_path / "toy.md").read_text()
    assert data["meta"]["grid"].startswith("4 points")
    keys = {t["target"] for t in data["targets"]}
    assert keys == {k for k, *_ in bench.TARGETS} - {"speedup_vs_ray_tune", "speedup_vs_plain_loop"}
    for t in data["targets"]:
        assert isinstance(t["met"], bool) and math.isfinite(t["measured"])
        assert t["description"] in md
    assert "(c) dense matmul peak" in md and "targets met" in md
    assert len(rep.figures) == len(data["figures"])
    assert "final_loss" not in json.dumps(data["raw"])  # per-run values are not kept


@pytest.mark.timeout(600)
@pytest.mark.ray
def test_ray_pieces_at_toy_size(tmp_path):
    """(a) and phasesweep end to end through Ray Tune, both training the same points."""
    spec = training.grid_spec(4, 12, width=8, n_train=16, log_points=5, name="toy")
    points = training.grid_points(spec)
    ps = training.phasesweep_inprocess(points)
    try:
        training.ray_init()
        a = training.ray_tune_baseline(points[:2])
        assert a["points"] == 2 and training.max_rel_diff(a["final_loss"], ps["final_loss"]) < 1e-9
        e2e = training.phasesweep_ray(points, spec, str(tmp_path / "store"), n_trials=2)
        assert e2e["chunks"] == 2 and e2e["trajectory_rows"] == ps["trajectory_rows"]
    finally:
        import ray

        ray.shutdown()


# -- the shape suite (benchmarks/shapes.py) -------------------------------------------------


def test_shape_suite_spans_the_stated_shapes():
    from phasesweep.pipeline.data._datasets import data_seed

    from benchmarks import shapes

    full = shapes.FULL
    assert 10 <= len(full) <= 14
    assert (min(s.n for s in full), max(s.n for s in full)) == (64, 4096)
    assert (min(s.d for s in full), max(s.d for s in full)) == (10, 784)
    assert (min(s.width for s in full), max(s.width for s in full)) == (16, 4096)
    assert (min(s.depth for s in full), max(s.depth for s in full)) == (2, 8)
    assert {s.activation for s in full} == {"linear", "relu", "tanh"}
    assert {s.shared for s in full} == {True, False}
    for s in full + shapes.QUICK:
        points = training.grid_points(s.spec())
        assert len(points) == s.points and 1 <= s.baseline_points <= s.points
        cfg = points[0].config
        assert (cfg.data.n_train, cfg.data.input_dim, cfg.model.width) == (s.n, s.d, s.width)
        data_seeds = {data_seed(p.config.data, p.config.train.seed) for p in points}
        assert len(data_seeds) == (1 if s.shared else s.points)


@pytest.mark.parametrize(
    "activation,depth,shared", [("relu", 2, True), ("tanh", 3, False), ("linear", 2, True)]
)
def test_numpy_baseline_trains_what_phasesweep_trains(activation, depth, shared):
    from benchmarks import shapes

    shape = shapes.Shape(24, 40, 8, depth, activation, shared, 3, 15, 3)
    points = training.grid_points(shape.spec())
    ps = training.phasesweep_inprocess(points)
    numpy_final = {p.run_id: shapes.numpy_train(p.config) for p in points}
    assert training.max_rel_diff(numpy_final, ps["final_loss"]) < 1e-8
    assert all(math.isfinite(v) and v > 0 for v in numpy_final.values())


def test_numpy_baseline_refuses_what_it_does_not_train():
    from benchmarks import shapes

    cfg = training.grid_points(shapes.Shape(8, 4, 4, 2, "relu", True, 1, 2, 1).spec())[0].config
    biased = cfg.model_copy(update={"model": cfg.model.model_copy(update={"bias": True})})
    with pytest.raises(ValueError, match="bias-free"):
        shapes.numpy_train(biased)
    odd = cfg.model_copy(
        update={"model": cfg.model.model_copy(update={"activation": "leaky_relu"})}
    )
    with pytest.raises(ValueError, match="activation"):
        shapes.numpy_train(odd)


@pytest.mark.timeout(600)
@pytest.mark.heavy
def test_toy_shape_suite_writes_a_consistent_report(tmp_path):
    from benchmarks import shapes

    toy = [
        shapes.Shape(24, 40, 8, 2, "relu", True, 4, 5, 2),
        shapes.Shape(16, 5, 8, 3, "tanh", False, 3, 5, 3),
        shapes.Shape(20, 6, 8, 3, "linear", False, 3, 5, 3),  # the factored step
    ]
    # the device pass on CPU tensors: the code a GPU runs, checked against the CPU grids
    rep = shapes.run("toy", toy, workers=2, peak_seconds=0.02, out_dir=tmp_path, device="cpu")
    data = json.loads((tmp_path / "shapes.toy.json").read_text())
    md = (tmp_path / "shapes.toy.md").read_text()
    assert (
        [r["shape"] for r in data["shapes"]]
        == [s.name for s in toy]
        == [r["shape"] for r in rep["shapes"]]
    )
    assert data["blas"]["numpy"] != "unknown" and data["blas"]["torch"] != "unknown"
    assert data["blas"]["numpy_threads"] == [1] and data["blas"]["torch_threads"] == 1
    for r in data["shapes"]:
        assert r["numpy_max_rel_diff"] < 1e-8 and r["torch_max_rel_diff"] < 1e-8
        for key in ("flop_rate", "peak_fraction", "speedup_vs_numpy", "speedup_vs_torch"):
            assert math.isfinite(r[key]) and r[key] > 0, key
        assert math.isclose(r["peak_fraction"], r["flop_rate"] / data["peak_flops"])
        assert len(r["block"]) == 2 and r["shape"] in md
        factored = r["activation"] == "linear"
        assert (r["block"] == ["factored"] * 2) == factored
        # its FLOPs are its own, fewer than the backpropagation the loops compute
        flops = r["flop_rate"] * r["phasesweep_train_s"]
        assert (flops < r["model_flops"]) if factored else math.isclose(flops, r["model_flops"])
    assert "of peak" in md and data["blas"]["numpy"] in md
    assert all(r["met"] and r["met"] in md for r in data["shapes"])
    assert all("final_loss" not in r for r in data["shapes"])
    dev = data["device"]
    assert [g["shape"] for g in dev["shapes"]] == [s.name for s in toy]
    for g in dev["shapes"]:
        assert g["max_rel_diff_vs_cpu"] < 1e-10  # same float64 training on one device
        assert g["member_steps_per_s"] > 0 and g["peak_fraction"] > 0
        assert g["block"] == "factored" or g["block"] >= 1
        assert g["shape"] in md.split("## On cpu", 1)[1]


def test_shape_targets_follow_the_issue():
    """≥ 50 % of the peak only where every hidden GEMM is 64³ or more; ≥ 2× numpy where
    numpy runs below 40 % of the peak, else never slower."""
    from benchmarks import shapes

    row = {"n": 128, "d": 64, "width": 64, "flop_rate": 40.0, "phasesweep_train_s": 2.0}
    row |= {"model_flops": 80.0, "block": [6, 6]}
    # numpy: 80 FLOP in 2 s of 2 workers = 20 FLOP/s a core, 20 % of a peak of 100
    got = shapes.targets({**row, "numpy_wall_s": 2.0, "speedup_vs_numpy": 1.9}, 100.0, 2)
    assert math.isclose(got["numpy_peak_fraction"], 0.2) and math.isclose(got["peak_fraction"], 0.4)
    assert got["met"] == "peak ≥ 50%: **no**; × numpy ≥ 2: **no**"
    fast_numpy = {**row, "d": 10, "numpy_wall_s": 0.5, "speedup_vs_numpy": 1.0}
    assert shapes.targets(fast_numpy, 100.0, 2)["met"] == "× numpy ≥ 1: yes"
    # the factored linear step: 4 FLOP of its own where the loop backpropagates 80; numpy's
    # fraction counts the 80, and the peak target does not apply (no 64³ GEMM is computed)
    factored = {**row, "flop_rate": 2.0, "block": ["factored"] * 2}
    got = shapes.targets({**factored, "numpy_wall_s": 2.0, "speedup_vs_numpy": 20.0}, 100.0, 2)
    assert math.isclose(got["numpy_peak_fraction"], 0.2) and math.isclose(
        got["peak_fraction"], 0.02
    )
    assert got["met"] == "× numpy ≥ 2: yes"


@pytest.mark.timeout(900)
@pytest.mark.ray
@pytest.mark.process
def test_launch_benchmark_at_one_repeat(tmp_path):
    """Every launch of the fixed-cost benchmark trains and stores its sweep; the fixed cost
    is the wall time less the training time, and the standing Ray is stopped at the end."""
    from benchmarks import launch

    result = launch.run(1, tmp_path)
    md = (tmp_path / "quick.launch.md").read_text()
    assert set(result["median"]) == {"import", "embedded", "embedded_again", "standing"}
    for name, row in result["median"].items():
        assert row["wall_s"] > 0 and math.isclose(
            row["fixed_s"], row["wall_s"] - row.get("training_s", 0)
        )
        assert row["ratio_to_import"] > 0 and launch.LABELS[name] in md
        if name != "import":
            assert 0 < row["training_s"] < row["wall_s"]
    assert result["standing_first"]["training_s"] > 0
    # the standing Ray is stopped and its folder removed: no process runs from it
    folder = result["standing_dir"]
    assert not Path(folder).exists()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert folder not in cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue


@pytest.mark.timeout(900)
@pytest.mark.ray
@pytest.mark.process
def test_scale_benchmark_at_toy_size(tmp_path):
    """Every piece of benchmarks/scale.py at toy size: the dry run, the per-point phases
    (the pipeline's and the trainer's shares), both launches storing every point once, and
    the table that reports them."""
    from benchmarks import scale

    report = scale.run("toy", tmp_path)
    assert [p["points"] for p in report["plan"]] == [1000]
    assert all(p["seconds"] > 0 and p["MiB"] > 50 for p in report["plan"])
    pp = report["per_point"]
    phases = {"plan", "expand", "claim", "done-check", "set-up", "train", "metrics", "tables"}
    assert phases | {"write"} <= set(pp) and all(pp[k] > 0 for k in phases)
    assert math.isclose(pp["pipeline"], sum(pp[k] for k in scale.PIPELINE))
    assert math.isclose(pp["trainer_beside_steps"], sum(pp[k] for k in scale.BESIDE_STEPS))
    assert {*scale.PIPELINE, *scale.BESIDE_STEPS, "train"} == phases | {"write"}
    long = report["per_point_100_steps"]
    assert pp["chunk_points"] == long["chunk_points"] == [40, 40]
    assert long["train"] > pp["train"]  # ten times the steps
    trainer = {x["trainer"] for x in (pp, long)}
    assert trainer == {x["trainer_beside_steps"] + x["train"] for x in (pp, long)}
    assert math.isclose(report["trainer_ratio"], 10 * pp["trainer"] / long["trainer"])
    small, large = report["launch"]
    assert (small["stored"], large["stored"]) == (40, 400)
    assert all(0 < x["driver_MiB"] < x["MiB"] for x in report["launch"])  # Ray's share too
    assert small["points"] * small["steps"] == large["points"] * large["steps"]  # member-steps
    assert math.isclose(report["launch_ratio"], large["seconds"] / small["seconds"])
    md = (tmp_path / "toy.scale.md").read_text()
    assert "| launch ratio (more points / fewer) |" in md and "per point, pipeline" in md
    assert "| trainer's ratio" in md and "100 steps (chunks of 40 and 40)" in md
    assert json.loads((tmp_path / "toy.scale.json").read_text())["launch"] == report["launch"]
