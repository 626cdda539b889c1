"""``phasesweep status``: stored runs by sweep and status, and the damage they leave out."""

from __future__ import annotations

import argparse
import sys

from phasesweep import _api
from phasesweep._cli._base import EXIT_FAILED, EXIT_OK, Command, add_store, damage_line, open_store
from phasesweep._format import counted, write_table


class Status(Command):
    name = "status"
    help = "counts of stored runs by sweep and status"
    examples = "  phasesweep status\n  phasesweep status quickstart --store results"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "sweep", nargs="?", metavar="SWEEP", help="one sweep, with its grid size (default: all)"
        )
        add_store(parser)

    def take_action(self, args: argparse.Namespace) -> int:
        store = open_store(args.store, must_exist=True)
        with _api.collect_damage():  # said below, with the damage the counts do not read
            status = _api.status(args.sweep, store)
        if not status.counts:
            print("no runs stored" + (f" for sweep {args.sweep}" if args.sweep else ""))
        else:
            write_table(["sweep", "status", "runs"], status.counts, sys.stdout)
        if status.total is not None:
            print(
                f"{status.done} of {status.total} points done, "
                f"{status.total - status.done} remaining"
            )
        for sweep, n in status.unanalyzed.items():
            print(
                f"sweep {sweep}: {n} run(s) have no current summary (new, trained again or "
                f"never analyzed): `phasesweep analyze {sweep}` computes them (plot and report "
                "do it first)"
            )
        checkpointed = _api.checkpointed(args.sweep, store)
        if checkpointed:
            print(
                f"{counted(checkpointed, 'chunk')} checkpointed mid-training (an interrupted "
                "launch): running the sweep again resumes from there"
            )
        damaged = store.damaged_files(args.sweep)
        if damaged:
            print(damage_line(damaged, "the counts leave out what is in"), file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
