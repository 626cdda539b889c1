"""The trainer on a GPU: member-steps per second from 256 to 65,536 members.

    python -m benchmarks.gpu            # the full grid below, on CUDA
    python -m benchmarks.gpu --quick    # 256 and 1024 members, width 16, depth 2
    python -m benchmarks.gpu --device cpu --members 32 --widths 8 --depths 2 --steps 60
                                        # the same code on the CPU (what the smoke test runs)

For every width (16, 256), depth (2, 4) and number of members (256, 1024, 4096, 16384,
65536): one chunk of that many points (16 init scales × seeds; teacher data, n_train 64,
input_dim 10; ReLU, NTK parameterization, float64; full-batch GD; ``--steps`` steps with
``--log-points`` logged steps and the default metrics), trained by ``ChunkTrainer`` on the
device, reporting:

- member-steps/s of the training (the trainer's ``train_s``: the step loop less the
  logged steps' metrics) and of the whole chunk (wall time, data and tables included);
- the training's FLOP rate (model FLOPs, 6 · n_train · weights per member-step) as a
  fraction of the device's float64 matmul peak, measured here (4096² and 8192² on a GPU);
- training against metrics seconds;
- per non-logged step (torch.profiler over 16 of them): the kernels the GPU runs, the
  host's launch calls (one graph launch where the step is a CUDA graph) and the operators
  the host dispatches;
- agreement with the CPU, once per width and depth: the first ``--agree`` points trained
  on the CPU and on the device with spectra at every logged step, every stored column
  compared (:func:`column_differences`).

Writes ``gpu.json`` and ``gpu.md`` (``gpu.quick.*`` with ``--quick``) to ``--out``
(``benchmarks/results``). A chunk that does not fit the device's memory is reported, not
run. Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from phasesweep.pipeline.grid import Chunk, Point, flops_per_step
from phasesweep.pipeline.train._trainer import HOOK_EVERY, ChunkTrainer
from phasesweep.storage.schema import log_steps

from benchmarks import training

RESULTS = Path(__file__).resolve().parent / "results"
FULL = {"members": (256, 1024, 4096, 16384, 65536), "widths": (16, 256), "depths": (2, 4)}
QUICK = {"members": (256, 1024), "widths": (16,), "depths": (2,)}

#: Columns whose round-off is that of another, larger one: the kernel's smallest eigenvalue
#: (zero to round-off for linear nets) that of its largest; the distance of the net from
#: its linearisation that of the outputs.
SCALE_OF = {"ntk_eig_min": "ntk_eig_max", "lin_distance": "output_norm"}
#: Columns that differ between any two runs, or are the device's own.
UNCOMPARED = {"wall_seconds", "chunk_wall_seconds", "finished_at", "device", "torch_threads"}
KEYS = {
    "runs": ["run_id"],
    "trajectories": ["run_id", "step"],
    "layers": ["run_id", "step", "layer"],
}


def _log(msg: str) -> None:
    print(f"[gpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spec_for(members: int, width: int, depth: int, steps: int, log_points: int, **metrics):
    """The benchmark's grid at one size (see the module docstring)."""
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
    :data:`SCALE_OF`'s columns, the other column's); text columns (ids, statuses, configs)
    count 1 where they differ, 0 where they are equal."""
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


def chunk_bytes(cfg) -> int:  # noqa: ANN001
    """Rough device memory of one member: θ in six copies (trained, initial, the metrics'
    initial, gradients, differences, a spectra batch), activations and scratch of the step
    and the probe set, kernels and the spectra's working copies."""
    m, d, probe = cfg.model, cfg.data, cfg.metrics.probe_size
    dims = [d.input_dim] + [m.width] * (m.depth - 1) + [d.output_dim]
    weights = sum(a * b for a, b in zip(dims[:-1], dims[1:]))
    rows = (d.n_train + 2 * probe) * (sum(dims[1:]) + max(dims[1:]))
    largest = max([probe * probe] + [a * b for a, b in zip(dims[:-1], dims[1:])])
    return 8 * (6 * weights + rows + 4 * probe * probe + 4 * largest)


def measure(points: Sequence[Point], device: str, peak: float) -> dict[str, Any]:
    """One chunk of ``points`` on ``device``: rates, split and kernels (module docstring)."""
    cfg = points[0].config
    E, steps = len(points), cfg.train.steps
    if torch.device(device).type == "cuda":
        free = torch.cuda.mem_get_info()[0]
        if E * chunk_bytes(cfg) > 0.8 * free:
            return {"note": f"does not fit: ~{E * chunk_bytes(cfg) / 2**30:.0f} GiB"}
    try:
        started = time.perf_counter()
        trainer = ChunkTrainer(Chunk("gpu", tuple(points)), device)
        trainer.run()
        wall = time.perf_counter() - started
    except torch.cuda.OutOfMemoryError:
        return {"note": "out of device memory"}
    timing = trainer.timing
    flops = flops_per_step(cfg) * steps * E
    return {
        "member_steps_per_s": E * steps / timing["train_s"],
        "member_steps_per_s_wall": E * steps / wall,
        "train_s": timing["train_s"],
        "metrics_s": timing["metrics_s"],
        "wall_s": wall,
        "flop_rate": flops / timing["train_s"],
        "peak_fraction": flops / timing["train_s"] / peak,
        **kernels_per_step(points, device),
    }


# -- the grid --------------------------------------------------------------------------------


def run(
    mode: str = "full",
    device: str = "cuda",
    members: Sequence[int] | None = None,
    widths: Sequence[int] | None = None,
    depths: Sequence[int] | None = None,
    steps: int = 500,
    log_points: int = 20,
    agree: int = 32,
    peak_seconds: float = 2.0,
    out_dir: Path | None = RESULTS,
) -> dict[str, Any]:
    """Measure the grid (``FULL`` or ``QUICK``, each axis overridable) on ``device``; write
    ``gpu.json``/``gpu.md`` (``gpu.quick.*``) to ``out_dir`` unless None."""
    grid = FULL if mode == "full" else QUICK
    members, widths, depths = (
        members or grid["members"], widths or grid["widths"], depths or grid["depths"]
    )  # fmt: skip
    cuda = torch.device(device).type == "cuda"
    sizes = (4096, 8192) if cuda else (256,)
    peak = training.matmul_peak(device=device, sizes=sizes, seconds=peak_seconds)["flops"]
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    _log(f"{name}: float64 matmul peak {peak / 1e9:.0f} GFLOP/s")
    rows, agreements = [], []
    for width in widths:
        for depth in depths:
            for e in members:
                _log(f"width {width}, depth {depth}, {e} members")
                points = training.grid_points(spec_for(e, width, depth, steps, log_points))
                rows.append({"width": width, "depth": depth, "members": e,
                             **measure(points, device, peak)})  # fmt: skip
            _log(f"width {width}, depth {depth}: CPU against {device}")
            spec = spec_for(agree, width, depth, steps, log_points, spectra_budget=None)
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


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown page."""
    lines = [
        f"# The trainer on {report['name']} ({report['device']})",
        "",
        f"torch {report['torch']}, CUDA {report['cuda']}; float64 matmul peak "
        f"{report['peak_flops'] / 1e9:.0f} GFLOP/s; {report['steps']} steps, "
        f"{report['log_points']} logged. Written by `python -m benchmarks.gpu`.",
        "",
        "| width | depth | members | member-steps/s (training) | (wall) | of peak | "
        "train s | metrics s | kernels/step | launches/step | host ops/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        if "note" in r:
            lines.append(f"| {r['width']} | {r['depth']} | {r['members']} | {r['note']} |||||||")
            continue
        cells = [
            f"{r['member_steps_per_s']:.3g}",
            f"{r['member_steps_per_s_wall']:.3g}",
            f"{r['peak_fraction']:.1%}",
            _fmt(r["train_s"]),
            _fmt(r["metrics_s"]),
            _fmt(r.get("kernels_per_step")),
            _fmt(r.get("launches_per_step")),
            _fmt(r.get("host_ops_per_step")),
        ]
        lines.append(
            f"| {r['width']} | {r['depth']} | {r['members']} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "## Agreement with the CPU (every stored column, spectra at every logged step)",
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
    ap.add_argument("--quick", action="store_true", help="256 and 1024 members, width 16, depth 2")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    ap.add_argument("--members", type=int, nargs="+", help="override the members axis")
    ap.add_argument("--widths", type=int, nargs="+", help="override the widths")
    ap.add_argument("--depths", type=int, nargs="+", help="override the depths")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--log-points", type=int, default=20)
    ap.add_argument(
        "--agree", type=int, default=32, help="points compared with the CPU (≤ 16 or a multiple)"
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
