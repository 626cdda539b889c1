"""``phasesweep gallery``: the seeds' headline results, reproduced, checked and drawn."""

from __future__ import annotations

import argparse
from pathlib import Path

from phasesweep import _api
from phasesweep._cli._base import EXIT_FAILED, EXIT_OK, Command, add_store, open_store


class Gallery(Command):
    name = "gallery"
    help = "reproduce the seed papers' results: run, check against the theory, draw"
    examples = (
        "  phasesweep gallery --list\n"
        "  phasesweep gallery lazy_training --show-sql\n"
        "  phasesweep gallery lazy_training --store results --out gallery\n"
        "  phasesweep gallery --full          # every result at the papers' range"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "names",
            nargs="*",
            metavar="NAME",
            help="the results to reproduce (default: all; see --list)",
        )
        parser.add_argument(
            "--list",
            action="store_true",
            help="list the results (name, paper, equation, size, time on 2 CPU cores) and exit",
        )
        parser.add_argument(
            "--full",
            action="store_true",
            help="the size that matches the paper's range (default: a small one, ≤ 5 minutes)",
        )
        parser.add_argument(
            "--show-sql",
            action="store_true",
            help="print the SQL that reads each result's numbers from the store and exit",
        )
        add_store(parser)
        parser.add_argument(
            "--out",
            type=Path,
            default=None,
            metavar="DIR",
            help="output directory (default: STORE/figures/gallery)",
        )

    def take_action(self, args: argparse.Namespace) -> int:
        """Exit 0 when every check of every result passes, 1 when one fails or a result's
        sweep has grid points not done (failed after retries: its checks read part of it)."""
        if args.list or args.show_sql:
            for name, (line, sql) in _api.gallery_entries(args.names, full=args.full).items():
                print(line if args.list else f"-- {name}\n{sql};\n")
            return EXIT_OK
        outcomes = _api.gallery(args.names, open_store(args.store), args.out, full=args.full)
        for evaluation, paths in outcomes:
            print(evaluation.caption)
            for path in paths:
                print(path)
        return EXIT_OK if all(e.passed for e, _ in outcomes) else EXIT_FAILED
