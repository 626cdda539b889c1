"""The host's per-point work on a trial: expansion, set-up and tables, per point.

    python -m benchmarks.host                      # the CPU, 20,000 members at width 16
    python -m benchmarks.host --device cuda --members 200000 --wide-members 5650

One chunk of the issue-33 grid (50 init scales × 20,000 seeds = 10⁶ points; teacher
data, n_train 64, n_test 128, input_dim 10; bias-free ReLU, NTK parameterization,
float64; metrics off; 20 logged steps), its first ``--members`` members in member order,
and at width 256, depth 4 its first ``--wide-members``. For each, in microseconds per
point:

- ``expand``: the trial's expansion of its task into members
  (:func:`pipeline.run._plan.expand_task`);
- ``setup``: :class:`~pipeline.train._trainer.ChunkTrainer`'s constructor (data, initial
  weights, learning rates);
- ``tables``: the trainer's time outside its step loop, its metrics and the constructor
  (its ``other_s``: the tables; the metrics recorder's set-up is metrics), over
  ``--steps`` steps;

and, at width 256, set-up plus tables as a fraction of a 1000-step training of the same
chunk (the training's seconds per step over ``--steps`` steps, times 1000; the issue's
aim: ≤ 0.1). :func:`measure_host` is what ``benchmarks/gpu.py`` imports. Writes
``host.json`` (``host.<device>.json`` off the CPU) to ``--out``; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from phasesweep.pipeline.grid import Grid
from phasesweep.pipeline.run._plan import ChunkTask, expand_task
from phasesweep.pipeline.spec import SweepSpec, validate_spec
from phasesweep.pipeline.train._trainer import ChunkTrainer

RESULTS = Path(__file__).resolve().parent / "results"
#: The issue's grid: init scales × seeds.
INIT_SCALES, SEEDS = 50, 20_000
#: The training the set-up and tables are compared with (steps).
REFERENCE_STEPS = 1000


def host_spec(width: int, depth: int, steps: int) -> SweepSpec:
    """The issue-33 grid at ``width``, ``depth`` and ``steps`` (see the module docstring)."""
    return validate_spec(
        {
            "name": "host",
            "model": {"depth": depth, "width": width, "activation": "relu"},
            "data": {"kind": "teacher", "n_train": 64, "n_test": 128, "input_dim": 10},
            "train": {"steps": steps, "lr": 0.05, "log_points": 20},
            "metrics": {"ntk": False, "spectra": False, "linearized": False},
            "execution": {"max_points": INIT_SCALES * SEEDS},
            "grid": {
                "init_scale": {"logspace": [-2, 0.5, INIT_SCALES]},
                "seed": {"range": [0, SEEDS]},
            },
        }
    )


def measure_host(
    device: str, members: int, width: int = 16, depth: int = 2, steps: int = 20
) -> dict[str, Any]:
    """Seconds and microseconds per point of one chunk's expansion, set-up and tables (see
    the module docstring): the first ``members`` members of the grid at ``width`` and
    ``depth``, trained ``steps`` steps on ``device``. Returns the figures as a dict."""
    spec = host_spec(width, depth, steps)
    grid = Grid(spec)
    task = ChunkTask("host" + "0" * 20, next(iter(grid.groups())), 0, members, steps)
    mark = time.perf_counter()
    chunk = expand_task(grid, task)
    expand_s = time.perf_counter() - mark
    mark = time.perf_counter()
    trainer = ChunkTrainer(chunk, device)
    setup_s = time.perf_counter() - mark
    trainer.run()
    timing = trainer.timing
    tables_s = timing["other_s"]
    per_step = timing["train_s"] / steps
    us = lambda seconds: 1e6 * seconds / members  # noqa: E731
    return {
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "members": members,
        "width": width,
        "depth": depth,
        "steps": steps,
        "expand_s": expand_s,
        "setup_s": setup_s,
        "tables_s": tables_s,
        "train_s": timing["train_s"],
        "expand_us": us(expand_s),
        "setup_us": us(setup_s),
        "tables_us": us(tables_s),
        "train_us_per_step": us(per_step),
        "host_vs_training": (setup_s + tables_s) / (per_step * REFERENCE_STEPS),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.host", description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--members", type=int, default=20_000, help="members at width 16, depth 2")
    ap.add_argument("--wide-members", type=int, default=256, help="members at width 256, depth 4")
    ap.add_argument("--steps", type=int, default=20, help="steps trained per chunk")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = [
        measure_host(args.device, args.members, 16, 2, args.steps),
        measure_host(args.device, args.wide_members, 256, 4, args.steps),
    ]
    print(f"{'width':>5} {'depth':>5} {'members':>8} {'expand':>8} {'setup':>8} {'tables':>8}"
          f"  µs/point;  set-up + tables / {REFERENCE_STEPS} steps")  # fmt: skip
    for r in rows:
        print(
            f"{r['width']:>5} {r['depth']:>5} {r['members']:>8} {r['expand_us']:>8.2f} "
            f"{r['setup_us']:>8.2f} {r['tables_us']:>8.2f}  {r['host_vs_training']:.3f}"
        )
    name = "host.json" if args.device == "cpu" else f"host.{args.device.split(':')[0]}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / name).write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
