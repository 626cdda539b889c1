"""``phasesweep analyze``, ``plot`` and ``report``: a sweep's derived tables, figures and
HTML report."""

from __future__ import annotations

import argparse
from pathlib import Path

from phasesweep import _api
from phasesweep._cli._base import EXIT_OK, Command, add_store, open_store


def _add_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", metavar="SWEEP", help="the sweep's name (see `phasesweep status`)")
    add_store(parser)


def _add_out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output directory (default: STORE/figures/SWEEP)",
    )


class Analyze(Command):
    name = "analyze"
    help = "write summaries, plateaus and scaling fits of a sweep"
    examples = "  phasesweep analyze quickstart\n  phasesweep analyze quickstart --store results"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_sweep(parser)

    def take_action(self, args: argparse.Namespace) -> int:
        counts = _api.analyze(args.sweep, open_store(args.store, must_exist=True))
        print(", ".join(f"{k}: {v} rows" for k, v in counts.items()))
        return EXIT_OK


class Plot(Command):
    name = "plot"
    help = "regenerate a sweep's figures (PNG and SVG)"
    examples = (
        "  phasesweep plot quickstart\n  phasesweep plot quickstart --store results --out figures"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_sweep(parser)
        _add_out(parser)

    def take_action(self, args: argparse.Namespace) -> int:
        for path in _api.plot(args.sweep, open_store(args.store, must_exist=True), args.out):
            print(path)
        return EXIT_OK


class Report(Command):
    name = "report"
    help = "write a sweep's self-contained HTML report"
    examples = (
        "  phasesweep report quickstart\n"
        "  phasesweep report quickstart --store results --out report"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        _add_sweep(parser)
        _add_out(parser)

    def take_action(self, args: argparse.Namespace) -> int:
        print(_api.report(args.sweep, open_store(args.store, must_exist=True), args.out))
        return EXIT_OK
