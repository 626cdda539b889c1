"""``phasesweep standing``: show or stop this user's standing local Ray."""

from __future__ import annotations

import argparse

from phasesweep import _api
from phasesweep._cli._base import EXIT_OK, Command


class Standing(Command):
    name = "standing"
    help = (
        "show or stop this user's standing local Ray, the one 'run --address standing' "
        "starts on demand and reuses (it also stops itself after idling)"
    )
    examples = (
        "  phasesweep run sweeps/quickstart.yaml --address standing   # starts it\n"
        "  phasesweep standing status\n  phasesweep standing stop"
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "action",
            choices=["status", "stop"],
            help="status: its address, if one runs; stop: end it and every process it started",
        )

    def take_action(self, args: argparse.Namespace) -> int:
        if args.action == "stop":
            print("stopped" if _api.stop_standing() else "no standing Ray is running")
            return EXIT_OK
        found = _api.standing_address()
        print(f"running at {found}" if found else "no standing Ray is running")
        return EXIT_OK
