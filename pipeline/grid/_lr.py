"""The learning rate of a grid point after the spec's scaling rule (``train.lr_scaling``),
and the refusal of a point where it is not a finite number > 0."""

from __future__ import annotations

import math
from typing import Any

from phasesweep.pipeline.spec import ModelConfig, RunConfig, SpecError, TrainConfig

#: The fields :func:`member_lr` reads besides ``train.lr_scaling.*``.
LR_PATHS = {"train.lr", "model.init_scale", "model.width", "model.depth"}


def member_lr(config: RunConfig) -> float:
    """Base learning rate after the spec's scaling rule (``train.lr_scaling``):
    ``lr · scale · width`` of :func:`lr_factors`, multiplied in that order.

    Raises ``OverflowError`` where the power overflows a float (see :func:`iter_points`,
    which refuses such points before they are trained).
    """
    scale, width = lr_factors(config.model, config.train)
    return config.train.lr * scale * width


def lr_factors(model: ModelConfig, train: TrainConfig) -> tuple[float, float]:
    """The two factors of the scaling rule: (max(g, floor)^(p + p_depth·(depth − 1)),
    width^p_width). ``OverflowError`` where a power overflows."""
    s = train.lr_scaling
    scale = max(model.init_scale, s.init_scale_floor) ** (
        s.init_scale_power + s.init_scale_depth_power * (model.depth - 1)
    )
    return scale, model.width**s.width_power


def check_lr(config: RunConfig, coords: dict[str, Any]) -> None:
    """Refuse a point whose scaled learning rate is not a finite number > 0."""
    try:
        lr = member_lr(config)
    except OverflowError:
        lr = math.inf
    if not (math.isfinite(lr) and lr > 0):
        raise SpecError(
            "grid" if coords else "train.lr_scaling",
            coords or config.train.lr_scaling.model_dump(),
            f"the scaled learning rate (train.lr_scaling) of this point is {lr}, "
            "not a finite number > 0",
        )
