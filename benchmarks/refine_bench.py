"""Refinement vs a dense grid on the lazy/rich crossover: ``python -m benchmarks.refine_bench``.

The case: two-layer bias-free ReLU nets in the NTK parameterization (antisymmetric
init, teacher data, the learning-rate rule of ``sweeps/lazy_rich.yaml``); the
lazy/rich boundary is where the final ``kernel_distance`` crosses 0.01, and its init
scale falls with the width as a power, g*(w) ∝ w^b (b about -1/4 at depth 2 in this
project's parameterization).

Both sides find g*(w) for every width with the same seeds, metric and training:

- **dense**: one grid of ``dense`` init scales over the range (spacing δ decades); the
  boundary per width is the crossing of the seed mean between adjacent grid points,
  so its bracket is δ wide;
- **refine**: a coarse grid of ``coarse`` init scales over the same range, then
  ``phasesweep refine`` (bisection per width, batches as ensembles) until every
  bracket is at most δ wide: the dense grid's precision.

Reported side by side: runs trained (refine counts its coarse grid too), wall time
(training through Ray Tune as ``phasesweep run`` does, or in one process with
``--no-ray``), bracket widths and estimates per width, and the width exponent b fitted
to each side's boundaries (OLS of log g* on log w, 95 % t-interval). Targets: refine
uses at most 10 % of the dense grid's runs, reaches its precision at every width, and
its exponent lies inside the dense grid's interval.

Full size: 5 widths (64 ... 1024) x 3 seeds; dense 101 init scales over 2 decades
(δ = 0.02), so 1515 dense runs; coarse 3 (45 runs). About 80 s on 2 cores (measured);
run it on an idle machine for wall times that mean something. ``--quick`` is a smoke run at toy
size (3 small widths, 100 steps, dense 21 points) whose figures mean nothing.
Results go to ``benchmarks/results/{mode}.refine.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy import stats

RESULTS = Path(__file__).resolve().parent / "results"
METRIC, LEVEL = "kernel_distance", 0.01


@dataclass(frozen=True)
class Sizes:
    widths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    seeds: int = 3
    steps: int = 1000
    log_points: int = 30
    n_train: int = 32
    #: log10 of the init-scale range searched
    low: float = -1.5
    high: float = 0.5
    coarse: int = 3
    dense: int = 101


MODES = {
    "full": Sizes(),
    "quick": Sizes(widths=(16, 32, 64), seeds=2, steps=100, log_points=10, n_train=16, dense=21),
}


def spec(name: str, s: Sizes, points: int) -> dict[str, Any]:
    """The sweep spec of one side: ``points`` init scales over the range."""
    return {
        "name": name,
        "description": "lazy/rich crossover along init scale, depth 2 (refine benchmark)",
        "model": {
            "depth": 2,
            "activation": "relu",
            "bias": False,
            "parameterization": "ntk",
            "init": "antisymmetric",
        },
        "data": {
            "kind": "teacher",
            "n_train": s.n_train,
            "n_test": 64,
            "input_dim": 10,
            "teacher_width": 4,
            "seed": 0,
        },
        "train": {
            "optimizer": "gd",
            "lr": 1.0,
            "lr_scaling": {"init_scale_depth_power": -2, "init_scale_floor": 1.0},
            "steps": s.steps,
            "log_points": s.log_points,
        },
        "metrics": {"probe_size": 32, "spectra": False},
        "grid": {
            "width": list(s.widths),
            "init_scale": {"logspace": [s.low, s.high, points]},
            "seed": list(range(s.seeds)),
        },
    }


def train_sweep(store, raw: dict[str, Any], use_ray: bool) -> tuple[int, float]:
    """Train a sweep as ``phasesweep run`` does; (runs trained, wall seconds)."""
    from phasesweep.pipeline.grid import expand, make_chunks
    from phasesweep.pipeline.run._driver import run_chunks
    from phasesweep.pipeline.run._resources import trial_slots
    from phasesweep.pipeline.run._trial import train_and_store
    from phasesweep.pipeline.spec import validate_spec

    sp = validate_spec(raw)
    points = expand(sp)
    store.write_spec(sp.name, yaml.safe_dump(raw, sort_keys=False))
    start = time.perf_counter()
    if use_ray:
        chunks = make_chunks(points, sp, min_chunks=trial_slots(None, 1))
        out = run_chunks(store, sp.name, chunks, total=len(points), skipped=0, progress=False)
        if out.failed:
            raise RuntimeError(f"{sp.name}: {len(out.failed)} runs failed: {out.errors[:1]}")
    else:
        for c in make_chunks(points, sp):
            train_and_store(store.uri, sp.name, c, "cpu")
    return len(points), time.perf_counter() - start


def exponent(widths: list[int], boundaries: list[float]) -> dict[str, float]:
    """OLS slope of log g* on log w with its 95 % t-interval (NaN with < 3 widths)."""
    x, y = np.log10(widths), np.log10(boundaries)
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(x) - 2) * fit.stderr if len(x) > 2 else math.nan
    return {"slope": fit.slope, "ci_low": fit.slope - half, "ci_high": fit.slope + half}


def per_width(rows) -> dict[int, dict[str, Any]]:
    out = {}
    for r in rows.itertuples():
        ok = bool(r.bracketed)
        out[int(r.width)] = {
            "boundary": float(r.boundary) if ok else None,
            "bracket_decades": math.log10(r.bracket_high / r.bracket_low) if ok else None,
            "seed_spread_decades": None if r.seed_spread is None else float(r.seed_spread),
        }
    return out


@dataclass
class Result:
    mode: str
    sizes: dict[str, Any]
    use_ray: bool
    dense_runs: int = 0
    dense_seconds: float = 0.0
    refine_runs: int = 0
    refine_seconds: float = 0.0
    precision_decades: float = 0.0
    dense: dict[int, dict[str, Any]] = field(default_factory=dict)
    refined: dict[int, dict[str, Any]] = field(default_factory=dict)
    dense_exponent: dict[str, float] = field(default_factory=dict)
    refined_exponent: dict[str, float] = field(default_factory=dict)
    targets: dict[str, bool] = field(default_factory=dict)


def bench(mode: str, use_ray: bool, store_dir: str) -> Result:
    from phasesweep.pipeline.refine._refine import boundary_rows, plan_refinement, refine
    from phasesweep.storage import Store

    s = MODES[mode]
    store = Store.open(store_dir)
    delta = (s.high - s.low) / (s.dense - 1)
    res = Result(mode, asdict(s), use_ray, precision_decades=delta)

    res.dense_runs, res.dense_seconds = train_sweep(store, spec("dense", s, s.dense), use_ray)
    dense = boundary_rows(plan_refinement(store, "dense", METRIC, LEVEL, tol=delta))
    res.dense = per_width(dense)

    coarse_runs, coarse_seconds = train_sweep(store, spec("coarse", s, s.coarse), use_ray)
    start = time.perf_counter()
    out = refine(store, "coarse", METRIC, LEVEL, tol=delta, use_ray=use_ray)
    res.refine_seconds = coarse_seconds + time.perf_counter() - start
    res.refine_runs = coarse_runs + out.trained
    res.refined = per_width(out.boundaries)

    both = [w for w in s.widths if res.dense[w]["boundary"] and res.refined[w]["boundary"]]
    res.dense_exponent = exponent(both, [res.dense[w]["boundary"] for w in both])
    res.refined_exponent = exponent(both, [res.refined[w]["boundary"] for w in both])
    ci = res.dense_exponent
    res.targets = {
        "runs <= 10% of dense": res.refine_runs <= 0.10 * res.dense_runs,
        "precision reached at every width": len(both) == len(s.widths)
        and all(res.refined[w]["bracket_decades"] <= delta * (1 + 1e-6) for w in both),
        "exponent inside the dense interval": bool(
            ci["ci_low"] <= res.refined_exponent["slope"] <= ci["ci_high"]
        ),
    }
    return res


def markdown(r: Result) -> str:
    def f(v, spec=".3g"):
        return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)

    lines = [
        f"# Refinement vs dense grid ({r.mode}; {'Ray Tune' if r.use_ray else 'one process'})",
        "",
        f"Boundary: final {METRIC} = {LEVEL} along init_scale; precision target "
        f"{r.precision_decades:.3g} decades (the dense grid's spacing).",
        "",
        "| | runs | wall s | exponent b | 95 % interval |",
        "|---|---|---|---|---|",
    ]
    for name, runs, sec, e in (
        ("dense grid", r.dense_runs, r.dense_seconds, r.dense_exponent),
        ("coarse + refine", r.refine_runs, r.refine_seconds, r.refined_exponent),
    ):
        lines.append(
            f"| {name} | {runs} | {sec:.1f} | {f(e['slope'])} | "
            f"[{f(e['ci_low'])}, {f(e['ci_high'])}] |"
        )
    lines += [
        "",
        f"Runs: {r.refine_runs / r.dense_runs:.1%} of the dense grid's.",
        "",
        "| width | g* dense | bracket (dec) | g* refined | bracket (dec) | seed spread (dec) |",
        "|---|---|---|---|---|---|",
    ]
    for w in r.dense:
        d, q = r.dense[w], r.refined[w]
        lines.append(
            f"| {w} | {f(d['boundary'], '.4g')} | {f(d['bracket_decades'])} | "
            f"{f(q['boundary'], '.4g')} | {f(q['bracket_decades'])} | "
            f"{f(q['seed_spread_decades'])} |"
        )
    lines += ["", "Targets:"] + [
        f"- {k}: {'met' if v else 'NOT met'}" for k, v in r.targets.items()
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.refine_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a smoke run at toy size")
    ap.add_argument("--no-ray", action="store_true", help="train in this process, not on Ray")
    ap.add_argument("--store", default=None, help="store directory (default: a temporary one)")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    tmp = None if args.store else tempfile.mkdtemp(prefix="phasesweep-refine-bench-")
    try:
        r = bench(mode, not args.no_ray, args.store or tmp)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    text = markdown(r)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{mode}.refine.md").write_text(text)
    (RESULTS / f"{mode}.refine.json").write_text(json.dumps(asdict(r), indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
