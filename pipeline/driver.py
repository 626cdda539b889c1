"""Run a sweep's chunks as Ray Tune trials; the Parquet store keeps the results.

Tune is the scheduler, not the results store: each trial trains one chunk,
writes its tables to the store (atomically, ``runs`` last), and reports a few
summary numbers. Trials keep no checkpoints, Tune's loggers are off and its
experiment directory is a temporary one removed at the end, so nothing of
Tune's grows with the grid.

Idempotence: before training, a trial drops the members the store already
holds (a retried trial whose first attempt committed trains nothing), so a
crash, a killed worker or a retry never duplicates a run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from phasesweep.pipeline.grid import Chunk, Point
from phasesweep.pipeline.spec import RunConfig
from phasesweep.storage import Store
from phasesweep.storage.schema import RUNS
from tqdm.auto import tqdm

#: Environment variable naming run ids whose training raises (comma-separated, or
#: ``*`` for all): a fault injector for testing retries and the ``failed`` status.
FAULT_ENV = "PHASESWEEP_INJECT_FAILURE"


@dataclass
class SweepOutcome:
    """What a launch did: points trained, skipped as already stored, diverged, failed."""

    total: int
    skipped: int
    trained: int = 0
    diverged: int = 0
    failed: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _encode(chunks: Sequence[Chunk]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Compact, picklable chunks: (chunk_id, [(run_id, config JSON), ...])."""
    return [
        (c.chunk_id, [(p.run_id, p.config.model_dump_json()) for p in c.points]) for c in chunks
    ]


def _decode(chunk_id: str, members: list[tuple[str, str]]) -> Chunk:
    points = tuple(Point(rid, RunConfig.model_validate_json(cfg), {}) for rid, cfg in members)
    return Chunk(chunk_id, points)


def _inject_failure(run_ids: Sequence[str]) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    targets = {s for s in spec.split(",") if s}
    if "*" in targets or targets.intersection(run_ids):
        raise RuntimeError(f"{FAULT_ENV} injected a failure into this chunk")


def train_and_store(
    store_uri: str, sweep: str, chunk: Chunk, device: str, node_id: str | None = None
) -> dict[str, Any]:
    """Train the chunk's members that the store does not hold yet and commit them.

    Returns the small summary a Tune trial reports.
    """
    from phasesweep.pipeline.trainer import train_chunk

    store = Store.open(store_uri)
    done = store.done_run_ids(sweep)
    todo = tuple(p for p in chunk.points if p.run_id not in done)
    summary = {"points": len(todo), "skipped": len(chunk.points) - len(todo), "diverged": 0}
    if not todo:
        return summary
    _inject_failure([p.run_id for p in todo])
    started = time.perf_counter()
    tables = train_chunk(Chunk(chunk.chunk_id, todo), device)
    runs = tables["runs"]
    tables["runs"] = runs.set_column(
        runs.schema.get_field_index("node_id"),
        "node_id",
        pa.array([node_id] * runs.num_rows, pa.string()),
    )
    store.write_chunk(sweep, chunk.chunk_id, tables)
    status = tables["runs"].column("status").to_pylist()
    summary.update(diverged=status.count("diverged"), seconds=time.perf_counter() - started)
    return summary


def _trial(config: dict[str, Any], store_uri: str, sweep: str, chunks: list) -> None:
    """Tune trainable: one chunk. Threads = the CPUs Ray gave this trial."""
    import ray
    import torch
    from ray import tune

    assigned = ray.get_runtime_context().get_assigned_resources()
    torch.set_num_threads(max(1, int(assigned.get("CPU", 1))))
    device = "cuda" if assigned.get("GPU", 0) > 0 and torch.cuda.is_available() else "cpu"
    chunk = _decode(*chunks[config["chunk"]])
    node = ray.get_runtime_context().get_node_id()
    tune.report(train_and_store(store_uri, sweep, chunk, device, node))


def failed_runs_table(points: Sequence[Point], chunk_id: str, error: str) -> pa.Table:
    """``runs`` rows with status 'failed' for points whose trial failed after retries."""
    from datetime import datetime, timezone

    from phasesweep.pipeline.trainer import point_columns, table_of

    n = len(points)
    cols = point_columns(points, chunk_id)
    cols.update(
        status=["failed"] * n,
        finished_at=[datetime.now(timezone.utc)] * n,
        error=[error[-2000:]] * n,
    )
    return table_of(RUNS, cols, n)


def _on_loopback(address: str | None) -> bool:
    """The embedded instance, or a cluster whose head is on this machine's loopback."""
    return not address or address.split("://")[-1].rsplit(":", 1)[0] in ("127.0.0.1", "localhost")


def _ray_init(address: str | None) -> None:
    if _on_loopback(address):
        # Ray resolves a loopback head address to the machine's outward IP unless
        # this is off (read when ray is first imported); keep everything on loopback.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = dict(
        include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR"
    )
    if _on_loopback(address):
        kwargs["_node_ip_address"] = "127.0.0.1"
    ray.init(address=address or None, **kwargs)


def run_chunks(
    store: Store,
    sweep: str,
    chunks: Sequence[Chunk],
    *,
    total: int,
    skipped: int,
    address: str | None = None,
    cpus_per_trial: float = 1,
    gpus_per_trial: float = 0,
    max_retries: int = 2,
    progress: bool = True,
) -> SweepOutcome:
    """Schedule ``chunks`` as Tune trials and wait; returns what happened.

    Points of trials that still fail after ``max_retries`` retries are stored
    with status ``failed`` (a relaunch trains them again).
    """
    outcome = SweepOutcome(total=total, skipped=skipped)
    if not chunks:
        return outcome
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the new console output ignores verbose=0
    os.environ.setdefault("TUNE_RESULT_BUFFER_LENGTH", "1")
    _ray_init(address)
    from ray import tune

    n_points = sum(len(c.points) for c in chunks)
    bar = tqdm(total=n_points, unit="pt", desc=f"{sweep}", disable=not progress, smoothing=0.1)
    bar.set_postfix(skipped=skipped)

    class _Progress(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):  # noqa: ANN001
            outcome.trained += result.get("points", 0)
            outcome.diverged += result.get("diverged", 0)
            bar.update(result.get("points", 0) + result.get("skipped", 0))

    trainable = tune.with_resources(
        tune.with_parameters(_trial, store_uri=store.uri, sweep=sweep, chunks=_encode(chunks)),
        {"cpu": cpus_per_trial, "gpu": gpus_per_trial},
    )
    tune_dir = tempfile.mkdtemp(prefix="phasesweep-tune-")
    try:
        tuner = tune.Tuner(
            trainable,
            param_space={"chunk": tune.grid_search(list(range(len(chunks))))},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(
                name=sweep,
                storage_path=tune_dir,
                failure_config=tune.FailureConfig(max_failures=max_retries),
                verbose=0,
                callbacks=[_Progress()],
            ),
        )
        results = tuner.fit()
        # A trial whose worker died before it started has no config: every chunk
        # with points the store lacks is failed, with its trial's error if known.
        errors = [r for r in results if r.error is not None]
        by_chunk = {r.config["chunk"]: _describe(r.error) for r in errors if r.config}
        fallback = (
            _describe(errors[0].error) if errors else "trial ended without storing its points"
        )
        done = store.done_run_ids(sweep)
        for i, chunk in enumerate(chunks):
            lost = [p for p in chunk.points if p.run_id not in done]
            if not lost:
                continue
            message = by_chunk.get(i, fallback)
            store.write_chunk(
                sweep, chunk.chunk_id, {"runs": failed_runs_table(lost, chunk.chunk_id, message)}
            )
            outcome.failed += [p.run_id for p in lost]
            outcome.errors.append(message)
            bar.update(len(lost))
    finally:
        bar.close()
        shutil.rmtree(tune_dir, ignore_errors=True)
    return outcome


def trial_slots(address: str | None, cpus_per_trial: float) -> int:
    """How many trials of ``cpus_per_trial`` CPUs run at once: on the cluster at
    ``address`` (connecting to it), or on this machine when ``address`` is None."""
    if address:
        import ray

        _ray_init(address)
        cpus = ray.cluster_resources().get("CPU", 1)
    else:
        cpus = os.cpu_count() or 1
    return max(1, int(cpus // cpus_per_trial))


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def flops_estimate(points: Sequence[Point]) -> float:
    """Training FLOPs of the points (forward + backward, all steps)."""
    from phasesweep.pipeline.grid import flops_per_step

    return float(np.sum([flops_per_step(p.config) * p.config.train.steps for p in points]))
