"""The shape suite: ``.venv/bin/python -m benchmarks.shapes [--quick]``.

How close phasesweep's training comes to the machine's matmul peak, and how much faster
it trains a grid than the same grid trained point by point, across shapes: n_train 64 to
4096, input_dim 10 to 784, width 16 to 4096, depth 2 to 8, linear/ReLU/tanh, members on
one shared data set (one data seed: the first layer as one GEMM per block, see
:class:`pipeline.train._models.EnsembleStep`) or each on its own.

Every side runs in the same pool of one process per core (torch and numpy's BLAS at one
thread each), taken in turn for each shape:

- phasesweep: the grid split into one chunk per process, each trained by
  :func:`benchmarks.training.phasesweep_inprocess` (metrics at the first and last
  steps only, without NTK, spectra or kernel predictor);
- numpy: :func:`numpy_train`, the hand-written GD loop of one point, one point per task;
- torch: :func:`benchmarks.training.plain_train`, ``nn.Module`` + ``torch.optim.SGD``,
  one point per task.

The baselines train ``baseline_points`` of the grid's points (spread evenly) and are
extrapolated linearly per point; their final losses are compared with phasesweep's.
The FLOP rate is the FLOPs a step computes (model FLOPs, 6 · rows · weights per
member-step as :func:`pipeline.grid._cost.flops_per_step` counts, less the first layer's
input gradient, which no step computes: :func:`computed_fraction`; bias-free linear nets
train in factored form, :class:`pipeline.train._linear_step.LinearStep`, and count that step's
own, far fewer, FLOPs) over phasesweep's training time (the step loop, summed over the
processes), as a fraction of the one-thread float64 matmul peak
(:func:`benchmarks.training.matmul_peak`) measured in the same run. Which targets apply
depends on the numpy loop's fraction of the peak, counted in backpropagation's FLOPs (what
it computes). Nothing asserts a speed. Results: ``benchmarks/results/shapes{,.quick}.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from phasesweep.pipeline.grid import Point, expand, flops_per_step
from phasesweep.pipeline.spec import RunConfig, SweepSpec, validate_spec

from benchmarks import training
from benchmarks.run import RESULTS, _fmt, _load, _log, _meta


@dataclass(frozen=True)
class Shape:
    """One grid: ``points`` members (seeds) of one architecture and data shape."""

    n: int
    d: int
    width: int
    depth: int
    activation: str
    #: one data set for every member (data.seed fixed) or one per member (its seed)
    shared: bool
    points: int
    steps: int
    #: points the point-by-point baselines train (spread evenly), extrapolated per point
    baseline_points: int

    @property
    def name(self) -> str:
        data = "shared" if self.shared else "own"
        return (
            f"n{self.n}-d{self.d}-w{self.width}-L{self.depth}-{self.activation}-{data}"
            f"-E{self.points}"
        )

    def spec(self) -> SweepSpec:
        """Teacher data, NTK parameterization, bias-free, full-batch GD, float64; lr
        0.05/depth (no member diverges); two logged steps with cheap metrics."""
        data: dict[str, Any] = {
            "kind": "teacher",
            "n_train": self.n,
            "n_test": 64,
            "input_dim": self.d,
        }
        if self.shared:
            data["seed"] = 0
        return validate_spec(
            {
                "name": f"shape-{self.name}".lower(),
                "model": {"depth": self.depth, "width": self.width, "activation": self.activation},
                "data": data,
                "train": {"steps": self.steps, "lr": 0.05 / self.depth, "log_points": 2},
                "metrics": {"probe_size": 8, "ntk": False, "spectra": False, "linearized": False},
                "grid": {"seed": list(range(self.points))},
            }
        )


S = Shape
#: 2.5 minutes on the project's 2-core machine (measured): members and steps shrink with
#: the shape so that each takes phasesweep up to about 10 s (a TFLOP at ~50 GFLOP/s a core;
#: far less for the factored linear nets), the baselines on their subsets as long.
FULL = [
    S(64, 10, 16, 2, "relu", True, 256, 1600, 64),
    S(128, 10, 64, 3, "relu", False, 256, 800, 32),
    S(128, 16, 32, 8, "tanh", False, 128, 800, 32),
    S(256, 32, 256, 2, "tanh", True, 64, 400, 16),
    S(1024, 100, 256, 2, "relu", True, 32, 240, 8),
    S(1024, 100, 256, 2, "relu", False, 32, 240, 8),
    S(1024, 100, 64, 2, "linear", True, 64, 400, 16),
    S(256, 32, 128, 4, "linear", False, 32, 400, 8),
    S(512, 100, 512, 3, "tanh", True, 8, 200, 4),
    S(256, 64, 1024, 4, "relu", False, 8, 80, 4),
    S(512, 784, 128, 2, "relu", True, 16, 160, 4),
    S(4096, 784, 256, 2, "relu", True, 4, 40, 2),
    S(64, 10, 4096, 2, "relu", False, 4, 400, 4),
]

#: A smoke run (< 2 minutes): a few of the shapes at toy sizes.
QUICK = [
    S(64, 10, 16, 2, "relu", True, 16, 50, 4),
    S(128, 16, 32, 3, "tanh", False, 8, 30, 4),
    S(256, 100, 64, 2, "linear", True, 8, 20, 4),
    S(512, 100, 128, 2, "relu", True, 4, 10, 2),
]
del S


# -- the numpy baseline -------------------------------------------------------------------


def _numpy_activation(name: str):
    """φ and φ' (from z and h = φ(z)) in numpy."""
    if name == "relu":
        return (lambda z: np.maximum(z, 0.0)), (lambda z, h: (z > 0).astype(z.dtype))
    if name == "tanh":
        return np.tanh, (lambda z, h: 1.0 - h * h)
    if name == "linear":
        return (lambda z: z), (lambda z, h: 1.0)
    raise ValueError(f"numpy baseline: activation {name!r} not written (relu, tanh, linear)")


def numpy_train(config: RunConfig) -> float:
    """Train one point by full-batch GD in numpy (forward, backward and update by hand);
    returns the train loss after ``steps`` updates.

    What a researcher writes without a framework. Data, initial weights, multipliers and
    learning rate are phasesweep's for this point (bias-free nets only)."""
    from phasesweep.pipeline.data._datasets import data_seed, make_dataset
    from phasesweep.pipeline.train._init import init_params
    from phasesweep.pipeline.train._models import EnsembleMLP
    from phasesweep.pipeline.train._trainer import member_lr

    if config.model.bias or config.train.optimizer != "gd":
        raise ValueError("numpy baseline: bias-free nets and full-batch GD only")
    ds = make_dataset(config.data, data_seed(config.data, config.train.seed))
    x, y = ds.x_train.numpy(), ds.y_train.numpy()
    net = EnsembleMLP(config.model, x.shape[1], y.shape[1])
    ws = [
        w[0].numpy().copy() for w in init_params(net, [config.model], [config.train.seed]).weights
    ]
    phi, dphi = _numpy_activation(config.model.activation)
    c, lr, n, L = net.multipliers, member_lr(config), x.shape[0], len(ws)
    for k in range(config.train.steps + 1):
        hs, zs = [x], []
        for l, w in enumerate(ws):
            z = c[l] * (hs[-1] @ w.T)
            if l < L - 1:
                zs.append(z)
                hs.append(phi(z))
        resid = z - y
        if k == config.train.steps:
            break
        delta = resid / n
        for l in range(L - 1, -1, -1):
            grad = c[l] * (delta.T @ hs[l])
            if l > 0:
                delta = c[l] * (delta @ ws[l]) * dphi(zs[l - 1], hs[l])
            ws[l] -= lr * grad
    return float(0.5 * np.square(resid).sum() / n)


# -- the pool: one process per core, one thread each -----------------------------------------

_LIMITS: Any = None


def _init_worker() -> None:
    global _LIMITS
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    _LIMITS = threadpool_limits(1)  # numpy's BLAS (and any OpenMP) at one thread


def blas_info() -> dict[str, Any]:
    """Which BLAS numpy and torch call, and with how many threads (in this process)."""
    from threadpoolctl import threadpool_info

    libs = [
        {k: i.get(k) for k in ("internal_api", "version", "num_threads", "filepath")}
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]
    numpy_libs = [i for i in libs if "numpy" in (i["filepath"] or "")]
    cfg = torch.__config__.show()
    torch_blas = re.search(r"BLAS_INFO=(\w+)", cfg)
    return {
        "numpy": " ".join(f"{i['internal_api']} {i['version']}" for i in numpy_libs) or "unknown",
        "numpy_threads": [i["num_threads"] for i in numpy_libs],
        "torch": torch_blas.group(1) if torch_blas else "unknown",
        "torch_threads": torch.get_num_threads(),
        "libraries": libs,
    }


def _timed(fn, point: Point) -> tuple[str, float, float]:
    t = time.perf_counter()
    loss = fn(point.config)
    return point.run_id, loss, time.perf_counter() - t


def _numpy_task(point: Point) -> tuple[str, float, float]:
    return _timed(numpy_train, point)


def _torch_task(point: Point) -> tuple[str, float, float]:
    return _timed(training.plain_train, point)


def _phasesweep_task(points: Sequence[Point]) -> dict[str, Any]:
    return training.phasesweep_inprocess(points)


def _warm_up(_: int) -> None:
    """Each side once at toy size: first calls (lazy init, imports) are not measured."""
    points = expand(Shape(16, 4, 4, 2, "relu", True, 2, 1, 1).spec())
    _phasesweep_task(points)
    _numpy_task(points[0])
    _torch_task(points[0])


def computed_fraction(point: Point) -> float:
    """The part of the model FLOPs (6 · rows · weights, :func:`pipeline.grid._cost.step_flops`)
    a training step computes: no step propagates the gradient back into the input, so the
    first layer's 2 · rows · d · width of it are never spent. It matters where the first
    layer holds most weights (input_dim 784: a third of the model FLOPs)."""
    cfg = point.config
    dims = [cfg.data.input_dim] + [cfg.model.width] * (cfg.model.depth - 1)
    rows = cfg.data.n_train  # full-batch GD, as every shape trains
    return 1.0 - 2.0 * rows * dims[0] * dims[1] / flops_per_step(cfg)


def computed_flops(result: dict[str, Any], point: Point) -> float:
    """FLOPs a :func:`benchmarks.training.phasesweep_inprocess` result computed: the model
    FLOPs less the first layer's input gradient (:func:`computed_fraction`), or the
    factored step's own count for bias-free linear nets (``LinearStep``)."""
    if result["engine"] == "LinearStep":
        return result["flops"]
    return result["flops"] * computed_fraction(point)


def _block(result: dict[str, Any]) -> int | str:
    return "factored" if result["engine"] == "LinearStep" else result["block"]


def _split(points: Sequence[Point], parts: int) -> list[list[Point]]:
    bounds = np.linspace(0, len(points), parts + 1).round().astype(int)
    return [list(points[a:b]) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def measure(shape: Shape, pool: ProcessPoolExecutor, workers: int) -> dict[str, Any]:
    """phasesweep, numpy and torch on ``shape``, each side in the pool in turn (the FLOP
    rate's fraction of the peak is :func:`run`'s)."""
    points = expand(shape.spec())
    t = time.perf_counter()
    parts = list(pool.map(_phasesweep_task, _split(points, workers)))
    ps_wall = time.perf_counter() - t
    train_s = sum(p["train_s"] for p in parts)
    flops = sum(computed_flops(p, points[0]) for p in parts)
    final = {k: v for p in parts for k, v in p["final_loss"].items()}
    row: dict[str, Any] = {
        "shape": shape.name,
        **asdict(shape),
        "phasesweep_wall_s": ps_wall,
        "phasesweep_train_s": train_s,
        "block": [_block(p) for p in parts],
        "flop_rate": flops / train_s,
        # backpropagation's FLOPs of the grid: what the point-by-point loops compute
        "model_flops": sum(p["model_flops"] for p in parts) * computed_fraction(points[0]),
        "final_loss": final,  # for the device pass; not written out
    }
    sub = training.subset(points, min(shape.baseline_points, len(points)))
    for name, task in (("numpy", _numpy_task), ("torch", _torch_task)):
        t = time.perf_counter()
        done = list(pool.map(task, sub))
        wall = (time.perf_counter() - t) * len(points) / len(sub)
        row[f"{name}_wall_s"] = wall
        row[f"{name}_point_s"] = sum(dt for *_, dt in done) / len(done)  # one point alone
        row[f"speedup_vs_{name}"] = wall / ps_wall
        row[f"{name}_max_rel_diff"] = training.max_rel_diff({r: v for r, v, _ in done}, final)
    return row


#: Where the device pass runs unless told: the GPU when there is one, else nowhere.
DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else None


def device_pass(shapes: Sequence[Shape], device: str, peak_seconds: float = 3.0) -> dict[str, Any]:
    """Every shape's whole grid as one chunk on ``device`` (a GPU when one is present), in
    this process: member-steps per second of the step loop and the computed FLOP rate as a
    fraction of the device's float64 matmul peak, measured here (4096² and 8192² on a GPU;
    small sizes elsewhere, where this only exercises the code). Final losses are checked
    against the same grid on CPU by the caller."""
    big = torch.device(device).type == "cuda"
    sizes = (4096, 8192) if big else (256,)
    peak = training.matmul_peak(device=device, sizes=sizes, seconds=peak_seconds)["flops"]
    rows = []
    for shape in shapes:
        _log(f"{device}: shape {shape.name}")
        points = expand(shape.spec())
        r = training.phasesweep_inprocess(points, device=device)
        computed = computed_flops(r, points[0])
        rows.append(
            {
                "shape": shape.name,
                "member_steps_per_s": len(points) * shape.steps / r["train_s"],
                "peak_fraction": computed / r["train_s"] / peak,
                "block": _block(r),
                "wall_s": r["wall_s"],
                "final_loss": r["final_loss"],
            }
        )
    name = torch.cuda.get_device_name(device) if big else str(device)
    return {"device": device, "name": name, "peak_flops": peak, "shapes": rows}


# -- the report -----------------------------------------------------------------------------

#: The issue's targets: ≥ 50 % of the peak where every hidden GEMM of a member is at least
#: 64 × 64 × 64 (n, input_dim and width ≥ 64; not the factored linear step, whose products
#: have k rows and stream the weights from memory); ≥ 2× the numpy loop where that loop
#: runs below 40 % of the peak, and never slower than it anywhere.
PEAK_TARGET, NUMPY_SLOW, NUMPY_TARGET = 0.5, 0.4, 2.0


def targets(row: dict[str, Any], peak: float, workers: int) -> dict[str, Any]:
    """A measured shape's fractions of ``peak`` (phasesweep's step loop; the numpy loop's
    wall time, its setup included, over ``workers`` processes) and which targets it meets."""
    numpy_fraction = row["model_flops"] / (row["numpy_wall_s"] * workers) / peak
    fraction = row["flop_rate"] / peak
    # the factored linear step has no such GEMMs: its products have k rows (k outputs)
    big = min(row["n"], row["d"], row["width"]) >= 64 and "factored" not in row["block"]
    need = NUMPY_TARGET if numpy_fraction < NUMPY_SLOW else 1.0
    met = [f"peak ≥ 50%: {'yes' if fraction >= PEAK_TARGET else '**no**'}"] if big else []
    ok = row["speedup_vs_numpy"] >= need
    met.append(f"× numpy ≥ {need:g}: {'yes' if ok else '**no**'}")
    return {"peak_fraction": fraction, "numpy_peak_fraction": numpy_fraction, "met": "; ".join(met)}


COLUMNS = [
    ("shape", "shape"),
    ("block", "block"),
    ("peak_fraction", "of peak"),
    ("flop_rate", "GFLOP/s per core"),
    ("phasesweep_wall_s", "phasesweep s"),
    ("speedup_vs_numpy", "× numpy"),
    ("speedup_vs_torch", "× torch"),
    ("numpy_max_rel_diff", "Δloss numpy"),
    ("torch_max_rel_diff", "Δloss torch"),
    ("numpy_peak_fraction", "numpy of peak"),
    ("met", "targets"),
]


def markdown(report: dict[str, Any]) -> str:
    m, b = report["meta"], report["blas"]
    lines = [
        f"# phasesweep shape suite ({report['mode']})",
        "",
        f"- machine: {m.get('cpu')}, {m.get('cores')} cores; torch {m.get('torch')}; "
        f"commit {m.get('commit')}; {m.get('date')}; wall {m.get('wall_s', 0):.0f} s; load "
        f"{m.get('load_start')} at start, {m.get('load_end')} at end",
        f"- {report['workers']} processes, one per core, one thread each; BLAS: numpy "
        f"{b['numpy']} (threads {b['numpy_threads']}), torch {b['torch']} "
        f"(threads {b['torch_threads']})",
        f"- float64 matmul peak of one thread: {report['peak_flops'] / 1e9:.1f} GFLOP/s "
        "(best at the start and the end); FLOP rate = FLOPs computed (6 · n · weights per "
        "member-step less the first layer's input gradient, which no step computes) over "
        "phasesweep's training time (the step loop), per core; bias-free linear nets train "
        "in factored form (block 'factored', pipeline.train._linear_step: FLOPs are that step's "
        "own, ~n/k times fewer; 'numpy of peak' counts the loop's backpropagation FLOPs)",
        "- speedups: wall time of the grid point by point (numpy GD loop, plain torch "
        "nn.Module + SGD; a subset, extrapolated per point) over phasesweep's (one chunk "
        "per process, data and init included); Δloss: largest relative difference of the "
        "final train losses",
        "- shape: n_train, input_dim, width, depth (weight matrices), activation, data shared "
        "by all members or one data set each, members; block: members per block of "
        "phasesweep's step, per process",
        "",
        "| " + " | ".join(h for _, h in COLUMNS) + " | steps |",
        "|" + "---|" * (len(COLUMNS) + 1),
    ]
    for r in report["shapes"]:
        cells = []
        for key, _ in COLUMNS:
            v = r[key]
            if key == "flop_rate":
                v = v / 1e9
            cells.append(",".join(map(str, v)) if isinstance(v, list) else _fmt(v))
        lines.append("| " + " | ".join(cells) + f" | {r['steps']} |")
    gpu = report.get("device")
    if gpu:
        lines += [
            "",
            f"## On {gpu['name']} (float64 matmul peak {gpu['peak_flops'] / 1e9:.1f} GFLOP/s)",
            "",
            "| shape | member-steps/s | of the device's peak | block | Δloss vs CPU |",
            "|---|---|---|---|---|",
        ]
        for g in gpu["shapes"]:
            lines.append(
                f"| {g['shape']} | {_fmt(g['member_steps_per_s'])} | {_fmt(g['peak_fraction'])} "
                f"| {g['block']} | {_fmt(g['max_rel_diff_vs_cpu'])} |"
            )
    return "\n".join(lines) + "\n"


def run(
    mode: str = "full",
    shapes: Sequence[Shape] | None = None,
    workers: int = 2,
    peak_seconds: float = 3.0,
    out_dir: Path | None = RESULTS,
    device: str | None = DEFAULT_DEVICE,
) -> dict[str, Any]:
    """Measure ``shapes`` (the mode's list by default); write ``shapes{.mode}.{json,md}``
    (``shapes.json`` for full) to ``out_dir`` unless None. ``device``: also train every
    grid there (:func:`device_pass`; by default on the GPU when there is one)."""
    shapes = list(shapes if shapes is not None else (FULL if mode == "full" else QUICK))
    started = time.perf_counter()
    meta = _meta()
    torch.set_num_threads(1)
    peaks = [training.matmul_peak(seconds=peak_seconds)["flops"]]
    ctx = multiprocessing.get_context("spawn")  # fresh processes: no inherited thread pools
    rows = []
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker) as pool:
        list(pool.map(_warm_up, range(2 * workers)))
        blas = pool.submit(blas_info).result()
        for shape in shapes:
            _log(f"shape {shape.name}")
            rows.append(measure(shape, pool, workers))
    peaks.append(training.matmul_peak(seconds=peak_seconds)["flops"])
    peak = max(peaks)
    for r in rows:  # against the best peak of the run
        r.update(targets(r, peak, workers))
    gpu = None
    if device is not None:
        gpu = device_pass(shapes, device, peak_seconds)
        for g, r in zip(gpu["shapes"], rows):
            g["max_rel_diff_vs_cpu"] = training.max_rel_diff(g.pop("final_loss"), r["final_loss"])
    for r in rows:
        del r["final_loss"]
    meta.update(wall_s=time.perf_counter() - started, load_end=_load())
    report = {
        "mode": mode,
        "meta": meta,
        "workers": workers,
        "blas": blas,
        "peak_flops": peak,
        "peaks": peaks,
        "shapes": rows,
        "device": gpu,
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = "shapes" if mode == "full" else f"shapes.{mode}"
        (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (out_dir / f"{stem}.md").write_text(markdown(report))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.shapes", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a smoke run (< 2 min) at toy sizes")
    ap.add_argument("--workers", type=int, default=2, help="processes (one per core)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the results")
    ap.add_argument(
        "--device",
        default=DEFAULT_DEVICE,
        help="also train every grid on this device, e.g. cuda (default: cuda when present)",
    )
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full"
    report = run(mode, workers=args.workers, out_dir=args.out, device=args.device)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
