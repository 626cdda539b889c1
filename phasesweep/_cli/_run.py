"""``phasesweep run``: plan a sweep, then train what the store lacks (``--dry-run``: the
plan only)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from phasesweep import _api
from phasesweep._cli._args import address, bounded
from phasesweep._cli._base import (
    EXIT_FAILED,
    EXIT_OK,
    Command,
    add_store,
    interrupted_status,
    open_store,
)
from phasesweep._format import counted

if TYPE_CHECKING:
    from phasesweep._api import Plan


class Run(Command):
    name = "run"
    help = "launch a sweep (skips the points the store already holds)"
    examples = (
        "  phasesweep run sweeps/quickstart.yaml --dry-run\n"
        "  phasesweep run sweeps/quickstart.yaml --set 'grid.width=[64,256]'    # a part of its grid\n"
        "  phasesweep run sweeps/quickstart.yaml --set 'grid.seed=[5,6]' --extend  # more seeds\n"
        "  phasesweep run sweeps/quickstart.yaml --set name=quickstart_short --set train.steps=300 "
        "--set analysis.at_time=150  # another config: a sweep of its own\n"
        "  phasesweep run sweeps/saddle_escape.yaml --address auto --store s3://bucket/ps"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("spec", type=Path, metavar="SPEC.yaml", help="the sweep spec (YAML)")
        add_store(parser)
        parser.add_argument(
            "--address",
            type=address,
            default=None,
            help="Ray cluster to join: auto, host:port or ray://host:port; local forces the "
            "embedded one; standing joins this user's standing local Ray, starting it if none "
            "runs (see 'phasesweep standing') (default: $RAY_ADDRESS, else a private embedded "
            "local Ray)",
        )
        parser.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a dotted key of the spec; VALUE is YAML (repeatable)",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="print points, chunks and estimates; write nothing",
        )
        parser.add_argument(
            "--cpus-per-trial",
            type=bounded(float, 0, strict=True),
            default=1.0,
            metavar="N",
            help="CPUs (and torch threads) per Ray trial, > 0 (default: 1)",
        )
        parser.add_argument(
            "--gpus-per-trial",
            type=bounded(float, 0, strict=False),
            default=0.0,
            metavar="F",
            help="GPUs per Ray trial, >= 0; fractions share a GPU (default: 0)",
        )
        parser.add_argument(
            "--device-memory",
            type=bounded(float, 0, strict=True),
            default=None,
            metavar="GIB",
            help="memory of one GPU in GiB, to plan GPU trials (--gpus-per-trial) where no GPU "
            "can be seen, e.g. a --dry-run on a laptop (default: $PHASESWEEP_DEVICE_MEMORY, "
            "else measured on the GPU)",
        )
        parser.add_argument(
            "--max-retries",
            type=bounded(int, 0, strict=False),
            default=2,
            metavar="N",
            help="retries of a failed trial before its points are stored as failed (default: 2)",
        )
        parser.add_argument(
            "--no-progress",
            action="store_true",
            help="no progress display (by default a bar on a terminal, a widget in a notebook, "
            "else a line every $PHASESWEEP_PROGRESS_EVERY seconds, 30 if unset)",
        )
        parser.add_argument(
            "--extend",
            action="store_true",
            help="train grid values that a stored sweep lacks as part of it (its base config "
            "stays the same; the stored grid takes the values of both)",
        )

    def take_action(self, args: argparse.Namespace) -> int:
        try:
            return _launch(args)
        except KeyboardInterrupt as e:  # a second stop signal, or one before training
            print("phasesweep: interrupted", file=sys.stderr)
            return interrupted_status(e)


def _launch(args: argparse.Namespace) -> int:
    """:func:`phasesweep.plan`, its counts, then :func:`phasesweep.execute` (together
    :func:`phasesweep.run`) and its outcome."""
    plan = _api.plan(
        args.spec,
        open_store(args.store),
        overrides=args.overrides,
        address=None if args.dry_run else args.address,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        device_memory=args.device_memory,
        extend=args.extend,
    )
    name = plan.spec.name
    if args.dry_run:
        _print_plan(plan)
        return EXIT_OK
    print(
        f"sweep {name}: {plan.total} points; skipping {plan.skipped} already "
        f"stored; training {plan.to_train} in {counted(len(plan.tasks), 'chunk')}",
        file=sys.stderr,
    )
    outcome = _api.execute(
        plan,
        address=args.address,
        cpus_per_trial=args.cpus_per_trial,
        gpus_per_trial=args.gpus_per_trial,
        max_retries=args.max_retries,
        progress=not args.no_progress,
    )
    print(
        f"sweep {name}: trained {outcome.trained} ({outcome.diverged} diverged, "
        f"{outcome.resumed} resumed from checkpoints), "
        f"skipped {outcome.skipped}, failed {len(outcome.failed)}",
        file=sys.stderr,
    )
    for err in dict.fromkeys(outcome.errors):
        print(f"  failure: {err}", file=sys.stderr)
    if outcome.interrupted:
        by = outcome.interrupted_by or signal.SIGINT
        print(
            f"sweep {name}: interrupted ({by.name}); finished work is stored, running "
            "chunks are checkpointed: run the same command again to go on",
            file=sys.stderr,
        )
        return 128 + by
    return EXIT_FAILED if outcome.failed else EXIT_OK


def _print_plan(plan: Plan) -> None:
    """``run --dry-run``: points, chunks (the first few, and every size used), device,
    memory and work."""
    tasks = plan.tasks
    print(
        f"sweep {plan.spec.name}: {plan.total} points, {plan.skipped} already stored, "
        f"{plan.to_train} to train in {counted(len(tasks), 'chunk')}"
    )
    for t in tasks[:20]:
        cfg = plan.group_config(t)
        print(
            f"  chunk {t.chunk_id}: {counted(t.size - t.stored_count, 'member')}, depth {cfg.model.depth}, "
            f"width {cfg.model.width}, n_train {cfg.data.n_train}, steps {t.steps}"
        )
    if len(tasks) > 20:
        print(f"  … {counted(len(tasks) - 20, 'more chunk')}")
    sizes = sorted({t.size for t in tasks})
    if sizes:
        shown = ", ".join(map(str, sizes[:8])) + (" …" if len(sizes) > 8 else "")
        print(f"chunk sizes (members): {shown}")
    if plan.device_memory is not None:
        print(f"device: GPU trials of {plan.device_memory / 2**30:.1f} GiB each")
    print(f"memory: about {plan.peak_bytes / 2**20:.1f} MiB for the largest chunk")
    print(
        f"work: {plan.flops / 1e12:.3g} TFLOP of training "
        f"(about {plan.flops / 5e9 / 60:.1f} core-minutes at 5 GFLOP/s per core)"
    )
