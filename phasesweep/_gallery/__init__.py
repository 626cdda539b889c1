"""The seeds' gallery: every headline result of the five seed texts reproduced from the
store, with the paper's prediction on the same axes and the agreement measured.

One module per result in ``results/`` (``lazy_training``, …), each a declarative
:class:`~phasesweep._gallery._result.Result`: the paper and equation, the sweep of
``sweeps/`` it needs at its default and ``--full`` size, the SQL that reads its numbers,
the fit with its 95 % interval and the pass criterion, the figure. The use case
(:mod:`phasesweep._gallery._gallery`) runs, checks and draws them; ``phasesweep gallery``
and :func:`phasesweep._gallery` call it.
"""

from __future__ import annotations

from phasesweep._gallery._fit import Check, Fit
from phasesweep._gallery._gallery import (
    RESULTS,
    Evaluation,
    evaluate,
    listing,
    record,
    reproduce,
    reproduce_all,
    select,
)
from phasesweep._gallery._result import Result, Size

__all__ = [
    "RESULTS",
    "Check",
    "Evaluation",
    "Fit",
    "Result",
    "Size",
    "evaluate",
    "listing",
    "record",
    "reproduce",
    "reproduce_all",
    "select",
]
