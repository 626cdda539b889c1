"""How far in gradient-flow time a run gets, from its config alone, and the launch check
that ``analysis.at_time`` lies within the grid's reach.

A run's clock is ``t = Σ_{k<steps} η_k`` (:mod:`pipeline.train._trainer`). With the scaled
learning rate η = :func:`~pipeline.grid._lr.member_lr` the final time is

- ``constant``: ``steps · η``;
- ``cosine`` (η_k = η (m + (1 − m) (1 + cos(πk/steps)) / 2), m = ``lr_min_frac``):
  ``η (steps · m + (1 − m) (steps + 1) / 2)``, since Σ_{k<N} cos(πk/N) = 1;
- ``norm_adaptive`` (η_k = min(η, c ‖θ‖^(2−L)) ≤ η): at most ``steps · η``.

A run that diverges stops earlier, so these are upper bounds for it. The largest final
time over a grid is found without expanding it: it is monotone in each axis that sets it
(steps, lr, init scale, width, depth, the lr-scaling rule, the cosine floor), so it is
largest at a corner of the grid, one extreme value per numeric axis (every value of a
categorical one, the schedule), a few hundred configs at most for a grid of any size.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from phasesweep.analysis.config import REACH_RTOL, reached_time
from phasesweep.pipeline._axes import axis_path, axis_size
from phasesweep.pipeline.grid._lr import member_lr
from phasesweep.pipeline.spec import RunConfig, SpecError, SweepSpec
from pydantic import BaseModel, ValidationError

#: Config fields a run's final gradient-flow time depends on (``train.lr_scaling`` and
#: every field below it count too).
TIME_FIELDS = (
    "train.steps",
    "train.lr",
    "train.lr_schedule",
    "train.lr_min_frac",
    "train.lr_scaling",
    "model.init_scale",
    "model.width",
    "model.depth",
)


def final_time(config: RunConfig) -> float:
    """The gradient-flow time a run of ``config`` reaches at its last step (exact for the
    constant and cosine schedules, an upper bound for ``norm_adaptive``); ``inf`` where
    the scaled learning rate overflows."""
    t = config.train
    try:
        lr = member_lr(config)
    except (OverflowError, ZeroDivisionError):
        return math.inf
    if t.lr_schedule == "cosine":
        m = t.lr_min_frac
        return lr * (t.steps * m + (1 - m) * (t.steps + 1) / 2)
    return lr * t.steps


def _corner_values(axis: str, spec_value: Any) -> list[Any]:
    """The values of one axis a corner of the grid may take: the smallest and the largest
    number (every value that is not a number, e.g. a schedule's name)."""
    n = axis_size(axis, spec_value)  # checks the form (SpecError naming grid.AXIS)
    if isinstance(spec_value, dict):
        ((kind, args),) = spec_value.items()
        if kind == "range":
            values = range(*args)
            return [values[0], values[-1]]
        fn = np.logspace if kind == "logspace" else np.linspace
        with np.errstate(over="ignore"):
            return fn(args[0], args[1], min(n, 2)).tolist()  # the same end points as n
    numbers = [v for v in spec_value if isinstance(v, int | float) and not isinstance(v, bool)]
    others = []
    for v in spec_value:
        if v not in numbers and v not in others:
            others.append(v)
    return ([min(numbers), max(numbers)] if numbers else []) + others


def _replaced(model: BaseModel, path: list[str], value: Any) -> BaseModel:
    """``model`` with the field at ``path`` set to ``value`` (a section given as a dict is
    validated); nothing else is validated."""
    name, rest = path[0], path[1:]
    if rest:
        return model.model_copy(update={name: _replaced(getattr(model, name), rest, value)})
    current = getattr(model, name)
    if isinstance(current, BaseModel) and isinstance(value, dict):
        value = type(current).model_validate(value)
    return model.model_copy(update={name: value})


def grid_final_time(spec: SweepSpec) -> float:
    """The largest final gradient-flow time any point of ``spec``'s grid can reach
    (:func:`final_time` at every corner of the axes that set it). ``inf`` where some
    corner's time cannot be computed: a value the grid's own validation refuses."""
    axes = []
    for axis, spec_value in spec.grid.items():
        path = axis_path(axis)
        if any(path == f or path.startswith(f + ".") for f in TIME_FIELDS):
            axes.append((path.split("."), _corner_values(axis, spec_value)))
    base = spec.base()
    best = -math.inf
    for corner in itertools.product(*(values for _, values in axes)):
        config = base
        try:
            for (path, _), value in zip(axes, corner):
                config = _replaced(config, path, value)
            t = final_time(config)
        except (TypeError, ValueError, ValidationError):
            return math.inf
        best = max(best, t if t == t else math.inf)
    return best


def check_at_time(spec: SweepSpec) -> None:
    """Refuse (:class:`SpecError` on ``analysis.at_time``) an ``at_time`` beyond the final
    gradient-flow time of every point of the grid: no run would reach it, and every
    regime would be NULL."""
    at = spec.analysis.at_time
    if at is None:
        return
    reach = grid_final_time(spec)
    if at <= reach * (1 + REACH_RTOL):
        return
    factor = at / reach
    steps = (
        f"raise train.steps at least {factor:.3g}-fold"
        if any(axis_path(a) == "train.steps" for a in spec.grid)
        else f"raise train.steps to at least {math.ceil(spec.train.steps * factor)}"
    )
    raise SpecError(
        "analysis.at_time",
        at,
        f"no run reaches it: the grid's runs end by gradient-flow time t = {reach:.6g} "
        f"(train.steps × the scaled lr); set analysis.at_time to at most {reached_time(reach)}, "
        f"{steps}, or leave analysis.at_time out (each run is read at its last point)",
    )
