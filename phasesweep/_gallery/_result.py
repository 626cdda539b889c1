"""A gallery result, declared: which paper and equation it reproduces, the sweep it needs
at its default and ``--full`` size, the SQL that reads its numbers from the store, the fit
and pass criterion (:class:`~phasesweep._gallery._fit.Check`) and its figure.

A result module (``phasesweep/_gallery/results/<name>.py``) defines one :class:`Result` named
``RESULT``; :data:`phasesweep._gallery._gallery.RESULTS` lists them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

    from phasesweep._gallery._fit import Check

#: The ready sweeps a result starts from: ``sweeps/`` of the source tree, through the link
#: ``phasesweep/_gallery/sweeps``, which a wheel packages as a copy.
SWEEPS = Path(__file__).resolve().parent / "sweeps"


@dataclass(frozen=True)
class Size:
    """A size of a result's sweep: the ``--set`` overrides applied to its ``sweeps/`` file,
    and the time it took on 2 CPU cores (minutes, measured with ``phasesweep gallery``,
    Ray's start included)."""

    overrides: tuple[str, ...]
    minutes: float


@dataclass(frozen=True)
class Result:
    """One headline result of a seed text, reproduced from the store.

    ``sql`` reads the numbers (one row per run, its grid coordinates and the measured
    quantities) with ``{sweep}`` standing for the sweep's name as an SQL string;
    ``measure`` turns that frame into the checks; ``draw`` makes the figure (measured
    points with their spread over seeds, the paper's prediction on the same axes, the
    fits in the legend). ``caveat`` says where the measurement departs from the paper
    and why (shown in the caption).
    """

    name: str
    seed: str
    paper: str
    reproduces: str
    sweep: str
    conditions: str
    sql: str
    default: Size
    full: Size
    measure: Callable[[pd.DataFrame], list[Check]]
    draw: Callable[[pd.DataFrame, list[Check]], Figure]
    caveat: str = ""

    @property
    def spec_path(self) -> Path:
        return SWEEPS / f"{self.sweep}.yaml"

    def sweep_name(self, full: bool = False) -> str:
        """The store's name for this result's sweep (its own: a user's sweep of the same
        file keeps its name)."""
        return f"gallery_{self.name}{'_full' if full else ''}"

    def size(self, full: bool = False) -> Size:
        return self.full if full else self.default

    def overrides(self, full: bool = False) -> list[str]:
        """The ``--set`` overrides of the size, its sweep name included."""
        return [*self.size(full).overrides, f"name={self.sweep_name(full)}"]

    def query(self, sweep: str) -> str:
        """The SQL that reads this result's numbers from ``sweep``."""
        return self.sql.format(sweep="'" + sweep.replace("'", "''") + "'")

    def caption(self, checks: list[Check], incomplete: str = "") -> str:
        """The figure's caption: the paper, the claim, the conditions, each check and the
        verdict, and the caveat. ``incomplete``: why the checks read only part of the grid
        (the verdict is then INCOMPLETE, and the reason follows the conditions)."""
        verdict = "PASS" if checks and all(c.passed for c in checks) else "FAIL"
        lines = [
            f"{'INCOMPLETE' if incomplete else verdict} — seed {self.seed}: {self.paper}, "
            f"{self.reproduces}.",
            f"Conditions: {self.conditions}.",
            *([incomplete] if incomplete else []),
            *(c.line() for c in checks),
        ]
        if self.caveat:
            lines.append(self.caveat)
        return "\n".join(lines)
