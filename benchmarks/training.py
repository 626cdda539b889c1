"""Training benchmarks: phasesweep against the plain loops users would otherwise run.

Every function here measures one thing on the machine it runs on and returns a
plain dict; :mod:`benchmarks.run` puts them side by side. Nothing asserts a speed.

- :func:`matmul_peak`: the dense matmul rate of one core for a dtype (the physical limit).
- :func:`phasesweep_inprocess`: one chunk trained by :class:`pipeline.train._trainer.ChunkTrainer`
  in this process, with the split of its time into training, metrics and the rest.
- :func:`phasesweep_ray`: the whole pipeline: chunks as Ray Tune trials, tables written
  to a Parquet store (what ``phasesweep run`` does).
- :func:`plain_loop`: baseline (b), every point trained alone by a plain ``nn.Module``
  and ``torch.optim.SGD`` in this process.
- :func:`ray_tune_baseline`: baseline (a), one Ray Tune trial per point running the same
  plain loop and reporting its losses to Tune at the logged steps.

The plain loops train exactly what phasesweep trains (same data, initial weights,
parameterization and learning rate), so their final losses can be compared with
phasesweep's (``max_rel_diff_final_loss``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from phasesweep.pipeline.grid import Chunk, Point, expand, flops_per_step, make_chunks
from phasesweep.pipeline.spec import RunConfig, SweepSpec, validate_spec
from phasesweep.pipeline.train._optim import step_rows

# -- the grid -----------------------------------------------------------------------------


def grid_spec(
    points: int,
    steps: int,
    width: int = 64,
    depth: int = 3,
    n_train: int = 128,
    log_points: int = 100,
    name: str = "bench",
    metrics: dict[str, Any] | None = None,
    scales: int = 16,
    n_test: int | None = None,
) -> SweepSpec:
    """A lazy-vs-rich grid: ``points`` = init scales (up to ``scales``, 10^-2 … 10^0.5) ×
    seeds.

    Teacher data (``n_test`` test points, default the spec's), NTK parameterization,
    bias-free ReLU, full-batch GD with the learning rate scaled down for large inits (no
    member diverges), float64.
    """
    n_scales = min(scales, points)
    if points % n_scales:
        raise ValueError(f"points must be a multiple of {n_scales}, got {points}")
    raw: dict[str, Any] = {
        "name": name,
        "model": {"depth": depth, "width": width, "activation": "relu"},
        "data": {"kind": "teacher", "n_train": n_train, "input_dim": 10},
        "train": {
            "steps": steps,
            "lr": 0.05,
            "log_points": log_points,
            "lr_scaling": {"init_scale_depth_power": -2.0, "init_scale_floor": 1.0},
        },
        "grid": {
            "init_scale": {"logspace": [-2, 0.5, n_scales]},
            "seed": list(range(points // n_scales)),
        },
    }
    if metrics is not None:
        raw["metrics"] = metrics
    if n_test is not None:
        raw["data"]["n_test"] = n_test
    return validate_spec(raw)


def describe(spec: SweepSpec, points: int) -> str:
    m, d, t = spec.model, spec.data, spec.train
    return (
        f"{points} points (init_scale x seed), depth {m.depth}, width {m.width}, "
        f"{m.activation}, {m.parameterization}, n_train {d.n_train}, input_dim {d.input_dim}, "
        f"{t.steps} full-batch GD steps, {t.log_points} log points, {t.dtype}"
    )


def subset(points: Sequence[Point], n: int) -> list[Point]:
    """``n`` points spread evenly over the grid (every k-th)."""
    idx = np.linspace(0, len(points) - 1, n).round().astype(int)
    return [points[i] for i in idx]


# -- the physical limit -------------------------------------------------------------------


def matmul_peak(
    dtype: torch.dtype = torch.float64,
    sizes: Sequence[int] = (1024, 2048),
    seconds: float = 2.0,
    device: str = "cpu",
) -> dict[str, Any]:
    """Best observed dense matmul rate (FLOP/s) with the current torch threads, over sizes."""
    best, best_n = 0.0, 0
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        c = torch.empty_like(a)
        torch.mm(a, b, out=c)
        deadline = time.perf_counter() + seconds / len(sizes)
        while True:
            sync(device)
            t = time.perf_counter()
            torch.mm(a, b, out=c)
            sync(device)
            dt = time.perf_counter() - t
            best, best_n = max((best, best_n), (2.0 * n**3 / dt, n))
            if time.perf_counter() > deadline:
                break
    return {"flops": best, "size": best_n, "threads": torch.get_num_threads(), "dtype": str(dtype)}


def sync(device: str | torch.device) -> None:
    """Wait for ``device``'s queued work (a CUDA device's; nothing elsewhere)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


# -- phasesweep ---------------------------------------------------------------------------


def best_of(repeats: int, fn, *args, key: str = "train_s", **kwargs) -> dict[str, Any]:
    """The result of ``fn`` with the smallest ``key`` over ``repeats`` calls, plus all of them."""
    runs = [fn(*args, **kwargs) for _ in range(max(1, repeats))]
    best = dict(min(runs, key=lambda r: r[key]))
    best["repeats"] = [r[key] for r in runs]
    return best


def phasesweep_inprocess(points: Sequence[Point], device: str = "cpu") -> dict[str, Any]:
    """Train ``points`` as one chunk in this process; wall time includes data and init."""
    from phasesweep.pipeline.train._linear_step import LinearStep, factored_flops
    from phasesweep.pipeline.train._trainer import ChunkTrainer

    started = time.perf_counter()
    trainer = ChunkTrainer(Chunk("bench", tuple(points)), device)
    tables = trainer.run()
    wall = time.perf_counter() - started
    cfg = points[0].config
    step = trainer.make_step()
    model_flops = flops_per_step(cfg) * cfg.train.steps * len(points)
    flops = model_flops
    if isinstance(step, LinearStep):  # the factored step computes far fewer
        flops = factored_flops(trainer.net.dims, step_rows(cfg)) * cfg.train.steps * len(points)
    runs = tables["runs"]
    return {
        "wall_s": wall,
        **trainer.timing,
        "setup_s": wall - sum(trainer.timing.values()),
        "points": len(points),
        "steps": cfg.train.steps,
        # FLOPs the steps computed, and those of backpropagation (what a plain loop computes)
        "flops": flops,
        "model_flops": model_flops,
        "engine": type(step).__name__,
        "train_flop_rate": flops / trainer.timing["train_s"],
        "block": step.block_size(trainer.batch.x_train),
        "trajectory_rows": tables["trajectories"].num_rows,
        "final_loss": dict(
            zip(
                runs.column("run_id").to_pylist(),
                runs.column("final_train_loss").to_pylist(),
            )
        ),
    }


def phasesweep_ray(
    points: Sequence[Point], spec: SweepSpec, store_dir: str, n_trials: int
) -> dict[str, Any]:
    """The whole pipeline: chunks (at least ``n_trials``) as Ray Tune trials of 1 CPU,
    tables committed to a store at ``store_dir``. Ray must be initialised already."""
    import resource

    import pyarrow.dataset as ds
    from phasesweep.pipeline.run._driver import run_chunks
    from phasesweep.storage import Store

    store = Store.open(store_dir)
    chunks = make_chunks(points, spec, min_chunks=n_trials)
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    outcome = run_chunks(
        store,
        spec.name,
        chunks,
        total=len(points),
        skipped=0,
        cpus_per_trial=1,
        progress=False,
    )
    wall = time.perf_counter() - started
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    if outcome.failed or outcome.trained != len(points):
        raise RuntimeError(f"phasesweep run failed: {outcome}")
    files = [f for e in store.manifest(spec.name) for f in e["files"]]
    traj = [f for f in files if f["table"] == "trajectories"]
    runs = ds.dataset(store.files("runs", spec.name), format="parquet").to_table(
        columns=["chunk_id", "chunk_wall_seconds"]
    )
    trainer_s = dict(zip(runs.column(0).to_pylist(), runs.column(1).to_pylist()))
    return {
        "wall_s": wall,
        "points": len(points),
        "chunks": len(chunks),
        # the trainer's wall time inside each trial, and the CPU the driver (Tune) used
        "trainer_s": sorted(trainer_s.values()),
        "driver_cpu_s": (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime),
        "trajectory_rows": sum(f["rows"] for f in traj),
        "trajectory_bytes": sum(f["bytes"] for f in traj),
    }


# -- the plain loops users write ----------------------------------------------------------


class PlainMLP(torch.nn.Module):
    """What a researcher writes: nn.Linear layers, the parameterization's multipliers in forward."""

    def __init__(
        self, dims: Sequence[int], multipliers: Sequence[float], activation: str, bias: bool
    ):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(a, b, bias=bias, dtype=torch.float64)
            for a, b in zip(dims[:-1], dims[1:])
        )
        self.c = list(multipliers)
        self.act = {
            "relu": torch.relu,
            "tanh": torch.tanh,
            "linear": lambda z: z,
            "leaky_relu": torch.nn.functional.leaky_relu,
        }[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for l, lin in enumerate(self.layers):
            z = self.c[l] * torch.nn.functional.linear(x, lin.weight)
            if lin.bias is not None:
                z = z + lin.bias
            x = self.act(z) if l < len(self.layers) - 1 else z
        return x


def plain_train(config: RunConfig, report=None) -> float:
    """Train one point with nn.Module + torch.optim.SGD; returns the final train loss.

    Data, initial weights and learning rate are phasesweep's for this point. The
    train and test losses are computed at the same log-spaced steps phasesweep logs
    and passed to ``report(step, train_loss, test_loss)`` if given.
    """
    from phasesweep.pipeline.data._datasets import data_seed, make_dataset
    from phasesweep.pipeline.grid import member_lr
    from phasesweep.pipeline.train._init import init_params
    from phasesweep.pipeline.train._models import EnsembleMLP
    from phasesweep.storage.schema import log_steps

    ds = make_dataset(config.data, data_seed(config.data, config.train.seed))
    x, y = ds.x_train.to(torch.float64), ds.y_train.to(torch.float64)
    x_test, y_test = ds.x_test.to(torch.float64), ds.y_test.to(torch.float64)
    net = EnsembleMLP(config.model, x.shape[1], y.shape[1])
    p0 = init_params(net, [config.model], [config.train.seed])
    model = PlainMLP(net.dims, net.multipliers, config.model.activation, config.model.bias)
    with torch.no_grad():
        for l, lin in enumerate(model.layers):
            lin.weight.copy_(p0.weights[l][0])
            if lin.bias is not None:
                lin.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=member_lr(config))
    logged = set(log_steps(config.train.steps, config.train.log_points).tolist())
    n = x.shape[0]
    loss_value = float("nan")
    for k in range(config.train.steps + 1):
        opt.zero_grad()
        loss = 0.5 * (model(x) - y).square().sum() / n
        if k in logged:
            loss_value = loss.item()
            if report is not None:
                with torch.no_grad():
                    test = 0.5 * (model(x_test) - y_test).square().sum() / x_test.shape[0]
                report(k, loss_value, test.item())
        if k == config.train.steps:
            break
        loss.backward()
        opt.step()
    return loss_value


def plain_loop(points: Sequence[Point]) -> dict[str, Any]:
    """Baseline (b): the points one after another in this process (threads unchanged)."""
    warm = points[0].config
    plain_train(warm.model_copy(update={"train": warm.train.model_copy(update={"steps": 1})}))
    started = time.perf_counter()
    finals = {}
    for p in points:
        finals[p.run_id] = plain_train(p.config, report=lambda *a: None)
    return {"wall_s": time.perf_counter() - started, "points": len(points), "final_loss": finals}


def _tune_trial(config: dict[str, Any], configs: list[str]) -> None:
    """A Ray Tune user's trainable: one grid point, losses reported at the logged steps."""
    import torch
    from ray import tune

    torch.set_num_threads(1)  # generous: torch's default (all cores) is many times slower
    started = time.perf_counter()
    in_report = 0.0

    def report(step: int, train: float, test: float) -> None:
        nonlocal in_report
        t = time.perf_counter()
        # the benchmark's own bookkeeping rides along: time in the trial and in tune.report
        tune.report(
            {
                "step": step,
                "train_loss": train,
                "test_loss": test,
                "trial_s": t - started,
                "report_s": in_report,
            }
        )
        in_report += time.perf_counter() - t

    plain_train(RunConfig.model_validate_json(configs[config["point"]]), report=report)


def ray_tune_baseline(points: Sequence[Point], name: str = "baseline") -> dict[str, Any]:
    """Baseline (a): ``tune.Tuner`` with one trial (1 CPU) per point, Tune's defaults
    otherwise (loggers, reuse of actors). Ray must be initialised already."""
    import cloudpickle
    from ray import tune

    import benchmarks.training as this

    # the trainable travels by value: workers import pipeline, not benchmarks
    cloudpickle.register_pickle_by_value(this)
    configs = [p.config.model_dump_json() for p in points]
    storage = tempfile.mkdtemp(prefix="phasesweep-bench-tune-")
    try:
        trainable = tune.with_resources(
            tune.with_parameters(_tune_trial, configs=configs), {"cpu": 1}
        )
        tuner = tune.Tuner(
            trainable,
            param_space={"point": tune.grid_search(list(range(len(points))))},
            run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
        )
        started = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - started
        errors = [r.error for r in results if r.error is not None]
        if errors:
            raise RuntimeError(f"Ray Tune baseline failed: {errors[0]}")
        finals = {}
        trial_s = report_s = 0.0
        for r in results:
            finals[points[r.config["point"]].run_id] = r.metrics["train_loss"]
            trial_s += r.metrics["trial_s"]
            report_s += r.metrics["report_s"]
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        cloudpickle.unregister_pickle_by_value(this)
    return {
        "wall_s": wall,
        "points": len(points),
        "final_loss": finals,
        # summed over trials: seconds inside the trainable, and of those inside tune.report
        "trial_s": trial_s,
        "report_s": report_s,
    }


def ray_init() -> float:
    """Start the local Ray instance the way ``phasesweep run`` does; returns seconds."""
    from phasesweep.pipeline.run._ray import connect

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    started = time.perf_counter()
    connect(None)
    return time.perf_counter() - started


def ray_cpus() -> int:
    import ray

    return int(ray.cluster_resources().get("CPU", 1))


def max_rel_diff(a: dict[str, float], b: dict[str, float]) -> float:
    """Largest relative difference of the values both dicts have (NaN if none)."""
    common = [k for k in a if k in b]
    if not common:
        return float("nan")
    x = np.array([a[k] for k in common], dtype=float)
    y = np.array([b[k] for k in common], dtype=float)
    return float(np.max(np.abs(x - y) / np.maximum(np.abs(y), 1e-300)))


def grid_points(spec: SweepSpec) -> list[Point]:
    return expand(spec)


def log_steps_of(spec: SweepSpec) -> np.ndarray:
    from phasesweep.storage.schema import log_steps

    return log_steps(spec.train.steps, spec.train.log_points)
