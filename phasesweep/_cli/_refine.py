"""``phasesweep refine``: where a metric crosses a level along one grid axis, line by line."""

from __future__ import annotations

import argparse
import sys

from phasesweep import _api
from phasesweep._cli._args import address, bounded
from phasesweep._cli._base import EXIT_FAILED, EXIT_OK, Command, add_store, open_store
from phasesweep._format import write_table

#: the columns of the ``boundaries`` rows shown, in order
SHOWN = (
    "line",
    "boundary",
    "bracket_low",
    "bracket_high",
    "seed_spread",
    "bracketed",
    "converged",
    "n_runs",
)


class Refine(Command):
    name = "refine"
    help = (
        "find where a metric crosses a level along one axis, line by line (Optuna): new "
        "runs go to the sweep SWEEP__refine_METRIC, the estimates to the boundaries table"
    )
    examples = (
        "  phasesweep refine lazy_rich --metric kernel_distance --level 0.01 --budget 200\n"
        "  phasesweep refine quickstart --metric param_rel_change --level 0.1 --axis init_scale\n"
        "\nthe search is an Optuna journal in the store (docs/refine.md); its trials:\n"
        "  optuna trials --storage-class JournalFileBackend \\\n"
        "    --storage results/refine/sweep=lazy_rich__refine_kernel_distance/journal.log \\\n"
        "    --study-name 'kernel_distance|0.01|model.init_scale'"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "sweep", metavar="SWEEP", help="the sweep to refine (its grid is the start)"
        )
        parser.add_argument("--metric", required=True, help="a trajectories or runs column")
        parser.add_argument("--level", required=True, type=float, help="the level of the metric")
        parser.add_argument(
            "--axis", default="init_scale", help="grid axis to search (default: init_scale)"
        )
        parser.add_argument(
            "--budget",
            type=int,
            default=None,
            help="most runs the refinement trains in all (default: no limit: every line goes on "
            "until its bracket is --tol wide)",
        )
        parser.add_argument(
            "--tol",
            type=float,
            default=None,
            help="stop a line when its bracket is this wide (log10 units on a log axis; "
            "default: the grid's finest spacing / 16)",
        )
        parser.add_argument(
            "--per-line",
            type=bounded(int, 1, strict=False),
            default=1,
            help="points per line per batch (default: 1, bisection)",
        )
        add_store(parser)
        parser.add_argument(
            "--address",
            type=address,
            default=None,
            help="Ray address, as for run (default: $RAY_ADDRESS, else a private embedded "
            "local Ray)",
        )
        parser.add_argument(
            "--in-process",
            action="store_true",
            help="train batches in this process, not on Ray (default: on Ray)",
        )

    def take_action(self, args: argparse.Namespace) -> int:
        out = _api.refine(
            args.sweep,
            open_store(args.store),
            metric=args.metric,
            level=args.level,
            axis=args.axis,
            budget=args.budget,
            tol=args.tol,
            per_line=args.per_line,
            address=args.address,
            use_ray=not args.in_process,
        )
        print(
            f"sweep {out.child}: trained {out.trained} runs in {out.batches} batches, "
            f"failed {out.failed}",
            file=sys.stderr,
        )
        rows = [
            tuple(None if _isnan(v) else v for v in r)
            for r in out.boundaries[list(SHOWN)].itertuples(index=False)
        ]
        write_table(SHOWN, rows, sys.stdout)
        return EXIT_FAILED if out.failed else EXIT_OK


def _isnan(v: object) -> bool:
    return isinstance(v, float) and v != v
