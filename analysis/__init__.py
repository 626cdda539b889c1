"""Analysis of a sweep: regimes, escape times, plateaus, scaling fits, figures, report.

The narrow public surface (the CLI calls these):

- :func:`analyze` (``phasesweep analyze SWEEP``): writes the ``summaries``,
  ``plateaus`` and ``scaling_fits`` tables of the sweep; returns row counts.
- :func:`plot` (``phasesweep plot SWEEP [--out DIR]``): regenerates every figure
  of the spec's ``plots:`` section (defaults from the swept axes) as PNG + SVG.
- :func:`report` (``phasesweep report SWEEP [--out DIR]``): one self-contained
  HTML page with provenance, spec, counts, figures and fitted slopes.
- :func:`draw`: one figure (a kind of :mod:`analysis.figures`) in the place of a matplotlib
  ``Axes`` or a new figure; returns the ``Figure``.
- :func:`phase_diagram_sql`: the single SQL query behind a phase diagram.

Public modules: :mod:`analysis.config` (the spec's ``analysis`` and ``plots`` sections)
and :mod:`analysis.figures` (the figure registry). The ``_`` modules are private details.
The pure cores live in :mod:`analysis._escape`, :mod:`analysis._plateaus`,
:mod:`analysis._regimes`, :mod:`analysis._scaling`, the figure kinds in :mod:`analysis.figures`.
Loss curves with known answers, which calibrate them, live with the tests
(``tests/calibration.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

#: Imported on first access (:mod:`phasesweep._lazy`): the sweep spec composes
#: :mod:`analysis.config`, and importing it must not load pandas or matplotlib.
if TYPE_CHECKING:
    from phasesweep.analysis._analyze import analyze
    from phasesweep.analysis._phase import phase_diagram_sql
    from phasesweep.analysis._plotting import draw, plot
    from phasesweep.analysis._report import report
else:
    from phasesweep._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(globals())

__all__ = ["analyze", "draw", "phase_diagram_sql", "plot", "report"]
