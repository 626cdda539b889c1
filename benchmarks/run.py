"""The benchmark suite: ``.venv/bin/python -m benchmarks.run [--quick]``.

Every figure is a ratio of two measurements taken side by side in the same run on
the same machine; nothing here (or in the tests) asserts a wall-clock time. The
table is printed and written to ``benchmarks/results/{mode}.json`` and ``.md``;
see ``benchmarks/README.md`` for what is measured and how.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from benchmarks import store_bench, training

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sizes:
    """How big each piece is. ``full`` is the issue's grid; ``quick`` a smoke run."""

    points: int = 256
    steps: int = 2000
    width: int = 64
    depth: int = 3
    n_train: int = 128
    log_points: int = 100
    #: points of the grid the baselines train (spread evenly); the rest is extrapolated
    baseline_points: int = 32
    flop_widths: tuple[int, ...] = (256, 1024)
    flop_points: tuple[int, ...] = (32, 4)
    flop_steps: int = 100
    #: the FLOP rate is the best of this many runs, as the peak is the best of many
    flop_repeats: int = 3
    linear_points: tuple[int, ...] = (64, 256, 1024)
    linear_steps: int = 300
    linear_log_points: int = 30
    store_rows: int = 10_000_000
    store_chunk_rows: int = 1_000_000
    peak_seconds: float = 3.0
    #: phasesweep in one process and (b) run alternately this many times, best of each
    #: kept: the machine is shared, and a calm minute should not favour one side
    repeats: int = 2


MODES = {
    "full": Sizes(),
    "quick": Sizes(
        points=32,
        steps=200,
        baseline_points=4,
        flop_widths=(256,),
        flop_points=(8,),
        flop_steps=30,
        flop_repeats=2,
        linear_points=(16, 32, 64),
        linear_steps=50,
        linear_log_points=10,
        store_rows=1_000_000,
        store_chunk_rows=250_000,
        peak_seconds=1.0,
        repeats=1,
    ),
    # the pieces at toy size, for tests/test_perf_benchmark_smoke.py
    "toy": Sizes(
        points=4,
        steps=12,
        width=8,
        n_train=16,
        log_points=5,
        baseline_points=2,
        flop_widths=(16,),
        flop_points=(2,),
        flop_steps=5,
        flop_repeats=2,
        linear_points=(2, 4),
        linear_steps=6,
        linear_log_points=3,
        store_rows=4000,
        store_chunk_rows=2000,
        peak_seconds=0.1,
        repeats=1,
    ),
}

#: The issue's targets: (key, description, threshold, direction).
TARGETS = [
    ("speedup_vs_ray_tune", "phasesweep vs (a) one Ray Tune trial per point", 30.0, ">="),
    (
        "speedup_vs_plain_loop",
        "phasesweep run (Ray start-up included) vs (b) plain per-point loop, one process",
        5.0,
        ">=",
    ),
    (
        "flop_fraction_of_peak",
        "training FLOP rate / (c) matmul peak per core, width >= 256",
        0.5,
        ">=",
    ),
    ("metrics_over_training", "default metrics time / training time", 0.25, "<="),
    ("linear_in_points", "time per point-step, largest / smallest grid", 1.25, "<="),
    ("store_write_rows_per_s", "trajectory rows written per second", 1e6, ">="),
    ("store_query_s", "phase-diagram aggregate over the trajectories table, s", 1.0, "<="),
]


@dataclass
class Report:
    mode: str
    sizes: Sizes
    meta: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    figures: list[dict[str, Any]] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)

    def figure(self, name: str, value: float | str, unit: str = "", detail: str = "") -> None:
        self.figures.append({"figure": name, "value": value, "unit": unit, "detail": detail})

    def target(self, key: str, measured: float, note: str = "") -> None:
        (desc, threshold, op) = next((d, t, o) for k, d, t, o in TARGETS if k == key)
        met = measured >= threshold if op == ">=" else measured <= threshold
        self.targets.append(
            {
                "target": key,
                "description": desc,
                "threshold": f"{op} {threshold:g}",
                "measured": measured,
                "met": bool(met),
                "note": note,
            }
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "sizes": self.sizes.__dict__,
            "meta": self.meta,
            "figures": self.figures,
            "targets": self.targets,
            "raw": self.raw,
        }

    def markdown(self) -> str:
        m = self.meta
        lines = [
            f"# phasesweep benchmarks ({self.mode})",
            "",
            f"- machine: {m.get('cpu')}, {m.get('cores')} cores; torch {m.get('torch')}, "
            f"ray {m.get('ray')}, duckdb {m.get('duckdb')}; commit {m.get('commit')}",
            f"- date: {m.get('date')}; wall {m.get('wall_s', 0):.0f} s; load average "
            f"{m.get('load_start')} at start, {m.get('load_end')} at end "
            f"(other processes share the cores: ratios are taken side by side)",
            f"- grid: {m.get('grid')}",
            "- torch threads: 1 per process (trial), in phasesweep and in both baselines",
            "",
            "| figure | value | unit | detail |",
            "|---|---|---|---|",
        ]
        for f in self.figures:
            lines.append(f"| {f['figure']} | {_fmt(f['value'])} | {f['unit']} | {f['detail']} |")
        lines += ["", "| target | threshold | measured | met | note |", "|---|---|---|---|---|"]
        for t in self.targets:
            lines.append(
                f"| {t['description']} | {t['threshold']} | {_fmt(t['measured'])} | "
                f"{'yes' if t['met'] else '**no**'} | {t['note']} |"
            )
        met = sum(t["met"] for t in self.targets)
        lines += ["", f"{met} of {len(self.targets)} targets met."]
        if m.get("gpu"):
            lines += ["", f"GPU: {m['gpu']}"]
        return "\n".join(lines) + "\n"


def _fmt(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v != v:  # NaN
        return "n/a"
    a = abs(v)
    if a >= 1e5:
        return f"{v:.3g}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _meta() -> dict[str, Any]:
    from importlib.metadata import version

    import duckdb

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": version("ray"),  # not imported: pipeline.run._driver sets Ray up before its import
        "duckdb": duckdb.__version__,
        "commit": commit,
        "load_start": _load(),
    }


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(mode: str = "full", with_ray: bool = True, out_dir: Path | None = RESULTS) -> Report:
    """Run every piece at the sizes of ``mode``; write the results to ``out_dir``."""
    sz = MODES[mode]
    torch.set_num_threads(1)
    rep = Report(mode, sz, meta=_meta())
    started = time.perf_counter()
    raw = rep.raw

    _log("matmul peak")
    raw["peak_start"] = training.matmul_peak(seconds=sz.peak_seconds)

    spec = training.grid_spec(
        sz.points, sz.steps, sz.width, sz.depth, sz.n_train, sz.log_points, name="bench"
    )
    points = training.grid_points(spec)
    grid = training.describe(spec, len(points))
    rep.meta["grid"] = grid
    sub = training.subset(points, min(sz.baseline_points, len(points)))
    scale = len(points) / len(sub)

    ps_runs, plain_runs = [], []
    for r in range(sz.repeats):
        _log(f"phasesweep in-process ({r + 1}/{sz.repeats}): {grid}")
        ps_runs.append(training.phasesweep_inprocess(points))
        _log(f"(b) plain loop on {len(sub)} points ({r + 1}/{sz.repeats})")
        plain_runs.append(training.plain_loop(sub))
    ps = raw["phasesweep_inprocess"] = dict(min(ps_runs, key=lambda r: r["wall_s"]))
    plain = raw["plain_loop"] = dict(min(plain_runs, key=lambda r: r["wall_s"]))
    ps["repeats"] = [r["wall_s"] for r in ps_runs]
    plain["repeats"] = [r["wall_s"] for r in plain_runs]
    plain_full = plain["wall_s"] * scale
    diff_b = training.max_rel_diff(plain["final_loss"], ps["final_loss"])

    ray_res: dict[str, Any] | None = None
    if with_ray:
        ray_res = raw["ray"] = _ray_pieces(spec, points, sub, ps["final_loss"])
        n_cpus = ray_res["cpus"]

    for w, n in zip(sz.flop_widths, sz.flop_points):
        _log(f"FLOP rate at width {w}")
        fspec = training.grid_spec(
            n, sz.flop_steps, w, sz.depth, sz.n_train, log_points=2, name=f"flops{w}"
        )
        raw[f"flops_width_{w}"] = training.best_of(
            sz.flop_repeats, training.phasesweep_inprocess, training.grid_points(fspec)
        )

    for n in sz.linear_points:
        _log(f"linearity: {n} points")
        lspec = training.grid_spec(
            n, sz.linear_steps, sz.width, sz.depth, sz.n_train, sz.linear_log_points, name="lin"
        )
        raw[f"linear_{n}"] = training.phasesweep_inprocess(training.grid_points(lspec))

    _log(f"store: {sz.store_rows} trajectory rows")
    store_dir = tempfile.mkdtemp(prefix="phasesweep-bench-store-")
    try:
        st = raw["store"] = store_bench.store_benchmark(
            store_dir, sz.store_rows, sz.store_chunk_rows, steps=sz.steps, log_points=sz.log_points
        )
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)

    raw["peak_end"] = training.matmul_peak(seconds=sz.peak_seconds)
    peak = max(raw["peak_start"]["flops"], raw["peak_end"]["flops"])
    raw["gpu"] = _gpu(spec, points)

    # -- figures ------------------------------------------------------------------------
    pt_steps = len(points) * sz.steps
    rep.figure(
        "(c) dense matmul peak, 1 core",
        peak / 1e9,
        "GFLOP/s",
        f"float64 torch.mm {raw['peak_start']['size']}², best of repeated runs at start and end",
    )
    rep.figure(
        "phasesweep, one process, 1 core",
        ps["wall_s"],
        "s",
        f"{grid}; best of {sz.repeats} runs alternating with (b): "
        + ", ".join(f"{w:.1f}" for w in ps["repeats"]),
    )
    rep.figure(
        "  of which training / metrics / setup+tables",
        f"{ps['train_s']:.1f} / {ps['metrics_s']:.1f} / {ps['setup_s'] + ps['other_s']:.1f}",
        "s",
        f"{len(training.log_steps_of(spec))} logged steps with the default metrics",
    )
    rep.figure(
        f"  training FLOP rate (width {sz.width})",
        ps["train_flop_rate"] / 1e9,
        "GFLOP/s",
        f"{ps['train_flop_rate'] / peak:.0%} of (c); blocks of {ps['block']} members",
    )
    rep.figure(
        "(b) plain per-point loop, one process",
        plain_full,
        "s",
        f"measured on {len(sub)} of {len(points)} points (best of "
        + ", ".join(f"{w:.1f}" for w in plain["repeats"])
        + f" s), x{scale:g} per point; final losses equal phasesweep's to {diff_b:.1e}",
    )
    rep.figure(
        "speedup vs (b), per core",
        plain_full / ps["wall_s"],
        "x",
        "phasesweep in one process against (b): 1 core each",
    )
    rep.figure(
        "  time per point-step: phasesweep / (b)",
        f"{ps['wall_s'] / pt_steps * 1e6:.1f} / {plain_full / pt_steps * 1e6:.1f}",
        "µs",
        "",
    )
    if ray_res is not None:
        a_full = ray_res["tune_fixed_s"] + (ray_res["tune_s"] - ray_res["tune_fixed_s"]) * scale
        ray_res["tune_extrapolated_s"] = a_full
        rep.figure("Ray start-up (both sides, not counted)", ray_res["init_s"], "s", "")
        rep.figure(
            "phasesweep via Ray Tune + store",
            ray_res["phasesweep_s"],
            "s",
            f"{ray_res['chunks']} chunks as trials of 1 CPU on {n_cpus} CPUs, Parquet "
            f"written; trainer inside the trials "
            + ", ".join(f"{w:.1f}" for w in ray_res["trainer_s"])
            + f" s; Tune driver CPU {ray_res['driver_cpu_s']:.1f} s; "
            f"{ray_res['bytes_per_row']:.0f} bytes per trajectory row",
        )
        rep.figure(
            "(a) one Ray Tune trial per point",
            a_full,
            "s",
            f"measured on {len(sub)} of {len(points)} points ({ray_res['tune_s']:.1f} s); "
            f"Tune's fixed start-up ({ray_res['tune_fixed_s']:.1f} s, 2 trials of 1 step) "
            f"kept once, the rest x{scale:g} per point; final losses equal phasesweep's "
            f"to {ray_res['diff']:.1e}; inside the trials {ray_res['tune_trial_s']:.1f} s "
            f"(CPU-summed) of which tune.report {ray_res['tune_report_s']:.1f} s",
        )
        rep.figure("speedup vs (a)", a_full / ray_res["phasesweep_s"], "x", f"{n_cpus} CPUs each")
        end_to_end = ray_res["init_s"] + ray_res["phasesweep_s"]
        ray_res["speedup_vs_plain_loop"] = plain_full / end_to_end
        rep.figure(
            "speedup vs (b), as run",
            ray_res["speedup_vs_plain_loop"],
            "x",
            f"phasesweep via Ray Tune + store with Ray's start-up ({end_to_end:.1f} s, "
            f"{n_cpus} CPUs, what `phasesweep run` does here) against (b) in one process",
        )
    flop_ratios = []
    for w in sz.flop_widths:
        r = raw[f"flops_width_{w}"]
        ratio = r["train_flop_rate"] / peak
        flop_ratios.append(ratio)
        rep.figure(
            f"training FLOP rate, width {w}",
            r["train_flop_rate"] / 1e9,
            "GFLOP/s",
            f"{ratio:.0%} of (c); {r['points']} points x {r['steps']} steps, blocks of "
            f"{r['block']} members; best of {len(r['repeats'])} runs (median "
            f"{sorted(r['repeats'])[len(r['repeats']) // 2] / r['train_s']:.2f}x its time)",
        )
    rep.figure(
        "metrics / training time",
        ps["metrics_s"] / ps["train_s"],
        "",
        f"default metrics (NTK, spectra, ...) at {len(training.log_steps_of(spec))} logged steps",
    )
    per_ps = {}
    for n in sz.linear_points:
        r = raw[f"linear_{n}"]
        per_ps[n] = r["wall_s"] / (n * r["steps"])
        rep.figure(
            f"time per point-step, {n} points",
            per_ps[n] * 1e6,
            "µs",
            f"training alone {r['train_s'] / (n * r['steps']) * 1e6:.1f} µs; "
            f"{r['steps']} steps, {sz.linear_log_points} log points",
        )
    rep.figure(
        "store: trajectory rows written",
        st["write_rows_per_s"] / 1e6,
        "M rows/s",
        f"{st['rows']:,} rows in {st['chunks']} write_chunk calls of {st['rows_per_chunk']:,}; "
        f"row groups of >= {st['min_row_group_rows']:,} rows",
    )
    rep.figure("store: bytes per trajectory row", st["bytes_per_row"], "B", "zstd Parquet")
    rep.figure(
        "store: phase-diagram aggregate",
        st["query_best_s"],
        "s",
        f"GROUP BY init_scale, width over the final step of {st['query_runs']:,} runs, "
        f"{st['catalog_rows']:,}-row table; first run {st['query_first_s']:.2f} s",
    )

    # -- targets ------------------------------------------------------------------------
    if ray_res is not None:
        rep.target(
            "speedup_vs_ray_tune",
            ray_res["tune_extrapolated_s"] / ray_res["phasesweep_s"],
            "(a) extrapolated from a subset",
        )
        rep.target(
            "speedup_vs_plain_loop",
            ray_res["speedup_vs_plain_loop"],
            f"(b) extrapolated from a subset; per core {plain_full / ps['wall_s']:.2f}x",
        )
    rep.target("flop_fraction_of_peak", min(flop_ratios), f"widths {sz.flop_widths}")
    rep.target("metrics_over_training", ps["metrics_s"] / ps["train_s"])
    lo, hi = min(sz.linear_points), max(sz.linear_points)
    rep.target(
        "linear_in_points",
        per_ps[hi] / per_ps[lo],
        f"{hi} vs {lo} points; largest/smallest of all: {max(per_ps.values()) / min(per_ps.values()):.2f}",
    )
    rep.target("store_write_rows_per_s", st["write_rows_per_s"])
    rep.target("store_query_s", st["query_best_s"], f"first run {st['query_first_s']:.2f} s")

    for r in raw.values():  # per-run losses served the consistency checks above
        if isinstance(r, dict):
            r.pop("final_loss", None)
    rep.meta["load_end"] = _load()
    rep.meta["wall_s"] = time.perf_counter() - started
    rep.meta["gpu"] = raw["gpu"].get("note")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{mode}.json").write_text(json.dumps(rep.as_json(), indent=1, default=str))
        (out_dir / f"{mode}.md").write_text(rep.markdown())
    return rep


def _ray_pieces(spec, points, sub, reference: dict[str, float]) -> dict[str, Any]:
    import ray

    out: dict[str, Any] = {}
    _log("Ray start-up")
    out["init_s"] = training.ray_init()
    try:
        out["cpus"] = training.ray_cpus()
        _log("(a) Tune's fixed start-up: 2 trials of 1 step")
        tiny = training.grid_points(training.grid_spec(2, 1, 8, 2, 8, 2, name="tiny"))
        out["tune_fixed_s"] = training.ray_tune_baseline(tiny, name="fixed")["wall_s"]
        _log(f"(a) one Ray Tune trial per point, {len(sub)} points")
        a = training.ray_tune_baseline(sub)
        out["tune_s"] = a["wall_s"]
        out["tune_trial_s"], out["tune_report_s"] = a["trial_s"], a["report_s"]
        _log("phasesweep via Ray Tune and the store")
        store_dir = tempfile.mkdtemp(prefix="phasesweep-bench-run-")
        try:
            e2e = training.phasesweep_ray(points, spec, store_dir, n_trials=out["cpus"])
        finally:
            shutil.rmtree(store_dir, ignore_errors=True)
        out["phasesweep_s"] = e2e["wall_s"]
        out["chunks"] = e2e["chunks"]
        out["trainer_s"], out["driver_cpu_s"] = e2e["trainer_s"], e2e["driver_cpu_s"]
        out["bytes_per_row"] = e2e["trajectory_bytes"] / max(1, e2e["trajectory_rows"])
        out["diff"] = training.max_rel_diff(a["final_loss"], reference)
    finally:
        ray.shutdown()
    return out


def _gpu(spec, points) -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {
            "note": "not measured: no GPU on this machine (the GPU path is tested for "
            "correctness only: one block holds the whole chunk)"
        }
    _log("GPU")
    peak = training.matmul_peak(device="cuda", sizes=(4096, 8192), seconds=2.0)
    ps = training.phasesweep_inprocess(points, device="cuda")
    return {
        "note": f"{torch.cuda.get_device_name()}: phasesweep {ps['wall_s']:.1f} s "
        f"(training {ps['train_s']:.1f} s, {ps['train_flop_rate'] / peak['flops']:.0%} of the "
        f"float64 matmul peak {peak['flops'] / 1e9:.0f} GFLOP/s)",
        "peak": peak,
        "phasesweep": ps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a smoke run (< 2 min) at small sizes")
    ap.add_argument("--no-ray", action="store_true", help="skip the Ray pieces ((a), end to end)")
    ap.add_argument(
        "--out", type=Path, default=RESULTS, help="directory for {mode}.json and {mode}.md"
    )
    args = ap.parse_args(argv)
    rep = run("quick" if args.quick else "full", with_ray=not args.no_ray, out_dir=args.out)
    print(rep.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
