"""What every command shares: the exit codes, the :class:`Command` shape, the ``--store``
argument and the one-line messages about damaged store files."""

from __future__ import annotations

import argparse
import signal
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from phasesweep._cli._args import store_uri

if TYPE_CHECKING:
    from phasesweep._api import Damage, Store

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_UNEXPECTED = 0, 1, 2, 3


def interrupted_status(interrupt: KeyboardInterrupt) -> int:
    """The exit status of a command that ``interrupt`` ended: 128 + the number of the
    signal behind it, as a shell reports a process the signal killed: 130 for Ctrl-C
    (Python's own ``KeyboardInterrupt`` too), 143 for SIGTERM (the API's ``Interrupted``
    carries its ``signum``, ``pipeline.run._signals``)."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


class Command:
    """One subcommand, as optuna's commands: its name, help and examples (the parser is
    built from them, see :func:`phasesweep._cli._main.build_parser`), its arguments
    (:meth:`add_arguments`) and its action (:meth:`take_action`: one call of
    :mod:`phasesweep._api`, then what it prints), side by side."""

    #: the subcommand, as typed
    name: ClassVar[str]
    #: one line, lower case, no final period: the list of subcommands shows it, and the
    #: subcommand's own help as a sentence
    help: ClassVar[str]
    #: shell lines (each indented two spaces), shown as written under "examples:"
    examples: ClassVar[str]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the subcommand's arguments to its ``parser``."""

    def take_action(self, args: argparse.Namespace) -> int:
        """Do the command for the parsed ``args``; the exit code."""
        raise NotImplementedError


class SqlError(Exception):
    """An SQL statement DuckDB rejected (parser, binder, catalog, conversion, …)."""


def add_store(parser: argparse.ArgumentParser) -> None:
    """The ``--store`` option every command that reads or writes the store takes."""
    parser.add_argument(
        "--store",
        type=store_uri,
        default=None,
        metavar="URI",
        help="store URI: a path, file://… or s3://bucket/prefix "
        "(default: $PHASESWEEP_STORE, else ./results)",
    )


def open_store(uri: str | None, must_exist: bool = False) -> Store:
    """The store at ``uri`` (``must_exist``: already there); else an argument error (exit 2)."""
    from phasesweep._api import StoreError
    from phasesweep._api import open_store as open_checked
    from phasesweep._config import SpecError

    try:
        return open_checked(uri, must_exist=must_exist)
    except StoreError as e:
        raise SpecError("--store", e.uri, e.reason, what="argument") from None


def damage_line(damage: Iterable[Damage], what: str, more: str = "") -> str:
    """One line for damaged store files: ``what`` they cost, which (the first three) and
    the fix."""
    files = sorted(damage, key=lambda d: d.path)
    named = "; ".join(f"{d.path} ({d.reason})" for d in files[:3])
    if len(files) > 3:
        named += f"; and {len(files) - 3} more"
    s = "" if len(files) == 1 else "s"
    return (
        f"phasesweep: {what} {len(files)} damaged store file{s}: {named}; "
        f"`phasesweep verify --repair` fixes the store{more}"
    )


def paragraph(error: BaseException) -> str:
    """The first paragraph of an error message on one line (DuckDB's name the problem,
    then "Did you mean …?", then a blank line and the SQL with a caret)."""
    text = str(error).strip().split("\n\n")[0]
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
