"""``phasesweep verify`` and ``compact``: the store's health and its file count."""

from __future__ import annotations

import argparse

from phasesweep import _api
from phasesweep._cli._base import EXIT_FAILED, EXIT_OK, Command, add_store, open_store


def _add_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", nargs="?", metavar="SWEEP", help="one sweep (default: all)")
    add_store(parser)


class Verify(Command):
    name = "verify"
    help = (
        "check that every file is readable, manifest and files agree, no run is stored twice "
        "and every completed run has its trajectories and layers (exit 1 with a list of "
        "problems); --repair fixes what it can (exit 0 when nothing is left to repair)"
    )
    examples = (
        "  phasesweep verify\n"
        "  phasesweep verify lazy_rich --store s3://bucket/results --repair\n"
        "  phasesweep verify --repair && phasesweep run sweeps/quickstart.yaml"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_sweep(parser)
        parser.add_argument(
            "--repair",
            action="store_true",
            help="quarantine unreadable files, drop orphans and leftover temp files, "
            "rewrite missing or wrong manifest entries, and take runs whose rows are lost out "
            "of their commit (quarantined as it was), so a relaunch trains them again",
        )

    def take_action(self, args: argparse.Namespace) -> int:
        store = open_store(args.store, must_exist=True)
        report = _api.verify(args.sweep, store, repair=args.repair)
        for line in report.problems:
            print(f"problem: {line}")
        for line in report.actions:
            print(f"repaired: {line}")
        for line in report.left or ():
            print(f"not repaired: {line}")
        if report.ok:
            print(f"ok: {store.uri}" + (f" sweep {args.sweep}" if args.sweep else ""))
        return EXIT_OK if report.ok else EXIT_FAILED


class Compact(Command):
    name = "compact"
    help = "merge a sweep's chunk files into few large ones (queries answer the same)"
    examples = "  phasesweep compact lazy_rich --store ./results"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_sweep(parser)

    def take_action(self, args: argparse.Namespace) -> int:
        report = _api.compact(args.sweep, open_store(args.store, must_exist=True))
        for line in report.actions:
            print(line)
        if not report.actions:
            print("nothing to compact")
        return EXIT_OK
