"""benchmarks/gpu.py at toy size on the CPU: structure and consistency, never speed.

Between GPU runs this keeps the code path it measures, and its report, from rotting: the
same planner, trainer paths (device clock, packed copies, one metrics block, spectra by
batched matmuls) and Parquet writes a GPU run takes, on CPU tensors.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed

from benchmarks import gpu  # noqa: E402


def test_toy_grid_on_the_cpu_writes_a_consistent_report(tmp_path):
    report = gpu.run(
        "quick", "cpu", members=32, widths=(8,), depths=(2,), steps=60, log_points=5,
        agree=4, peak_seconds=0.02, out_dir=tmp_path,
    )  # fmt: skip
    data = json.loads((tmp_path / "gpu.quick.json").read_text())
    md = (tmp_path / "gpu.quick.md").read_text()
    assert data == json.loads(json.dumps(report)) and data["name"] == "cpu"
    assert [(r["width"], r["depth"], r["metrics"]) for r in data["rows"]] == [
        (8, 2, "off"),
        (8, 2, "default"),
    ]
    off, default = data["rows"]
    for r in data["rows"]:
        assert r["members"] == 32 and r["grid_points"] == gpu.INIT_SCALES * gpu.SEEDS
        assert math.isclose(r["member_steps_per_s"], 32 * 60 / r["train_s"])
        parts = ("expansion_s", "setup_s", "train_s", "metrics_s", "tables_s", "write_s")
        assert all(r[p] > 0 for p in parts) and r["chunk_s"] >= sum(r[p] for p in parts) * 0.999
        assert math.isclose(r["grid_s"], r["chunk_s"] * r["grid_points"] / 32)
        assert math.isclose(r["us_per_point"]["setup"], r["setup_s"] * 1e6 / 32)
        assert r["peak_bytes"] is None and r["planned_bytes"] > 0 and r["peak_fraction"] > 0
        assert r["write_1_thread_s"] > 0 and r["write_threads"] == gpu.WRITE_THREADS
        assert list(r["host_kernel"]) == list(gpu.PHASES)
        kernel = r["host_kernel"].values()
        assert all(k["system_s"] >= 0 and k["minor_faults"] >= 0 for k in kernel)
        assert sum(k["system_s"] for k in kernel) <= r["chunk_s"] + r["write_1_thread_s"]
    assert default["metrics_s"] > off["metrics_s"]
    (kernels,) = data["kernels"]
    # the CPU has no kernels or launches; its host dispatches the step's operators
    assert kernels["kernels_per_step"] == kernels["launches_per_step"] == 0
    assert 10 < kernels["host_ops_per_step"] < 200
    (agree,) = data["agreement"]
    assert agree["points"] == 4 and agree["null_mismatches"] == 0
    assert agree["columns"] == len(agree["per_column"]) > 50
    assert 0 < agree["max_rel_diff"] < 1e-12  # the spectra: batched matmuls against LAPACK
    exact = {c for c, d in agree["per_column"].items() if d["max_rel_diff"] == 0}
    assert {"trajectories.train_loss", "trajectories.kernel_distance", "runs.status"} <= exact
    assert "## Agreement with the CPU" in md and agree["worst_column"] in md
    chunk_table = md.split("\n\n")[3].splitlines()  # header, rule, a row per chunk
    assert len(chunk_table) == 4 and len({line.count("|") for line in chunk_table}) == 1
    kernel_table = md.split("## The host kernel's part")[1].split("\n\n")[1].splitlines()
    assert len(kernel_table) == 4 and len({line.count("|") for line in kernel_table}) == 1


def test_column_differences_sees_a_changed_value_and_a_moved_null():
    import pyarrow as pa
    import pyarrow.compute as pc

    points = gpu.training.grid_points(gpu.spec_for(4, 8, 2, 30, 4))
    a = gpu.ChunkTrainer(gpu.Chunk("c", tuple(points))).run()
    assert all(
        d == {"max_rel_diff": 0.0, "null_mismatches": 0}
        for d in gpu.column_differences(a, a).values()
    )
    t = a["trajectories"]
    i = t.column_names.index("test_loss")
    loss = t.column("test_loss")
    moved = pc.if_else(
        pa.array([j == 0 for j in range(t.num_rows)]), None, pc.multiply(loss, 1.001)
    )
    b = {**a, "trajectories": t.set_column(i, "test_loss", moved)}
    d = gpu.column_differences(a, b)["trajectories.test_loss"]
    assert d["null_mismatches"] == 1 and 0.0005 < d["max_rel_diff"] < 0.002


def test_metrics_work_splits_the_accelerated_metrics_by_method(tmp_path):
    from benchmarks import metrics_work

    assert metrics_work.main(["--members", "8", "--steps", "40", "--out", str(tmp_path)]) == 0
    r = json.loads((tmp_path / "metrics_work.json").read_text())
    methods = r["methods"]
    assert set(methods) == {label for _, _, label in metrics_work.METHODS}
    assert all(m["calls"] > 0 and m["flops_per_member"] > 0 for m in methods.values())
    assert r["training_flops_per_member"] > 0
    # the clock is known ahead: every logged step's predictor in one block of n_train + 1
    assert methods["kernel predictor (integrals)"]["calls"] == 1
    assert methods["ntk"]["calls"] > 10  # once per logged step, and the predictor's set-up
    assert r["timing"]["metrics_s"] > 0 and r["members"] == 8


@pytest.mark.process
def test_two_trials_per_card_report_their_points_per_second_against_one(tmp_path):
    """benchmarks/gpu_pair.py: one trial process, then two at once, each a warm-up chunk
    and two timed ones of 16 members; the report's counts and ratios add up."""
    from benchmarks import gpu_pair

    argv = ["--device", "cpu", "--members", "16", "--steps", "20", "--out", str(tmp_path)]
    assert gpu_pair.main(argv) == 0
    report = json.loads((tmp_path / "gpu_pair.json").read_text())
    one, two = report["rows"]
    assert [(r["trials"], r["points"]) for r in report["rows"]] == [(1, 32), (2, 64)]
    for r in report["rows"]:
        assert r["seconds"] > 0 and math.isclose(r["rate"], r["points"] / r["seconds"])
        assert math.isclose(r["grid_s"], report["grid_points"] / r["rate"])
    assert report["grid_points"] == gpu.INIT_SCALES * gpu.SEEDS
    assert math.isclose(report["speedup"], two["rate"] / one["rate"])
