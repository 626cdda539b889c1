"""The ``phasesweep`` command line: a thin layer over the Python API (:mod:`phasesweep`).

Each subcommand is a :class:`~phasesweep._cli._base.Command` in a module of its own (or
of its small group): its arguments beside its action, and the action one call of
:mod:`phasesweep._api`. :mod:`phasesweep._cli._main` builds the parser from the command
list and maps errors to exit codes. ``python -m phasesweep._cli`` runs the command.
"""

from __future__ import annotations

from phasesweep._cli._main import build_parser, console, main

__all__ = ["build_parser", "console", "main"]
