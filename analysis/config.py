"""The analysis' own sections of a sweep spec, and its view of a stored sweep.

``analysis:`` (:class:`AnalysisConfig`, the thresholds of ``phasesweep analyze``) and
``plots:`` (:class:`PlotSpec`, the figures) belong to the analysis; the pipeline's
:class:`~phasesweep.pipeline.spec.SweepSpec` composes them, so a launch validates them
with the rest of the spec. The analysis itself never reads the pipeline: it reads a
stored spec through :class:`StoredSweep`, which validates only what the analysis uses
(its two sections, the description and the grid's axis names) and ignores the rest.

Declarative only (pydantic and PyYAML): importing it loads neither pandas nor matplotlib.
"""

from __future__ import annotations

import logging
import math
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    ValidationError,
)

from phasesweep._config import (
    SHORT_NAMES,
    Section,
    SpecError,
    parse_yaml,
    raise_from_validation,
    yaml_problem,
)

log = logging.getLogger(__name__)

#: Relative tolerance within which a run's last logged time counts as having reached
#: ``analysis.at_time`` (t = Σ lr_k is accumulated step by step, so lr · steps lands a
#: few ulps off).
REACH_RTOL = 1e-9


def reached_time(t: float) -> str:
    """``t`` (> 0) rounded down to 6 significant digits, as text: a suggested
    ``analysis.at_time`` that a run ending at ``t`` reaches (rounding up might not)."""
    scale = 10.0 ** (5 - math.floor(math.log10(t)))
    return f"{math.floor(t * scale) / scale:.6g}"


#: The ``trajectories`` columns whose value decides lazy vs rich (``analysis._regimes``).
OrderParameter = Literal["kernel_distance", "param_rel_change", "lin_distance"]


class AnalysisConfig(Section):
    """Thresholds of ``phasesweep analyze`` (see the ``analysis`` package for the definitions)."""

    order_parameter: OrderParameter = Field(
        "kernel_distance",
        description="Final value of this trajectories column decides lazy vs rich.",
    )
    at_time: PositiveFloat | None = Field(
        None,
        description=(
            "gradient-flow time t = sum lr_k at which the order parameters and the loss ratio of "
            "the regime rule are read (interpolated linearly in log t between the two logged points"
            " around it; NULL for a run that stopped before t). None: each run's last logged point."
            " Runs compare at equal t only with this set or with equal t at the end. A launch "
            "refuses a t beyond every grid point's final time; analyze warns of runs that end "
            "before it."
        ),
    )
    lazy_threshold: PositiveFloat = Field(
        0.1,
        description=(
            "runs with the order parameter below this are lazy, above it rich. One value for "
            "every width: how the boundary it gives moves with the width depends on the data "
            "and the time (analysis._regimes), so read each width's boundary from its runs."
        ),
    )
    fallback_lazy_threshold: PositiveFloat | None = Field(
        None,
        description=(
            "threshold for the other order parameter, used when ``order_parameter`` is NULL for a "
            "run (e.g. ``metrics.ntk: false``); None: the same as ``lazy_threshold``."
        ),
    )
    converged_loss_frac: PositiveFloat = Field(
        0.1,
        description=(
            "a run whose final train loss is above this fraction of its initial loss is "
            "not_converged."
        ),
    )
    escape_eps: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.5,
        description=(
            "escape_time is when the loss falls for good below L0 - escape_eps * (L0 - L_end): this"
            " fraction of the run's own loss range."
        ),
    )
    extra_escape_eps: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        [0.1, 0.9], description="More eps whose escape times go to summaries.extra_escape_times."
    )
    escape_min_drop: Annotated[float, Field(ge=0, lt=1)] = Field(
        0.05,
        description=(
            "a run escapes only if its loss fell by at least this fraction of L0 overall; below it "
            "(a run stuck at a saddle) the escape time is NULL."
        ),
    )
    plateau_contrast: Annotated[float, Field(gt=1)] = Field(
        3.0,
        description=(
            "plateaus: the loss-decay rate -dlogL/dt in the drop that ends a plateau must exceed "
            "the rate on the plateau by this factor (linear dynamics never accelerate)."
        ),
    )
    plateau_min_drop: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.1,
        description=(
            "plateaus: the drop that ends a plateau lowers the loss by at least this fraction."
        ),
    )
    plateau_min_duration_ratio: NonNegativeFloat = Field(
        0.2,
        description=(
            "plateaus: a plateau lasts at least this fraction of the steep part of its drop."
        ),
    )
    plateau_loss_floor: Annotated[float, Field(gt=0, lt=1)] = Field(
        1e-12,
        description="plateaus: losses below this fraction of L0 are clipped (round-off floor).",
    )
    fit_min_decades: PositiveFloat = Field(
        2.0,
        description="scaling fits: the fitted init scales must span at least this many decades.",
    )
    fit_regimes: list[Literal["lazy", "rich", "not_converged"]] = Field(
        [
            "lazy",
            "rich",
            "not_converged",
        ],
        description="scaling fits: regimes of the runs whose escape times are fitted.",
    )
    fit_require_plateau: bool = Field(
        True,
        description=(
            "scaling fits: only runs that left a plateau (n_plateaus >= 1), i.e. escaped a saddle."
        ),
    )
    fit_init_scale_max: PositiveFloat | None = Field(
        None, description="scaling fits: only runs with init_scale at most this (None: all)."
    )
    fit_confidence: Annotated[float, Field(gt=0, lt=1)] = Field(
        0.95, description="scaling fits: confidence level of the intervals."
    )


class PlotSpec(Section):
    """One figure of ``phasesweep plot``; unset fields are chosen from the swept axes."""

    kind: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")] = Field(
        description="a figure kind registered in ``analysis.figures`` (phase_diagram, "
        "escape_time, loss_curves, singular_values, transversal, ...); checked against the "
        "registry before a launch and when the figures are drawn."
    )
    x: str | None = Field(
        None, description="runs column on the x axis (default: from the swept axes)."
    )
    y: str | None = Field(None, description="runs column on the y axis (phase_diagram).")
    value: str | None = Field(
        None,
        description=(
            "phase_diagram: the cell value, e.g. kernel_distance, param_rel_change, escape_time, "
            "loss_ratio."
        ),
    )
    hue: str | None = Field(None, description="runs column that colours the curves.")
    facet: str | None = Field(None, description="one panel per value of this runs column.")
    where: str | None = Field(
        None,
        description=(
            "SQL condition on the ``runs`` columns selecting the runs drawn, e.g. ``seed = 0``; "
            "one condition (no ';')."
        ),
    )
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")] | None = Field(
        None,
        description="file name stem (NAME.png, NAME.svg); default: derived from kind and axes.",
    )
    title: str | None = Field(
        None, description="Figure title (default: derived from kind and axes)."
    )


class StoredSweep(BaseModel):
    """What the analysis reads of a sweep's stored spec: its description, its ``analysis``
    and ``plots`` sections and the names of its grid axes.

    The other sections (model, data, train, metrics, execution) are the pipeline's: they
    are neither read nor validated here, so a stored spec whose training sections no
    longer validate (or whose ``init: file`` weights have moved) still gives its
    thresholds and figures.
    """

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, allow_inf_nan=False)

    description: str = ""
    analysis: AnalysisConfig = AnalysisConfig()
    plots: list[PlotSpec] | None = None
    #: axis -> values as written in the spec; only the axis names are read.
    grid: dict[str, Any] = {}

    @property
    def grid_axes(self) -> list[str]:
        """The grid axes as short names (dotted paths mapped back where they have one)."""
        inverse = {v: k for k, v in SHORT_NAMES.items()}
        return [inverse.get(k, k) for k in self.grid]

    @classmethod
    def from_yaml(cls, text: str) -> StoredSweep:
        """The view of a stored spec's YAML; raises :class:`SpecError` naming the key."""
        try:
            raw = parse_yaml(text)
        except yaml.YAMLError as e:
            raise SpecError("<spec>", text, yaml_problem(e)) from None
        if not isinstance(raw, dict):
            raise SpecError("<spec>", raw, "top level must be a mapping of keys")
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise_from_validation(e, raw, cls)
            raise  # unreachable: raise_from_validation always raises


def stored_sweep(text: str | None, sweep: str) -> StoredSweep | None:
    """The view of ``sweep``'s stored spec ``text``, or None: none stored, or the parts the
    analysis reads no longer validate (an old spec must not block the analysis or the
    figures: the defaults apply, with a warning)."""
    if text is None:
        return None
    try:
        return StoredSweep.from_yaml(text)
    except SpecError as e:
        log.warning("stored spec of sweep %s does not validate (%s); using defaults", sweep, e)
        return None
