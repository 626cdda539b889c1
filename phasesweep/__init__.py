"""phasesweep: phase diagrams of neural-network training dynamics from huge grids of tiny
vectorized trainings, run on Ray, stored as Parquet and queried with DuckDB.

The layout's folders are installed under this one name: :mod:`phasesweep.pipeline`
(spec, grid, models, trainer, Ray driver, CLI), :mod:`phasesweep.storage` (Parquet store,
DuckDB catalog) and :mod:`phasesweep.analysis` (regimes, escape times, figures, report).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("phasesweep")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
