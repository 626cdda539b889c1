"""The GPU path at the issue's scale: one device-sized chunk of a 10⁶-point grid, end to end.

    python -m benchmarks.gpu            # on CUDA: about 3 minutes on one H100 or H200
    python -m benchmarks.gpu --quick    # width 16 only, chunks of at most 8,192 members
    python -m benchmarks.gpu --device cpu --members 32 --widths 8 --depths 2 --steps 60
                                        # the same code on the CPU (what the smoke test runs)

The grid: 50 init scales (10^-2 … 10^0.5) × 20,000 seeds = 10⁶ points of a bias-free ReLU
net (NTK parameterization, float64), teacher data (n_train 64, n_test 128, input_dim 10),
full-batch GD for ``--steps`` steps (1000) with ``--log-points`` logged steps (20). For
each width and depth (16 × 2 and 256 × 4), with the metrics off and with the defaults,
the planner's first chunk on this device (``pipeline.run._plan.plan_chunks`` with the
card's memory; ``--members`` caps it), timed piece by piece as a trial runs it:

- expansion (its points from the grid), set-up (the trainer's constructor: data, initial
  weights, learning rates), training and metrics (the trainer's ``train_s``, ``metrics_s``),
  tables (the rest of ``run``) and writing the three tables to Parquet with pyarrow, in
  the store's encoding as a trial does (``storage._parquet.encode_tables``), on one
  thread and on :data:`WRITE_THREADS` (a trial given that many CPUs; the chunk's time
  and the grid's extrapolation count the latter);
- per point: expansion, set-up and tables in µs; member-steps/s of the training; the
  training's FLOP rate against the card's float64 matmul peak, measured here;
- the whole grid's time extrapolated from the chunk (chunk seconds × points / chunk size,
  one trial at a time on the card);
- device memory: the peak measured (``torch.cuda.max_memory_allocated``) against the
  planner's estimate for the chunk (``device_member_bytes`` per member);
- the host kernel's seconds and the minor page faults of each phase: how much of the
  host's per-point work is first touching fresh memory (a chunk's logged rows and tables
  are gigabytes at the planner's chunk sizes).

Then per width and depth: kernels, launches and host operators per non-logged step
(torch.profiler over 16 of them, the step a CUDA graph), and the agreement with the CPU:
the first ``--agree`` points trained on both (spectra at every logged step, 200 steps),
every stored column compared (:func:`column_differences`).

Writes ``gpu.json`` and ``gpu.md`` (``gpu.quick.*`` with ``--quick``) to ``--out``
(``benchmarks/results``). Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from phasesweep.pipeline.grid import Chunk, Grid, Point, flops_per_step, grid_size
from phasesweep.pipeline.grid._cost import device_member_bytes
from phasesweep.pipeline.run._plan import expand_task, plan_chunks
from phasesweep.pipeline.spec import SweepSpec
from phasesweep.pipeline.train._trainer import HOOK_EVERY, ChunkTrainer
from phasesweep.storage._parquet import encode_tables
from phasesweep.storage.schema import log_steps

from benchmarks import training

RESULTS = Path(__file__).resolve().parent / "results"
#: (width, depth) of the nets measured, and the most members of a chunk (None: the planner's).
FULL = {"shapes": ((16, 2), (256, 4)), "members": None}
QUICK = {"shapes": ((16, 2),), "members": 8192}

#: The grid: init scales × seeds (module docstring).
INIT_SCALES, SEEDS = 50, 20_000

#: The metrics of the two runs of a chunk: all off, and the defaults.
METRICS = {"off": {"ntk": False, "spectra": False, "linearized": False}, "default": {}}

#: Threads that encode a chunk's tables in the chunk's time: a GPU trial given as many CPUs
#: (``--cpus-per-trial 3``), one per table (:func:`~storage._parquet.encode_tables`).
WRITE_THREADS = 3

#: Steps of the agreement with the CPU (the CPU trains those points too).
AGREE_STEPS = 200

#: Columns whose round-off is that of another, larger one: the kernel's smallest eigenvalue
#: (zero to round-off for linear nets) that of its largest; the distance of the net from
#: its linearisation that of the outputs.
SCALE_OF = {"ntk_eig_min": "ntk_eig_max", "lin_distance": "output_norm"}
#: Columns that are already relative to a scale of 1 (a ratio to ‖W(0)‖², one minus a
#: cosine), near 0 where the physics makes them small: their round-off is that of 1.
UNIT_SCALE = {"balance_defect", "kernel_distance"}
#: Columns that differ between any two runs, or are the device's own.
UNCOMPARED = {"wall_seconds", "chunk_wall_seconds", "finished_at", "device", "torch_threads"}
KEYS = {
    "runs": ["run_id"],
    "trajectories": ["run_id", "step"],
    "layers": ["run_id", "step", "layer"],
}


def _log(msg: str) -> None:
    print(f"[gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def grid_spec(
    width: int, depth: int, steps: int, log_points: int, metrics: dict, seeds: int = SEEDS
) -> SweepSpec:
    """The benchmark's grid (module docstring): :data:`INIT_SCALES` × ``seeds`` points."""
    return training.grid_spec(
        INIT_SCALES * seeds, steps, width=width, depth=depth, n_train=64, log_points=log_points,
        name="gpu", metrics=metrics, scales=INIT_SCALES, n_test=128,
    )  # fmt: skip


def spec_for(members: int, width: int, depth: int, steps: int, log_points: int, **metrics):
    """A grid of ``members`` points (16 init scales × seeds) of the benchmark's net."""
    return training.grid_spec(
        members, steps, width=width, depth=depth, n_train=64, log_points=log_points,
        name="gpu", metrics=metrics or None,
    )  # fmt: skip


# -- agreement of two runs of one chunk --------------------------------------------------------


def _values(column) -> np.ndarray:
    """A column as float64 values; lists (``top_sv``) flattened, NULLs as NaN."""
    if column.dtype == object:
        return np.concatenate(
            [np.asarray(v, float).ravel() if v is not None else [np.nan] for v in column] or [[]]
        )
    return column.to_numpy(float)


def column_differences(
    a: dict[str, pa.Table], b: dict[str, pa.Table]
) -> dict[str, dict[str, float | int]]:
    """Every stored column of two runs of one chunk, row by row: ``{"table.column":
    {"max_rel_diff": largest |a − b| over the column's scale, "null_mismatches": rows NULL
    in one run only}}``. The scale is the column's largest magnitude in ``a`` (for
    :data:`SCALE_OF`'s columns, the other column's; at least 1 for :data:`UNIT_SCALE`'s);
    text columns (ids, statuses, configs) count 1 where they differ, 0 where they are equal."""
    out: dict[str, dict[str, float | int]] = {}
    for name, keys in KEYS.items():
        x = a[name].to_pandas().sort_values(keys).reset_index(drop=True)
        y = b[name].to_pandas().sort_values(keys).reset_index(drop=True)
        if list(x.columns) != list(y.columns) or len(x) != len(y):
            raise ValueError(f"{name}: the runs stored different rows or columns")
        for col in x.columns:
            if col in UNCOMPARED:
                continue
            if x[col].dtype.kind in "OUS" and col not in (
                "top_sv",
                "delta_top_sv",
                "init_fro_norms",
            ):
                same = x[col].fillna("").astype(str).equals(y[col].fillna("").astype(str))
                out[f"{name}.{col}"] = {"max_rel_diff": float(not same), "null_mismatches": 0}
                continue
            u, v = _values(x[col]), _values(y[col])
            nulls = np.isnan(u) != np.isnan(v)
            scale = np.nanmax(np.abs(_values(x[SCALE_OF.get(col, col)])), initial=0.0)
            if col in UNIT_SCALE:
                scale = max(scale, 1.0)
            diff = np.nanmax(np.where(nulls, np.nan, np.abs(u - v)), initial=0.0)
            out[f"{name}.{col}"] = {
                "max_rel_diff": float(diff / scale) if scale > 0 else float(diff),
                "null_mismatches": int(nulls.sum()),
            }
    return out


def agreement(points: Sequence[Point], device: str) -> dict[str, Any]:
    """The chunk of ``points`` on the CPU and on ``device`` (its accelerator paths):
    :func:`column_differences` and its worst column."""
    chunk = Chunk("agree", tuple(points))
    cpu = ChunkTrainer(chunk, "cpu").run()
    dev = ChunkTrainer(chunk, device, accelerated=True).run()
    columns = column_differences(cpu, dev)
    worst = max(columns, key=lambda c: columns[c]["max_rel_diff"])
    return {
        "points": len(points),
        "columns": len(columns),
        "worst_column": worst,
        "max_rel_diff": columns[worst]["max_rel_diff"],
        "null_mismatches": sum(c["null_mismatches"] for c in columns.values()),
        "per_column": columns,
    }


# -- one size ------------------------------------------------------------------------------------


class _Done(Exception):
    pass


def kernels_per_step(points: Sequence[Point], device: str, window: int = HOOK_EVERY) -> dict:
    """Per non-logged step, over ``window`` of them in a row (profiled from one step-hook
    call to the next, after the step has been captured): kernels the GPU runs, launch
    calls the host makes, operators the host dispatches (top-level ``aten::`` calls)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cfg = points[0].config.train
    logged = set(log_steps(cfg.steps, cfg.log_points).tolist())
    starts = [
        k
        for k in range(2 * window, cfg.steps - window, window)  # the step captured by then
        if not logged & set(range(k, k + window))
    ]
    if not starts:
        return {"note": f"no {window} non-logged steps in a row after warm-up"}
    start = starts[0]
    cuda = torch.device(device).type == "cuda"
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))

    def hook(k: int, state) -> None:  # noqa: ANN001
        if cuda:
            torch.cuda.synchronize()
        if k == start:
            prof.start()
        elif k == start + window:
            prof.stop()
            raise _Done

    with contextlib.suppress(_Done):
        ChunkTrainer(Chunk("kernels", tuple(points)), device, accelerated=True).run(hook)
    events = prof.events()
    kernels = sum(e.device_type == DeviceType.CUDA for e in events)
    launches = sum(e.name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                              "cudaGraphLaunch") for e in events)  # fmt: skip
    ops = sum(
        e.name.startswith("aten::")
        and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        for e in events
    )
    return {
        "window": [start, start + window],
        "kernels_per_step": kernels / window,
        "launches_per_step": launches / window,
        "host_ops_per_step": ops / window,
    }


def _write(tables: dict[str, pa.Table], threads: int) -> float:
    """Seconds to encode ``tables`` as the store does on ``threads`` threads and write each
    file."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for name, data in encode_tables(tables, threads).items():
            Path(folder, f"{name}.parquet").write_bytes(data)
    return time.perf_counter() - started


def grid_chunk(
    width: int,
    depth: int,
    metrics: str,
    device: str,
    steps: int,
    log_points: int,
    members: int | None = None,
) -> dict[str, Any]:
    """The planner's first chunk of the 10⁶-point grid on ``device``, timed piece by piece
    (module docstring); ``metrics``: a key of :data:`METRICS`; ``members``: cap the chunk."""
    spec = grid_spec(width, depth, steps, log_points, METRICS[metrics])
    grid, size = Grid(spec), grid_size(spec)
    cuda = torch.device(device).type == "cuda"
    memory = torch.cuda.get_device_properties(device).total_memory if cuda else None
    tasks = plan_chunks(grid, device_memory=memory)
    task = tasks[0]
    if members is not None and task.size > members:
        task = dataclasses.replace(task, stop=task.start + members)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    usage: list[resource.struct_rusage] = []  # one reading at each phase's bounds

    def mark() -> float:
        usage.append(resource.getrusage(resource.RUSAGE_SELF))
        return time.perf_counter()

    try:
        started = mark()
        chunk = expand_task(grid, task)
        expanded = mark()
        trainer = ChunkTrainer(chunk, device)
        built = mark()
        tables = trainer.run()
        ran = mark()
        write_1_s, write_s = _write(tables, 1), _write(tables, WRITE_THREADS)
        mark()
    except torch.cuda.OutOfMemoryError:
        return {"width": width, "depth": depth, "metrics": metrics, "note": "out of memory"}
    E, cfg = len(chunk.points), chunk.points[0].config
    timing = trainer.timing
    tables_s = (ran - built) - timing["train_s"] - timing["metrics_s"]
    chunk_s = ran - started + write_s
    planned = E * device_member_bytes(cfg)
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    us = 1e6 / E
    return {
        "width": width,
        "depth": depth,
        "metrics": metrics,
        "members": E,
        "grid_points": size,
        "planned_chunk": tasks[0].size,
        "expansion_s": expanded - started,
        "setup_s": built - expanded,
        "train_s": timing["train_s"],
        "metrics_s": timing["metrics_s"],
        "tables_s": tables_s,
        "write_s": write_s,
        "write_1_thread_s": write_1_s,
        "write_threads": WRITE_THREADS,
        "chunk_s": chunk_s,
        "grid_s": chunk_s * size / E,
        "us_per_point": {
            "expansion": (expanded - started) * us,
            "setup": (built - expanded) * us,
            "tables": tables_s * us,
        },
        "member_steps_per_s": E * steps / timing["train_s"],
        "flop_rate": flops_per_step(cfg) * steps * E / timing["train_s"],
        "peak_bytes": peak,
        "planned_bytes": planned,
        "host_kernel": _host_kernel(usage),
    }


#: The phases between the resource-usage readings of :func:`grid_chunk`.
PHASES = ("expansion", "setup", "run", "write")


def _host_kernel(usage: Sequence[resource.struct_rusage]) -> dict[str, dict[str, float]]:
    """Per phase of a chunk (:data:`PHASES`; ``run`` is the training, metrics and tables),
    the host kernel's seconds on the process's behalf and the minor page faults: where a
    phase's time goes to first touching fresh memory rather than to its own work."""
    return {
        phase: {"system_s": b.ru_stime - a.ru_stime, "minor_faults": b.ru_minflt - a.ru_minflt}
        for phase, a, b in zip(PHASES, usage, usage[1:])
    }


def run(
    mode: str = "full",
    device: str = "cuda",
    members: int | None = None,
    widths: Sequence[int] | None = None,
    depths: Sequence[int] | None = None,
    steps: int = 1000,
    log_points: int = 20,
    agree: int = 16,
    peak_seconds: float = 2.0,
    out_dir: Path | None = RESULTS,
) -> dict[str, Any]:
    """Measure every shape (``FULL`` or ``QUICK``; ``widths`` × ``depths`` override them)
    on ``device``; write ``gpu.json``/``gpu.md`` (``gpu.quick.*``) to ``out_dir`` unless None."""
    grid = FULL if mode == "full" else QUICK
    shapes = grid["shapes"] if widths is None else [(w, d) for w in widths for d in depths or (2,)]
    members = members or grid["members"]
    cuda = torch.device(device).type == "cuda"
    sizes = (4096, 8192) if cuda else (256,)
    peak = training.matmul_peak(device=device, sizes=sizes, seconds=peak_seconds)["flops"]
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    _log(f"{name}: float64 matmul peak {peak / 1e9:.0f} GFLOP/s")
    rows, kernels, agreements = [], [], []
    for width, depth in shapes:
        for metrics in METRICS:
            _log(f"width {width}, depth {depth}, metrics {metrics}: one chunk of the grid")
            row = grid_chunk(width, depth, metrics, device, steps, log_points, members)
            if "flop_rate" in row:
                row["peak_fraction"] = row["flop_rate"] / peak
            rows.append(row)
        _log(f"width {width}, depth {depth}: kernels per step")
        points = training.grid_points(spec_for(256, width, depth, 200, log_points))
        kernels.append({"width": width, "depth": depth, **kernels_per_step(points, device)})
        _log(f"width {width}, depth {depth}: CPU against {device}")
        spec = spec_for(agree, width, depth, AGREE_STEPS, log_points, spectra_budget=None)
        agreements.append(
            {"width": width, "depth": depth, **agreement(training.grid_points(spec), device)}
        )
    report = {
        "mode": mode,
        "device": device,
        "name": name,
        "peak_flops": peak,
        "steps": steps,
        "log_points": log_points,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "rows": rows,
        "kernels": kernels,
        "agreement": agreements,
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = "gpu" if mode == "full" else "gpu.quick"
        (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1))
        (out_dir / f"{stem}.md").write_text(markdown(report))
    return report


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return "—" if math.isnan(value) else f"{value:.{digits}g}"
    return "—" if value is None else str(value)


def _gib(n: float | None) -> str:
    return "—" if n is None else f"{n / 2**30:.1f}"


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page."""
    lines = [
        f"# The GPU path on {report['name']} ({report['device']})",
        "",
        f"torch {report['torch']}, CUDA {report['cuda']}; float64 matmul peak "
        f"{report['peak_flops'] / 1e9:.0f} GFLOP/s; {report['steps']} steps, "
        f"{report['log_points']} logged. Written by `python -m benchmarks.gpu`.",
        "",
        "One chunk of the 10⁶-point grid (module docstring), seconds:",
        "",
        "| width | depth | metrics | members | expansion | set-up | training | metrics | "
        f"tables | Parquet, 1 thread | Parquet, {WRITE_THREADS} threads | chunk | whole grid "
        "(extrapolated) | µs/point expansion, set-up, "
        "tables | member-steps/s | of peak | device GiB measured / planned |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        head = f"| {r['width']} | {r['depth']} | {r['metrics']} |"
        if "note" in r:
            lines.append(f"{head} {r['note']} |" + " |" * 13)
            continue
        per = r["us_per_point"]
        cells = [
            str(r["members"]),
            *(
                _fmt(r[k])
                for k in (
                    "expansion_s",
                    "setup_s",
                    "train_s",
                    "metrics_s",
                    "tables_s",
                    "write_1_thread_s",
                    "write_s",
                    "chunk_s",
                    "grid_s",
                )
            ),  # fmt: skip
            f"{per['expansion']:.3g}, {per['setup']:.3g}, {per['tables']:.3g}",
            f"{r['member_steps_per_s']:.3g}",
            f"{r['peak_fraction']:.1%}",
            f"{_gib(r['peak_bytes'])} / {_gib(r['planned_bytes'])}",
        ]
        lines.append(f"{head} " + " | ".join(cells) + " |")
    lines += [
        "",
        "## The host kernel's part per phase (system seconds, minor page faults)",
        "",
        "| width | depth | metrics | " + " | ".join(PHASES) + " |",
        "|---|---|---|" + "---|" * len(PHASES),
    ]
    for r in report["rows"]:
        if "host_kernel" in r:
            cells = [
                f"{r['host_kernel'][p]['system_s']:.3g} s, {r['host_kernel'][p]['minor_faults']}"
                for p in PHASES
            ]
            lines.append(
                f"| {r['width']} | {r['depth']} | {r['metrics']} | " + " | ".join(cells) + " |"
            )
    lines += [
        "",
        "## Per non-logged step (256 members, 16 steps profiled)",
        "",
        "| width | depth | kernels | launches | host ops |",
        "|---|---|---|---|---|",
    ]
    for k in report["kernels"]:
        lines.append(
            f"| {k['width']} | {k['depth']} | {_fmt(k.get('kernels_per_step'))} | "
            f"{_fmt(k.get('launches_per_step'))} | {_fmt(k.get('host_ops_per_step'))} |"
        )
    lines += [
        "",
        f"## Agreement with the CPU (every stored column, spectra at every logged step, "
        f"{AGREE_STEPS} steps)",
        "",
        "| width | depth | points | columns | worst column | its max diff / scale | NULL mismatches |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in report["agreement"]:
        lines.append(
            f"| {g['width']} | {g['depth']} | {g['points']} | {g['columns']} | "
            f"{g['worst_column']} | {g['max_rel_diff']:.2e} | {g['null_mismatches']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="width 16 only, chunks ≤ 8,192 members")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    ap.add_argument("--members", type=int, help="most members of a chunk (default the planner's)")
    ap.add_argument("--widths", type=int, nargs="+", help="override the widths")
    ap.add_argument("--depths", type=int, nargs="+", help="override the depths")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--log-points", type=int, default=20)
    ap.add_argument(
        "--agree", type=int, default=16, help="points compared with the CPU (≤ 16 or a multiple)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for gpu.json and gpu.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the host only launches on a GPU; on the CPU, as benchmarks.run
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("benchmarks.gpu: torch sees no CUDA device (--device cpu runs the code path)")
        return 2
    report = run(
        "quick" if args.quick else "full", args.device, args.members, args.widths, args.depths,
        args.steps, args.log_points, args.agree, out_dir=args.out,
    )  # fmt: skip
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
