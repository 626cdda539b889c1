"""Two trials on one card (``--gpus-per-trial 0.5``): does one trial's host work hide
behind the other's training?

    python -m benchmarks.gpu_pair                  # on CUDA: about a minute on an H100 or H200
    python -m benchmarks.gpu_pair --device cpu --members 32 --steps 30 --chunks 2
                                                   # the same code on the CPU (the smoke test)

A trial on a GPU spends part of each chunk on the host (expansion, set-up, tables,
Parquet: :mod:`benchmarks.gpu` times each), while the card waits. With two trials per
card, each planned for half its memory, one trial's host work can run while the other
trains. The grid is :mod:`benchmarks.gpu`'s (10⁶ points, width 16, depth 2, the default
metrics, ``--steps`` steps, 20 logged), cut by the planner for half the card's memory.

Each trial is a process of its own, as Ray's trials are (no Ray here): it trains one chunk
to warm up (CUDA context, cuBLAS, graph capture; not timed), waits for the others, then
trains ``--chunks`` chunks back to back as a trial does (expansion, set-up, training with
the metrics, tables, the Parquet encoding on :data:`benchmarks.gpu.WRITE_THREADS`
threads). First one trial alone (the baseline), then two at once, from the same start:
they begin in step, both on the host, so the measured overlap is a lower bound of what
trials that have drifted apart reach. Reports the points per second of each, their ratio,
and the whole grid's time extrapolated from each (one card). Writes ``gpu_pair.json`` to
``--out``; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import queue
import sys
import time
from pathlib import Path
from typing import Any

from phasesweep.pipeline.spec import SweepSpec

from benchmarks.gpu import METRICS, RESULTS, WRITE_THREADS, grid_spec

#: Trials at once in the measured run (the baseline is one).
TRIALS = 2


def pair_spec(steps: int) -> SweepSpec:
    """The grid both runs train: :mod:`benchmarks.gpu`'s at width 16, depth 2, the
    default metrics, ``steps`` steps, 20 logged."""
    return grid_spec(16, 2, steps, 20, METRICS["default"])


def _chunks(device: str, steps: int, members: int | None, share: float) -> tuple[Any, list]:
    """The grid, and the planner's chunks of it for a trial given ``share`` of the card's
    memory, each cut to ``members``."""
    import torch
    from phasesweep.pipeline.grid import Grid
    from phasesweep.pipeline.run._plan import plan_chunks

    grid = Grid(pair_spec(steps))
    cuda = torch.device(device).type == "cuda"
    memory = int(torch.cuda.get_device_properties(device).total_memory * share) if cuda else None
    tasks = plan_chunks(grid, device_memory=memory)
    if members is not None:
        tasks = [dataclasses.replace(t, stop=min(t.stop, t.start + members)) for t in tasks]
    return grid, tasks


def _trial(rank: int, trials: int, args: dict, start: Any, results: Any) -> None:
    """One trial's process: a warm-up chunk, then ``args["chunks"]`` timed ones from the
    shared ``start``; puts (points, seconds from the start to its last chunk's end)."""
    import torch
    from phasesweep.pipeline.run._plan import expand_task
    from phasesweep.pipeline.train._trainer import ChunkTrainer
    from phasesweep.storage._parquet import encode_tables

    torch.set_num_threads(1)
    grid, tasks = _chunks(args["device"], args["steps"], args["members"], 1 / trials)
    mine = tasks[rank::trials][: args["chunks"] + 1]

    def train(task) -> int:
        chunk = expand_task(grid, task)
        encode_tables(ChunkTrainer(chunk, args["device"]).run(), WRITE_THREADS)
        return len(chunk.points)

    train(mine[0])
    start.wait()
    began = time.perf_counter()
    points = sum(train(task) for task in mine[1:])
    results.put((points, time.perf_counter() - began))


def measure(trials: int, args: dict) -> dict[str, Any]:
    """Points per second of ``trials`` trial processes at once (see the module docstring)."""
    context = mp.get_context("spawn")  # a fresh process per trial, as Ray's workers are
    start, results = context.Barrier(trials), context.Queue()
    procs = [
        context.Process(target=_trial, args=(rank, trials, args, start, results))
        for rank in range(trials)
    ]
    try:
        for p in procs:
            p.start()
        done: list[tuple[int, float]] = []
        while len(done) < trials:
            try:
                done.append(results.get(timeout=1))
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode]
                if failed:
                    raise RuntimeError(f"a trial process exited {failed[0]}") from None
    finally:  # one that failed leaves the others waiting at the start
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    points, seconds = sum(d[0] for d in done), max(d[1] for d in done)
    return {"trials": trials, "points": points, "seconds": seconds, "rate": points / seconds}


def run(args: dict) -> dict[str, Any]:
    """The baseline and the pair, with the grid's time extrapolated from each."""
    from phasesweep.pipeline.grid import grid_size

    size = grid_size(pair_spec(args["steps"]))
    rows = [measure(1, args), measure(TRIALS, args)]
    for row in rows:
        row["grid_s"] = size / row["rate"]
    return {**args, "grid_points": size, "rows": rows, "speedup": rows[1]["rate"] / rows[0]["rate"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_pair", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    ap.add_argument("--members", type=int, help="most members of a chunk (default the planner's)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--chunks", type=int, default=2, help="timed chunks per trial")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for gpu_pair.json")
    args = ap.parse_args(argv)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    report = run(settings)
    for row in report["rows"]:
        print(
            f"{row['trials']} trial(s) at once: {row['points']} points in {row['seconds']:.2f} s, "
            f"{row['rate']:.4g} points/s; the grid in {row['grid_s']:.4g} s"
        )
    print(f"two trials per card against one: {report['speedup']:.3f}x the points per second")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_pair.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
