"""phasesweep: phase diagrams of neural-network training dynamics from huge grids of tiny
vectorized trainings, run on Ray, stored as Parquet and queried with DuckDB.

The Python API mirrors the command line (each ``phasesweep`` subcommand is a thin
layer over one of these functions)::

    import phasesweep

    # a shorter quickstart, as a sweep of its own (a stored sweep keeps its config)
    short = ["name=quickstart_short", "train.steps=300", "analysis.at_time=150"]  # t = 300 x 0.5
    spec = phasesweep.load_spec("sweeps/quickstart.yaml", short)
    phasesweep.run(spec, "results")                         # phasesweep run
    phasesweep.status("quickstart_short", "results")        # phasesweep status
    phasesweep.table("SELECT * FROM runs", "results")       # phasesweep query -> DataFrame
    phasesweep.analyze("quickstart_short", "results")       # phasesweep analyze
    cells = phasesweep.phase_diagram("quickstart_short", "results")
    fig = phasesweep.draw("loss_curves", "results", "quickstart_short")  # or ax=an Axes
    phasesweep.verify("quickstart_short", "results")        # phasesweep verify

Importing :mod:`phasesweep` is cheap: torch, Ray, DuckDB and matplotlib load on first
use of a function that needs them. The layout's folders are installed under this one
name: :mod:`phasesweep.pipeline` (spec, grid, models, trainer, Ray driver),
:mod:`phasesweep.storage` (Parquet store, DuckDB catalog) and
:mod:`phasesweep.analysis` (regimes, escape times, figures, report). The reference
(spec keys, store columns, SQL cookbook, cluster use) is in ``docs/``.

Public and private: a module or name that starts with ``_`` is private (it may change
without notice); each package re-exports its public names in ``__all__``. The public
modules are the declarative ones a user reads or extends: :mod:`phasesweep.pipeline.spec`
(the sweep spec), :mod:`phasesweep.pipeline.activations` (the activation registry),
:mod:`phasesweep.storage.schema` (the store tables), :mod:`phasesweep.analysis.config`
(analysis thresholds and plots) and :mod:`phasesweep.analysis.figures` (the figure
registry). Testing hooks: the project's tests and benchmarks import the un-underscored
names of private modules (white-box checks of the engine); nothing reaches into a ``_``
name of another module (``tests/test_surface.py`` checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phasesweep._version import __version__

#: Imported on first access (:mod:`phasesweep._lazy`).
if TYPE_CHECKING:
    from phasesweep.analysis import draw
    from phasesweep.pipeline.run._driver import SweepOutcome
    from phasesweep.pipeline.run._launch import Plan, Status
    from phasesweep.pipeline.spec import SpecError, SweepSpec

    from phasesweep._api import (
        StoreError,
        UnknownSweepError,
        analyze,
        compact,
        connect,
        execute,
        expand,
        gallery,
        load_spec,
        phase_diagram,
        plan,
        plot,
        refine,
        report,
        run,
        standing_address,
        status,
        stop_standing,
        table,
        verify,
    )
else:
    from phasesweep._lazy import lazy_exports

    __getattr__, __dir__ = lazy_exports(globals())

__all__ = [
    "__version__",
    "load_spec",
    "expand",
    "plan",
    "run",
    "execute",
    "status",
    "connect",
    "table",
    "phase_diagram",
    "analyze",
    "plot",
    "report",
    "gallery",
    "draw",
    "refine",
    "verify",
    "compact",
    "standing_address",
    "stop_standing",
    "StoreError",
    "UnknownSweepError",
    "Plan",
    "Status",
    "SweepOutcome",
    "SpecError",
    "SweepSpec",
]
