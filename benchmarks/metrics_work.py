"""Where the accelerator's metrics spend their work: flops and seconds per member, by method.

    python -m benchmarks.metrics_work                  # the CPU, 512 members (~15 s)
    python -m benchmarks.metrics_work --device cuda --members 71429

One chunk of the issue-33 grid (``benchmarks/host.py``: 50 init scales × 20,000 seeds,
width 16, depth 2, teacher data, n_train 64, 1000 steps, 20 logged) with the default
metrics, trained on the accelerator's paths (``accelerated=True``, also on the CPU, where
the flops are the GPU's and the seconds a stand-in). For each batched-matmul method of
the metrics (the NTK, the kernel's extreme eigenvalues by squaring, the layers' top
singular values by subspace iteration, the kernel predictor's integrals): the calls, the
flops per member (``torch.utils.flop_counter``: matmuls only) and the seconds (the device
synchronised around each call; the counting adds a Python call per operator to both).
Beside them, the trainer's own timing and the training's model flops per member (as the
spectra budget counts them). Writes ``metrics_work.json`` (``metrics_work.<device>.json``
off the CPU) to ``--out``; nothing asserts a time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from phasesweep.pipeline.grid import Grid, step_flops
from phasesweep.pipeline.run._plan import ChunkTask, expand_task
from phasesweep.pipeline.spec import validate_spec
from phasesweep.pipeline.train._optim import step_rows
from phasesweep.pipeline.train._trainer import ChunkTrainer
from phasesweep.pipeline.train.metrics import _decay, _metrics, _squaring, _subspace
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.host import host_spec
from benchmarks.training import sync

RESULTS = Path(__file__).resolve().parent / "results"

#: (module, attribute, label) of each method measured: where the recorder looks it up.
METHODS = (
    (_metrics, "empirical_ntk", "ntk"),
    (_squaring, "extreme_eigenvalues", "kernel eigenvalues (squaring)"),
    (_subspace, "top_singular_values", "layer singular values (subspace)"),
    (_decay, "integrals", "kernel predictor (integrals)"),
)


@contextmanager
def _counted(device: torch.device, work: dict[str, dict[str, float]]) -> Iterator[None]:
    """Each of :data:`METHODS` wrapped to add its calls, flops and seconds to ``work``."""

    def wrap(fn: Callable, label: str) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            sync(device)
            with FlopCounterMode(display=False) as flops:
                mark = time.perf_counter()
                out = fn(*args, **kwargs)
                sync(device)
            row = work.setdefault(label, {"calls": 0, "flops": 0.0, "seconds": 0.0})
            row["calls"] += 1
            row["flops"] += flops.get_total_flops()
            row["seconds"] += time.perf_counter() - mark
            return out

        return call

    originals = [(module, name, getattr(module, name)) for module, name, _ in METHODS]
    try:
        for (module, name, fn), (_, _, label) in zip(originals, METHODS):
            setattr(module, name, wrap(fn, label))
        yield
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)


def measure(device: str, members: int, steps: int = 1000) -> dict[str, Any]:
    """The figures of the module docstring for the first ``members`` members of the grid,
    trained ``steps`` steps on ``device``."""
    raw = host_spec(16, 2, steps).model_dump()
    raw["metrics"] = {}  # the defaults
    grid = Grid(validate_spec(raw))
    task = ChunkTask("work" + "0" * 20, next(iter(grid.groups())), 0, members, steps)
    trainer = ChunkTrainer(expand_task(grid, task), device, accelerated=True)
    work: dict[str, dict[str, float]] = {}
    with _counted(trainer.device, work):  # the methods only: the step stays capturable
        trainer.run()
    per_member = lambda x: x / members  # noqa: E731
    return {
        "device": str(trainer.device),
        "members": members,
        "steps": steps,
        "timing": trainer.timing,
        "training_flops_per_member": step_flops(trainer.net.dims, step_rows(trainer.base)) * steps,
        "methods": {
            label: {**row, "flops_per_member": per_member(row["flops"])}
            for label, row in work.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.metrics_work", description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--members", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    r = measure(args.device, args.members, args.steps)
    t = r["timing"]
    print(f"{r['members']} members, {r['steps']} steps on {r['device']}: training "
          f"{t['train_s']:.2f} s, metrics {t['metrics_s']:.2f} s; "
          f"{r['training_flops_per_member'] / 1e6:.1f} MFLOP of training per member")  # fmt: skip
    for label, row in r["methods"].items():
        print(f"  {label:<36} {row['calls']:>4} calls {row['flops_per_member'] / 1e6:>9.2f} "
              f"MFLOP/member {row['seconds']:>8.3f} s")  # fmt: skip
    device = args.device.split(":")[0]
    name = "metrics_work.json" if device == "cpu" else f"metrics_work.{device}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / name).write_text(json.dumps(r, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
