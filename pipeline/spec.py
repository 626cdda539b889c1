"""The sweep spec: a validated base config plus a ``grid`` of axes.

A spec is YAML (see DESIGN.md). It is validated with pydantic in strict mode:
unknown keys (with the closest known key suggested), wrong types, out-of-range
values and floats that are not finite (``inf``, ``nan``) are errors that name the
dotted key and a bounded excerpt of the offending value (:class:`SpecError`).
The YAML reader refuses documents nested too deeply or whose aliases expand to
too many nodes, before building them. Nothing here touches the store; the CLI
validates the whole spec before anything is written.

This module is the spec's public face: :class:`SweepSpec` and its ``execution``
section, and :func:`validate_spec` / :func:`load_spec_and_raw`; the rest is defined
below it and re-exported here (every name stays importable from here):

- :mod:`pipeline._run_config`: :class:`RunConfig` and its sections;
- :mod:`pipeline._data_config`: :class:`DataConfig` and the :data:`DATA_KINDS` records
  (every fact of a ``data.kind`` the spec checks);
- :mod:`pipeline._spec_file`: the YAML file and the ``--set`` overrides;
- :mod:`pipeline._axes`: the grid axes' names and forms;
- :mod:`phasesweep._config`: the plumbing shared with the analysis (:class:`SpecError`,
  the YAML reader, the translation of validation errors, the grid's short names); the
  ``analysis`` and ``plots`` sections are the analysis' own
  (:mod:`phasesweep.analysis.config`).

The spec imports nothing of the grid (:mod:`pipeline.grid`), which expands it: an init
file's weights are checked against the grid's seeds here through the axes, which are
the spec's own language (:mod:`pipeline._axes`), and the check that ``analysis.at_time``
lies within the grid's reach, which needs the learning-rate rule and the schedules, is
the launch's (:func:`pipeline.grid.check_at_time`; a stored spec is not held to it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from phasesweep.analysis.config import AnalysisConfig, PlotSpec
from phasesweep.pipeline._axes import axis_path, axis_values
from phasesweep.pipeline._data_config import (  # noqa: F401 - re-exported
    DATA_KINDS,
    DIGITS_CLASS_COUNTS,
    DIGITS_FEATURES,
    PAIRED_KINDS,
    DataConfig,
    DataKind,
    DataKindFacts,
)
from phasesweep.pipeline._run_config import (  # noqa: F401 - re-exported
    Activation,
    LrScaling,
    MetricsConfig,
    ModelConfig,
    Parameterization,
    RunConfig,
    TrainConfig,
)
from phasesweep.pipeline._spec_file import (  # noqa: F401 - re-exported
    MAX_SPEC_BYTES,
    apply_override,
    load_raw,
    parse_override,
)
from phasesweep.pipeline.data._user_data import load_weights, member_weights
from pydantic import Field, PositiveInt, ValidationError, field_validator, model_validator

from phasesweep._config import (  # noqa: F401 - the unused ones are re-exported
    EXCERPT_CHARS,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    SHORT_NAMES,
    SWEEP_NAME,
    Section,
    SpecError,
    did_you_mean,
    excerpt,
    parse_yaml,
    raise_from_validation,
    yaml_problem,
)


class ExecutionConfig(Section):
    """How grid points are packed into chunks: one chunk is one Ray trial, one ensemble."""

    max_chunk_size: PositiveInt | None = Field(
        None,
        description=(
            "most members in one chunk (one Ray trial); the memory budget may make it smaller. "
            "None: 1024 on the CPU (up to 8192 where 1024 members train for less than about a "
            "second); on a GPU as many as the memory budget holds."
        ),
    )
    max_points: PositiveInt = Field(
        10**7,
        description=(
            "most grid points (the product of the axis sizes, checked before the grid is expanded):"
            " a typo such as ``seed: {range: [0, 1000000000]}`` is refused at once."
        ),
    )
    memory_budget_mb: PositiveInt | None = Field(
        None,
        description=(
            "memory a chunk may use for parameters, gradients and activations, MiB. None: 1024 "
            "on the CPU; on a GPU half the trial's device memory (the card's memory times "
            "--gpus-per-trial; stated for a dry run with --device-memory)."
        ),
    )
    commit_every_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] = Field(
        300.0,
        description=(
            "seconds of training between checkpoints of a running chunk in the store: a kill or "
            "Ctrl-C loses at most this much of its training (the next launch resumes)."
        ),
    )


class SweepSpec(Section):
    """A sweep: a base config (model, data, train, metrics) and a ``grid`` of axes over it,
    with the analysis thresholds, figures and chunking that go with it."""

    name: str = Field(
        description=f"The sweep's name: {SWEEP_NAME.pattern}, its partition key in the store."
    )
    description: str = Field("", description="Free text, shown in the report.")
    model: ModelConfig = Field(
        ModelConfig(), description="Base config of the net (grid axes override it per point)."
    )
    data: DataConfig = Field(DataConfig(), description="Base config of the data.")
    train: TrainConfig = Field(TrainConfig(), description="Base config of training.")
    metrics: MetricsConfig = Field(MetricsConfig(), description="What is recorded at logged steps.")
    analysis: AnalysisConfig = Field(
        AnalysisConfig(), description="Thresholds of `phasesweep analyze`."
    )
    plots: list[PlotSpec] | None = Field(
        None,
        description=(
            "Figures of `phasesweep plot` and the report; None: chosen from the swept axes."
        ),
    )
    execution: ExecutionConfig = Field(
        ExecutionConfig(), description="How points are packed into chunks (Ray trials)."
    )
    parent: str | None = Field(
        None,
        description=(
            "the sweep this one refines (set by ``phasesweep refine``); None for a launched sweep."
        ),
    )
    grid: dict[str, Any] = Field(
        {}, description="axis (short name or dotted path into model/data/train/metrics) -> values."
    )

    @field_validator("name")
    @classmethod
    def _name_is_partition_key(cls, v: str) -> str:
        if not SWEEP_NAME.fullmatch(v):
            raise ValueError(f"must match {SWEEP_NAME.pattern} (it names the store partition)")
        return v

    @model_validator(mode="after")
    def _init_file_fits(self) -> SweepSpec:
        """init file: the first and last layers fit the data, and every seed has weights."""
        if self.model.init != "file":
            return self
        m, path = self.model, self.model.init_path
        dims = [self.data.input_dim] + [m.width] * (m.depth - 1) + [self.data.output_dim]
        seeds = [self.train.seed]
        for axis, values in self.grid.items():
            if axis_path(axis) == "train.seed":
                seeds = axis_values(axis, values)
        weights, _ = load_weights(path)
        for seed in seeds:
            member_weights(path, weights, dims, seed)
        return self

    def base(self) -> RunConfig:
        return RunConfig(model=self.model, data=self.data, train=self.train, metrics=self.metrics)


def validate_spec(raw: dict[str, Any]) -> SweepSpec:
    """Validate a raw spec dict; raises :class:`SpecError`."""
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise_from_validation(e, raw, SweepSpec)
        raise  # unreachable: raise_from_validation always raises


def load_spec_and_raw(
    path: str | Path, overrides: list[str] = ()
) -> tuple[SweepSpec, dict[str, Any]]:
    """Load, override (``--set``) and validate a spec; returns the spec and its raw dict
    (what the store keeps as the sweep's spec)."""
    raw = load_raw(path)
    for text in overrides:
        apply_override(raw, *parse_override(text))
    return validate_spec(raw), raw


#: :func:`load_spec_and_raw`, under its former name (kept for compatibility; it returns the
#: raw dict too, unlike ``phasesweep.load_spec``).
load_spec = load_spec_and_raw
