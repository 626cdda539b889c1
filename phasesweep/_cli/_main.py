"""The parser built from the command list, the error -> exit-code mapping, :func:`main`
and :func:`console`.

Exit codes: 0 all points done (a diverged run is done); 1 some points failed
after retries, or problems in the store (``verify``; damaged files under ``status`` or
``query``); 2 invalid spec, arguments, SQL or store, or an unknown sweep — one
line that names the key and the value, and nothing is written to the store;
3 an unexpected error (a bug or the environment: one line, ``--debug`` shows the
traceback); 130 interrupted by Ctrl-C, 143 by SIGTERM (128 + the signal: a launch
checkpoints its running chunks first, :mod:`pipeline.run._signals`).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

import phasesweep
from phasesweep import _api
from phasesweep._cli._analysis import Analyze, Plot, Report
from phasesweep._cli._base import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_UNEXPECTED,
    Command,
    SqlError,
    damage_line,
    interrupted_status,
    paragraph,
)
from phasesweep._cli._gallery import Gallery
from phasesweep._cli._maintenance import Compact, Verify
from phasesweep._cli._query import Query
from phasesweep._cli._refine import Refine
from phasesweep._cli._run import Run
from phasesweep._cli._standing import Standing
from phasesweep._cli._status import Status

#: The subcommands, in the order ``phasesweep --help`` lists them.
COMMANDS: tuple[type[Command], ...] = (
    Run,
    Status,
    Query,
    Analyze,
    Plot,
    Report,
    Gallery,
    Refine,
    Verify,
    Compact,
    Standing,
)


class _Parser(argparse.ArgumentParser):
    #: The subcommands' parsers by name (of the top parser only).
    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> None:
        """One line (no usage block), exit 2: argparse's own message names the argument."""
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201
        """argparse's, but arguments left over are refused by the subcommand's parser, whose
        error points to its own help (``phasesweep status --help``), not the top one's."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            where = self.commands.get(getattr(parsed, "command", None) or "", self)
            where.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    """The ``phasesweep`` parser: its own options, then one subparser per command of
    :data:`COMMANDS`, whose help ends with the command's examples."""
    parser = _Parser(
        prog="phasesweep",
        description="Phase diagrams of neural-network training dynamics: run grids of tiny "
        "trainings on Ray, query the Parquet store with SQL, draw figures and reports.",
        epilog="examples:\n"
        "  phasesweep run sweeps/quickstart.yaml --dry-run\n"
        '  phasesweep query "SELECT status, count(*) FROM runs GROUP BY ALL"\n'
        "  phasesweep SUBCOMMAND --help\n\n"
        "exit codes: 0 done; 1 some points failed after retries, or problems in the store "
        "(verify; damaged files under status or query); 2 invalid spec, "
        "arguments, SQL or store; 3 unexpected error; 130 interrupted (Ctrl-C); 143 stopped "
        "by SIGTERM",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"phasesweep {phasesweep.__version__}"
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the Python traceback of an error"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = {}
    for command in COMMANDS:
        p = parser.commands[command.name] = sub.add_parser(
            command.name,
            help=command.help,
            description=command.help[0].upper() + command.help[1:] + ".",
            epilog="examples:\n" + command.examples,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command().add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module docstring)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help/--version (0) or a usage error (2), printed
        return int(e.code or 0)
    (command,) = [c for c in COMMANDS if c.name == args.command]
    try:
        with _api.collect_damage() as skipped:
            code = command().take_action(args)
        if skipped:
            print(damage_line(skipped.values(), "skipped"), file=sys.stderr)
        return code
    except BrokenPipeError:  # e.g. `phasesweep query ... | head`
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt as e:
        _traceback(args)
        print("phasesweep: interrupted", file=sys.stderr)
        return interrupted_status(e)
    except Exception as e:
        _traceback(args)
        if isinstance(e, (*_api.input_errors(), SqlError)):
            print(f"phasesweep: {e}", file=sys.stderr)
            return EXIT_INVALID
        if isinstance(e, _api.failures()):
            print(f"phasesweep: {e}", file=sys.stderr)
            return EXIT_FAILED
        print(
            f"phasesweep: unexpected error: {type(e).__name__}: {paragraph(e)}"
            + ("" if args.debug else " (rerun with --debug for the traceback)"),
            file=sys.stderr,
        )
        return EXIT_UNEXPECTED


def console() -> None:
    """The ``phasesweep`` command: :func:`main`, then Ray left at once if the command
    used it (:func:`phasesweep._api.disconnect_ray`), rather than in Ray's exit hook,
    which costs each launch half a second more."""
    code = main()
    if "ray" in sys.modules:  # only commands that launched imported it
        _api.disconnect_ray()
    sys.exit(code)


def _traceback(args: argparse.Namespace) -> None:
    if args.debug:
        traceback.print_exc()
