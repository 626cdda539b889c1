"""The axes of a spec's ``grid``: which config field an axis names, and its values.

An axis is a short name (:data:`~phasesweep._config.SHORT_NAMES`) or a dotted path into
the sections of :class:`~pipeline.spec.RunConfig`; its values are a list or one of the
spaced forms (:func:`axis_values`). This is part of the spec's own language, so it lives
below the spec: the spec's validators (an init file's weights for every grid seed) and
the grid (:mod:`pipeline.grid`), which expands these axes into points, both read it, and
the spec imports nothing of the grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from phasesweep.pipeline._run_config import RunConfig
from pydantic import BaseModel

from phasesweep._config import SHORT_NAMES, SpecError, did_you_mean


def axis_path(axis: str) -> str:
    """The dotted path of a grid axis (short names resolved)."""
    path = SHORT_NAMES.get(axis, axis)
    if path not in _FIELD_PATHS:
        raise SpecError(
            f"grid.{axis}",
            axis,
            "unknown axis"
            + did_you_mean(axis, [*SHORT_NAMES, *_FIELD_PATHS])
            + f": use a short name ({', '.join(SHORT_NAMES)}) or a dotted path "
            f"into {', '.join(sorted(RunConfig.model_fields))}",
        )
    return path


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of the fields below ``model``'s sections (nested sections and their
    fields included): what a grid axis may name."""
    paths = []
    for name, field in model.model_fields.items():
        if prefix:
            paths.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            paths += _field_paths(field.annotation, f"{prefix}{name}.")
    return paths


_FIELD_PATHS = _field_paths(RunConfig)

_AXIS_FORMS = (
    "expected a list of values, {logspace: [a, b, n]}, {linspace: [a, b, n]} "
    "or {range: [start, stop]}"
)


def axis_size(axis: str, spec_value: Any) -> int:
    """Number of values of one axis, from its spec alone (nothing is materialized).

    The forms are those of :func:`axis_values`; a malformed or empty axis, or a
    range with step 0, is a :class:`SpecError` naming ``grid.AXIS``.
    """
    key = f"grid.{axis}"
    if isinstance(spec_value, list):
        n = len(spec_value)
    elif isinstance(spec_value, dict) and len(spec_value) == 1:
        ((kind, args),) = spec_value.items()
        if kind in ("logspace", "linspace"):
            if not (
                isinstance(args, list)
                and len(args) == 3
                and all(isinstance(a, int | float) and not isinstance(a, bool) for a in args)
                and isinstance(args[2], int)
            ):
                raise SpecError(key, spec_value, f"{kind} takes [start, stop, count]")
            n = args[2]
        elif kind == "range":
            if not (
                isinstance(args, list)
                and 2 <= len(args) <= 3
                and all(isinstance(a, int) and not isinstance(a, bool) for a in args)
            ):
                raise SpecError(
                    key, spec_value, "range takes [start, stop] or [start, stop, step] (ints)"
                )
            start, stop, step = (*args, 1)[:3]
            if step == 0:
                raise SpecError(key, spec_value, "range step must not be 0")
            n = max(0, -((start - stop) // step))  # len(range(...)), also beyond sys.maxsize
        else:
            raise SpecError(key, spec_value, _AXIS_FORMS)
    else:
        raise SpecError(key, spec_value, _AXIS_FORMS)
    if n < 1:
        raise SpecError(key, spec_value, "empty grid axis")
    return n


def axis_values(axis: str, spec_value: Any) -> Sequence[Any]:
    """Values of one axis: a non-empty list, ``{logspace: [a, b, n]}`` (10**a .. 10**b),
    ``{linspace: [a, b, n]}`` or ``{range: [start, stop]}`` / ``[start, stop, step]``.

    A range stays a ``range`` (no list of its values is built); the spaced forms must
    stay finite (``{logspace: [0, 400, 3]}`` overflows to inf and is an error).
    """
    axis_size(axis, spec_value)  # checks the form
    if isinstance(spec_value, list):
        return list(spec_value)
    ((kind, args),) = spec_value.items()
    if kind == "range":
        return range(*args)
    fn = np.logspace if kind == "logspace" else np.linspace
    with np.errstate(over="ignore", invalid="ignore"):
        values = fn(args[0], args[1], args[2])
    if not np.isfinite(values).all():
        bad = values[~np.isfinite(values)][0]
        raise SpecError(f"grid.{axis}", spec_value, f"{kind} reaches {bad}, not a finite number")
    return values.tolist()
