"""Scale: ``.venv/bin/python -m benchmarks.scale [--quick]``.

What a sweep of 10⁶–10⁷ tiny trainings costs beyond its training, on this machine:

- **plan**: ``phasesweep run --dry-run`` of 10⁶ and 10⁷ points: wall time and peak
  RSS of the process (the plan holds chunk descriptors, never a list of points);
- **per point**: one chunk of each group of the launch grid (width 16 and 32), cut as
  a launch cuts it, trained in one process after another of the same group (which pays
  the first calls' costs), CPU time per point of each phase, averaged over the groups:
  plan (the whole grid's, per point), expand (the trial builds its points), claim,
  done-check, set-up (data and initial weights), train (the step loop), metrics
  (logged steps), tables and write (the Parquet commit). The pipeline's
  cost per point (target ≤ 100 µs) is plan, expand, claim, done-check and write: what
  a launch adds per point to the trainer; set-up, metrics and tables are the trainer's
  own per-point work beside its step loop. Measured at 10 and at 100 steps: the
  trainer's ratio, 10 × its CPU per point at 10 steps over that at 100, is what the
  launch ratio below would be if the pipeline, Ray and Tune cost nothing;
- **launch**: ``phasesweep run`` of the same member-steps twice, 10⁵ points × 100
  steps and 10⁶ points × 10 steps (the full mode; a tenth of each in ``--quick``):
  wall times, their ratio (target ≤ 1.5: per-point cost is small beside training),
  and the peak of the summed RSS of the launch's process tree (driver, Ray's
  processes, trials; target ≤ 3 GiB), sampled every 0.2 s;
- **analysis**: ``analyze``, ``plot``, ``report``, ``status`` and ``query`` of a
  synthetic sweep of 10⁵ and 10⁶ runs (:mod:`benchmarks.scale_analysis`).

The launch grid is the issue's: a depth-2 bias-free ReLU net of width 16 or 32, 10 init
scales, n_train 64, input_dim 10, full-batch GD, metrics off (no NTK, spectra,
transversal or kernel predictor) and ``log_points: 2`` (steps 0, 1 and the last are
logged: a sweep after final states), seeds to fill the grid. Results go to
``benchmarks/results/{mode}.scale.{json,md}``. Run it on an idle machine: it times
whole processes.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

#: Targets of the scale issue.
RATIO_TARGET = 1.5
RSS_TARGET_GIB = 3.0
PLAN_TARGET = {"seconds": 10.0, "MiB": 500.0}  # a 10^7-point dry run


#: The per-point phases that make the pipeline's cost, and the trainer's beside its steps.
PIPELINE = ("plan", "expand", "claim", "done-check", "write")
BESIDE_STEPS = ("set-up", "metrics", "tables")


def grid_spec(name: str, points: int, steps: int) -> dict[str, Any]:
    """The launch grid of ``points`` points (a multiple of 20) trained ``steps`` steps."""
    if points % 20:
        raise ValueError(f"points must be a multiple of 20, not {points}")
    return {
        "name": name,
        "model": {"depth": 2, "width": 16, "activation": "relu", "parameterization": "ntk"},
        "data": {"kind": "teacher", "n_train": 64, "input_dim": 10},
        "train": {"lr": 0.05, "steps": steps, "log_points": 2},
        "metrics": {"ntk": False, "spectra": False, "transversal": False, "linearized": False},
        "analysis": {"at_time": None},
        "execution": {"max_points": max(points, 10**7)},
        "grid": {
            "init_scale": {"logspace": [-2, 0, 10]},
            "width": [16, 32],
            "seed": {"range": [0, points // 20]},
        },
    }


def measured(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``cmd``; its wall time, the peak of the summed RSS of its process tree and the
    peak RSS of its own process (the driver), sampled every 0.2 s, in seconds and MiB.
    Fails loudly if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    root = psutil.Process(proc.pid)
    peak = own = 0
    while proc.poll() is None:
        total = 0
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                rss = p.memory_info().rss
                total += rss
                if p is root:
                    own = max(own, rss)
        peak = max(peak, total)
        time.sleep(0.2)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err[-2000:]}")
    return {
        "seconds": time.perf_counter() - start,
        "MiB": peak / 2**20,
        "driver_MiB": own / 2**20,
        "stderr": err[-500:],
    }


def _write_spec(folder: Path, spec: dict[str, Any]) -> Path:
    path = folder / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def plan(points: int, folder: Path) -> dict[str, float]:
    """``phasesweep run --dry-run`` of a grid of ``points`` points."""
    spec = _write_spec(folder, grid_spec(f"plan{points}", points, 10))
    got = measured(
        [str(BIN / "phasesweep"), "run", str(spec), "--dry-run", "--store", str(folder / "s")]
    )
    return {"points": points, "seconds": got["seconds"], "MiB": got["MiB"]}


def per_point(chunk_points: int | None, steps: int, grid_points: int) -> dict[str, Any]:
    """CPU time per point (µs) of each phase, in this process, of chunks of at most
    ``chunk_points`` members (None: as a launch cuts them): one chunk of each group of
    the grid (width 16 and 32), averaged over the groups, which hold equal shares of the
    grid's points (a width-32 point costs about 1.7 times a width-16 one)."""
    import torch
    from phasesweep.pipeline.grid import Grid, group_tag
    from phasesweep.pipeline.run._plan import expand_task, plan_chunks
    from phasesweep.pipeline.run._trial import stored_reads
    from phasesweep.pipeline.spec import validate_spec
    from phasesweep.pipeline.train._trainer import ChunkTrainer
    from phasesweep.storage import Store
    from phasesweep.storage._claims import Claims

    torch.set_num_threads(1)
    spec = validate_spec(
        {**grid_spec("perpoint", grid_points, steps), "execution": {"max_chunk_size": chunk_points}}
    )
    cpu: dict[str, float] = {}

    def timed(name: str, fn, *args, **kwargs):  # noqa: ANN001, ANN202
        start = time.process_time()
        result = fn(*args, **kwargs)
        cpu[name] = cpu.get(name, 0.0) + time.process_time() - start
        return result

    def chunk_phases(store: Store, task) -> int:  # noqa: ANN001
        chunk = timed("expand", expand_task, grid, task)
        ids = [p.run_id for p in chunk.points]
        group = group_tag(chunk.points[0].config)
        lease, _ = timed("claim", Claims(store, "perpoint", group=group).acquire, ids)
        reads = stored_reads(group, chunk.chunk_id, time.time())
        timed("done-check", store.done_among, "perpoint", ids, reads)
        trainer = timed("set-up", ChunkTrainer, chunk, "cpu")
        start = time.process_time()
        tables = trainer.run()
        run_cpu = time.process_time() - start
        wall = trainer.timing["train_s"] + trainer.timing["metrics_s"] + trainer.timing["other_s"]
        for key, name in (("train_s", "train"), ("metrics_s", "metrics"), ("other_s", "tables")):
            cpu[name] = run_cpu * trainer.timing[key] / wall  # the run's CPU, split as its wall
        timed("write", store.write_chunk, "perpoint", chunk.chunk_id, tables)
        timed("claim", lease.release)
        return len(chunk.points)

    with tempfile.TemporaryDirectory() as folder:
        store = Store.open(folder)
        grid = timed("plan", Grid, spec)
        # at least two chunks of each group: one to warm up on, one to time
        groups = grid.n_groups
        tasks = timed("plan", plan_chunks, grid, min_chunks=2 * groups)
        plan_cpu = cpu["plan"]
        per_group, sizes = [], []
        for _, group_tasks in itertools.groupby(tasks, key=lambda task: task.group):
            timed_task, warm_up = itertools.islice(group_tasks, 2)
            # a trial's first chunk of a shape pays imports and first calls once; time the
            # next, as a trial of a long launch (its actor is reused) trains most chunks
            chunk_phases(store, warm_up)
            cpu.clear()
            n = chunk_phases(store, timed_task)
            per_group.append({name: s / n * 1e6 for name, s in cpu.items()})
            sizes.append(n)
    out = {"plan": plan_cpu / grid_points * 1e6}  # the whole grid's plan, per point
    out |= {name: sum(g[name] for g in per_group) / len(per_group) for name in per_group[0]}
    out["pipeline"] = sum(out[k] for k in PIPELINE)
    out["trainer_beside_steps"] = sum(out[k] for k in BESIDE_STEPS)
    out["trainer"] = out["trainer_beside_steps"] + out["train"]
    out["chunk_points"] = sizes
    return out


def launch(points: int, steps: int, folder: Path) -> dict[str, float]:
    """``phasesweep run`` of the launch grid into a fresh store."""
    spec = _write_spec(folder, grid_spec(f"launch{points}x{steps}", points, steps))
    store = folder / f"store{points}x{steps}"
    cmd = [str(BIN / "phasesweep"), "run", str(spec), "--store", str(store), "--no-progress"]
    got = measured(cmd)
    import pyarrow.dataset as ds

    stored = ds.dataset(store / "runs", format="parquet").count_rows()  # every point, once
    return {
        "points": points,
        "steps": steps,
        "seconds": got["seconds"],
        "MiB": got["MiB"],
        "driver_MiB": got["driver_MiB"],
        "stored": stored,
    }


MODES = {
    "full": {
        "plans": (10**6, 10**7),
        "launch": ((10**5, 100), (10**6, 10)),
        "runs": (10**5, 10**6),
    },
    "quick": {"plans": (10**5, 10**6), "launch": ((10**4, 100), (10**5, 10)), "runs": (10**4,)},
    "toy": {"plans": (1000,), "launch": ((40, 10), (400, 1)), "runs": ()},
}


def run(
    mode: str = "full", out_dir: Path | None = RESULTS, workdir: Path | None = None
) -> dict[str, Any]:
    """Every piece of ``mode``; written to ``out_dir/{mode}.scale.{json,md}`` (if given).
    The analysis stores are built under ``workdir`` and kept there (default: a temporary
    folder, removed at the end)."""
    sizes = MODES[mode]
    report: dict[str, Any] = {
        "mode": mode,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "load": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        report["plan"] = [plan(n, folder) for n in sizes["plans"]]
        chunk = None if mode != "toy" else 40
        report["per_point"] = per_point(chunk, 10, 20 * 10**4)
        report["per_point_100_steps"] = per_point(chunk, 100, 20 * 10**4)
        report["trainer_ratio"] = (
            10 * report["per_point"]["trainer"] / report["per_point_100_steps"]["trainer"]
        )
        report["launch"] = [launch(n, s, folder) for n, s in sizes["launch"]]
        small, large = report["launch"]
        report["launch_ratio"] = large["seconds"] / small["seconds"]
        report["launch_peak_GiB"] = max(x["MiB"] for x in report["launch"]) / 1024
        if sizes["runs"]:
            from benchmarks import scale_analysis

            stores = workdir or folder / "analysis"
            report["analysis"] = [scale_analysis.measure(n, stores) for n in sizes["runs"]]
    report["load_end"] = os.getloadavg()
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{mode}.scale.json").write_text(json.dumps(report, indent=1))
        (out_dir / f"{mode}.scale.md").write_text(markdown(report))
    return report


def markdown(report: dict[str, Any]) -> str:
    """The report as the table committed in ``results/``."""
    lines = [
        f"# Scale ({report['mode']})",
        "",
        f"{report['machine']}; load average {report['load'][0]:.2f} at the start, "
        f"{report['load_end'][0]:.2f} at the end.",
        "",
        "| piece | figure | target |",
        "|---|---|---|",
    ]
    for p in report["plan"]:
        ok = p["points"] < 10**7 or (
            p["seconds"] <= PLAN_TARGET["seconds"] and p["MiB"] <= PLAN_TARGET["MiB"]
        )
        target = "≤ 10 s, ≤ 500 MiB" if p["points"] >= 10**7 else ""
        mark = (" (met)" if ok else " (missed)") if target else ""
        lines.append(
            f"| plan, {p['points']:.0e} points (dry run) | {p['seconds']:.1f} s, "
            f"{p['MiB']:.0f} MiB | {target}{mark} |"
        )
    pp = report["per_point"]
    for steps, x in ((10, pp), (100, report["per_point_100_steps"])):
        phases = ", ".join(f"{k} {x[k]:.1f}" for k in (*PIPELINE, *BESIDE_STEPS, "train"))
        lines.append(
            f"| per point, CPU µs, {steps} steps (chunks of "
            f"{' and '.join(map(str, x['chunk_points']))}) | {phases} | |"
        )
    verdict = "met" if pp["pipeline"] <= 100 else "missed"
    lines.append(
        f"| per point, pipeline ({', '.join(PIPELINE)}) | {pp['pipeline']:.1f} µs "
        f"| ≤ 100 µs ({verdict}) |"
    )
    lines.append(
        f"| per point, trainer beside its steps ({', '.join(BESIDE_STEPS)}) "
        f"| {pp['trainer_beside_steps']:.1f} µs | |"
    )
    for x in report["launch"]:
        lines.append(
            f"| launch {x['points']:.0e} points × {x['steps']} steps | {x['seconds']:.1f} s, "
            f"peak summed RSS {x['MiB'] / 1024:.2f} GiB (driver {x['driver_MiB']:.0f} MiB) "
            f"| ≤ {RSS_TARGET_GIB} GiB |"
        )
    lines.append(
        "| trainer's ratio (10 × its CPU per point at 10 steps / at 100 steps: the launch "
        f"ratio with a free pipeline) | {report['trainer_ratio']:.2f} | |"
    )
    ratio = report["launch_ratio"]
    verdict = "met" if ratio <= RATIO_TARGET else "missed"
    lines.append(
        f"| launch ratio (more points / fewer) | {ratio:.2f} | ≤ {RATIO_TARGET} ({verdict}) |"
    )
    for a in report.get("analysis", []):
        cells = ", ".join(
            f"{cmd} {v['seconds']:.1f} s / {v['MiB']:.0f} MiB" for cmd, v in a["commands"].items()
        )
        lines.append(
            f"| analysis of {a['runs']:.0e} runs | {cells} | ≤ 2 GiB; analyze ≤ 120 s, plot/report ≤ 30 s |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of each size (a few minutes)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    ap.add_argument(
        "--workdir",
        type=Path,
        help="where the analysis part builds its synthetic stores and keeps them for the "
        "next run (default: a temporary folder; 10⁶ runs take minutes to build)",
    )
    args = ap.parse_args(argv)
    report = run("quick" if args.quick else "full", args.out, args.workdir)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
