"""Analysis of a sweep: regimes, escape times, plateaus, scaling fits, figures, report.

The narrow public surface (the CLI calls these):

- :func:`analyze` (``phasesweep analyze SWEEP``): writes the ``summaries``,
  ``plateaus`` and ``scaling_fits`` tables of the sweep; returns row counts.
- :func:`plot` (``phasesweep plot SWEEP [--out DIR]``): regenerates every figure
  of the spec's ``plots:`` section (defaults from the swept axes) as PNG + SVG.
- :func:`report` (``phasesweep report SWEEP [--out DIR]``): one self-contained
  HTML page with provenance, spec, counts, figures and fitted slopes.
- :func:`draw`: one figure (a kind of :mod:`analysis.figures`) into a matplotlib
  ``Axes`` or a new figure; returns the ``Figure``.
- :func:`phase_diagram_sql`: the single SQL query behind a phase diagram.

The pure cores live in :mod:`analysis.escape`, :mod:`analysis.plateaus`,
:mod:`analysis.regimes`, :mod:`analysis.scaling`, the figure kinds in :mod:`analysis.figures`;
:mod:`analysis.calibration` has closed-form loss curves with known answers.
"""

from phasesweep.analysis.analyze import analyze
from phasesweep.analysis.phase import phase_diagram_sql
from phasesweep.analysis.plotting import draw, plot
from phasesweep.analysis.report import report

__all__ = ["analyze", "draw", "phase_diagram_sql", "plot", "report"]
