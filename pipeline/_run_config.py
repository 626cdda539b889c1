"""The resolved config of one grid point (:class:`RunConfig`) and its sections: the net,
the data (:mod:`pipeline._data_config`), the optimizer and its schedule, the metrics.
Public through :mod:`pipeline.spec`, which adds the sweep around it.

``model.init: file`` reads and checks the researcher's weights while it validates
(:mod:`pipeline.data._user_data`); their fit to the data and the grid's seeds needs the
whole spec (:class:`pipeline.spec.SweepSpec`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from phasesweep.pipeline import activations
from phasesweep.pipeline._data_config import PAIRED_KINDS, DataConfig
from phasesweep.pipeline.data._user_data import check_weights, load_weights, user_file_path
from pydantic import (
    AfterValidator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)
from pydantic_core import PydanticCustomError

from phasesweep._config import Section, did_you_mean


def _registered_activation(name: str) -> str:
    known = activations.names()
    if name not in known:
        raise PydanticCustomError(
            "activation",
            "not an activation{hint}; one of {known}",
            {"hint": did_you_mean(name, known), "known": ", ".join(known)},
        )
    return name


#: A name in the activation registry (:mod:`pipeline.activations`), checked when validated.
Activation = Annotated[str, AfterValidator(_registered_activation)]
Parameterization = Literal["standard", "ntk", "mean_field"]


class ModelConfig(Section):
    """A fully connected net. ``depth`` counts weight matrices (depth 2 = one hidden layer)."""

    depth: PositiveInt = Field(
        2, description="Number of weight matrices (depth 2 = one hidden layer)."
    )
    width: PositiveInt = Field(256, description="Units per hidden layer.")
    activation: Activation = Field(
        "relu",
        description="Nonlinearity of the hidden layers (none on the output layer).",
        json_schema_extra=lambda schema: schema.update(enum=list(activations.names())),
    )
    leaky_slope: NonNegativeFloat = Field(
        0.01, description="Slope of leaky_relu for negative inputs (leaky_relu only)."
    )
    bias: bool = Field(False, description="Whether layers have biases (they start at zero).")
    parameterization: Parameterization = Field(
        "ntk",
        description=(
            "Init std and forward multiplier of layer l, fan-in n: standard (std g/√n, multiplier "
            "1), ntk (std g, multiplier 1/√n), mean_field (std g, 1/√n, last layer 1/n); g = "
            "init_scale."
        ),
    )
    init_scale: PositiveFloat = Field(
        1.0, description="Multiplies the standard deviation of every layer's initial weights."
    )
    init: Literal[
        "gaussian", "balanced", "balanced_rank_one", "balanced_full", "antisymmetric", "file"
    ] = Field(
        "gaussian",
        description=(
            "gaussian: i.i.d. normal; balanced (= balanced_rank_one): aligned rank-one, exactly "
            "balanced layers; balanced_full: exactly balanced with the largest rank the layer "
            "shapes allow (min of all dims), equal singular values; antisymmetric: two mirrored "
            "halves so the output is exactly 0 at init. file: the researcher's own weights from "
            "``init_path`` (see below)."
        ),
    )
    init_path: str | None = Field(
        None,
        description=(
            "init file: a .npz (or a directory of NAME.npy files) with arrays ``W1`` … ``WL`` "
            "(fan_out, fan_in), shared by all members, and/or ``W1_seed0`` …, used by the member "
            "with that ``train.seed`` (before the shared one). The weights are multiplied by "
            "``init_scale`` (and ``layer_scales``): init_scale 1 uses them as given."
        ),
    )
    init_sha256: str | None = Field(
        None,
        description=(
            "init file: SHA-256 of its bytes, filled in on load (run ids follow the contents)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _init_file(cls, raw: Any) -> Any:
        """init file: read and check the weights against the hidden widths and the depth."""
        path = user_file_path(raw, ("init", "file"), "init_path", "init_sha256", "init file")
        if path is None:
            return raw
        weights, sha = load_weights(path)
        depth, width = raw.get("depth", 2), raw.get("width", 256)
        if isinstance(depth, int) and isinstance(width, int) and depth >= 1:
            check_weights(path, weights, [None] + [width] * (depth - 1) + [None])
        if raw.get("init_sha256") not in (None, sha):
            raise ValueError(f"init_sha256 does not match the files of {path}")
        return {**raw, "init_sha256": sha}

    init_norm: Literal["fan_in", "entry_std", "frobenius"] = Field(
        "fan_in",
        description=(
            "What ``init_scale`` sets: ``fan_in`` (the parameterization's own std times "
            "init_scale), ``entry_std`` (every entry has std init_scale), ``frobenius`` (every "
            "layer is rescaled to ||W_l(0)||_F = init_scale)."
        ),
    )
    layer_scales: list[PositiveFloat] | None = Field(
        None,
        description="Extra per-layer multipliers of the init (unbalanced init); length ``depth``.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.layer_scales is not None and len(self.layer_scales) != self.depth:
            raise ValueError(
                f"layer_scales has {len(self.layer_scales)} entries but depth is {self.depth}"
            )
        if self.init == "antisymmetric" and (self.depth < 2 or self.width % 2):
            raise ValueError("init antisymmetric needs depth >= 2 and an even width")
        return self


class LrScaling(Section):
    """lr = train.lr * max(init_scale, init_scale_floor)**p * width**width_power,
    p = init_scale_power + init_scale_depth_power * (depth - 1).

    The floor lets a rule act only where it is needed: with power -2 and floor 1,
    large inits (whose kernel grows like init_scale²) get a stable lr while small
    inits keep the lr that is stable once they have escaped the origin.
    """

    init_scale_power: float = Field(
        0.0,
        description="Exponent of the init_scale factor (see the rule above).",
    )
    init_scale_depth_power: float = Field(
        0.0,
        description=(
            "added to ``init_scale_power`` once per hidden layer: the exponent of the init_scale "
            "factor is ``init_scale_power + init_scale_depth_power * (depth - 1)`` (-2 with floor "
            "1: lr ∝ 1/init_scale^(2(depth-1)), the growth of the NTK)."
        ),
    )
    init_scale_floor: NonNegativeFloat = Field(
        0.0,
        description="init_scale below this counts as the floor in the rule.",
    )
    width_power: float = Field(0.0, description="Exponent of the width factor.")


class TrainConfig(Section):
    """Optimizer, learning rate and its schedule, steps and logging of one training."""

    optimizer: Literal["gd", "sgd"] = Field(
        "gd",
        description="gd: full-batch gradient descent; sgd: minibatches of batch_size.",
    )
    batch_size: PositiveInt | None = Field(
        None,
        description="Minibatch size (sgd only; required there).",
    )
    lr: PositiveFloat = Field(
        0.05,
        description="Learning rate (before lr_scaling and the schedule).",
    )
    lr_schedule: Literal["constant", "cosine", "norm_adaptive"] = Field(
        "constant",
        description=(
            "constant; cosine (from lr to lr*lr_min_frac); norm_adaptive: eta = min(lr, lr_c * "
            "||theta||^(2 - depth)). Time is always t = sum eta_k."
        ),
    )
    lr_min_frac: NonNegativeFloat = Field(
        0.0,
        description="cosine: the final lr as a fraction of lr.",
    )
    lr_c: PositiveFloat = Field(1.0, description="norm_adaptive: the constant lr_c of the rule.")
    lr_norm: Literal["total", "layer_rms"] = Field(
        "total",
        description=(
            "norm_adaptive: the norm in the rule: ``total`` ||theta||, or ``layer_rms`` "
            "||theta||/sqrt(depth), the size of one layer of a balanced net. The Hessian of a "
            "depth-L homogeneous net with layers of size r scales like r^(L-2), so with "
            "``layer_rms`` one lr_c is equally stable at every depth."
        ),
    )
    lr_scaling: LrScaling = Field(
        LrScaling(),
        description="A rule that scales lr with init_scale, depth and width.",
    )
    steps: PositiveInt = Field(5000, description="Gradient steps.")
    log_points: Annotated[int, Field(ge=2)] = Field(
        100,
        description="About this many log-spaced logged steps (step 0 and the last included).",
    )
    seed: NonNegativeInt = Field(
        0,
        description="Seed of the init (and of the data unless data.seed is set).",
    )
    divergence_factor: Annotated[float, Field(gt=1)] = Field(
        1e6,
        description="a member whose loss exceeds this factor times its initial loss is diverged.",
    )
    dtype: Literal["float64", "float32"] = Field(
        "float64",
        description="Floating-point type of training.",
    )
    allow_tf32: bool = Field(
        False,
        description="On GPU, allow TF32 matmuls (off: full float32 precision).",
    )

    @model_validator(mode="after")
    def _batch_size_for_sgd(self) -> TrainConfig:
        if self.optimizer == "sgd" and self.batch_size is None:
            raise ValueError("optimizer sgd needs batch_size")
        return self


class MetricsConfig(Section):
    """Metrics recorded at logged steps; kernels and spectra on a fixed probe set."""

    probe_size: Annotated[int, Field(ge=1, le=512)] = Field(
        64,
        description=(
            "probe inputs for the NTK, activation flips and output norms (first test points)."
        ),
    )
    ntk: bool = Field(
        True,
        description=(
            "Record the empirical NTK metrics (kernel_distance, kernel_alignment, "
            "kernel_rel_change, ntk_eig_min/max)."
        ),
    )
    top_k: Annotated[int, Field(ge=1, le=64)] = Field(
        5, description="Singular values kept per layer (top_sv, delta_top_sv)."
    )
    transversal: bool = Field(True, description="Record transversal_grad_sq (subspace data only).")
    spectra: bool = Field(
        True,
        description=(
            "per-layer singular values (top_sv, delta_top_sv, stable_rank): one SVD per layer."
        ),
    )
    linearized: bool = Field(
        True,
        description=(
            "the kernel predictor (lin_test_loss, lin_distance): the linearized model at init "
            "trained by gradient flow to each logged time; needs ``ntk``, one output and n_train <="
            " 512 (the train kernel's eigendecomposition, once per chunk)."
        ),
    )
    even_part: bool | None = Field(
        None,
        description=(
            f"even_part_frac; None: only for symmetric data kinds ({', '.join(PAIRED_KINDS)})."
        ),
    )
    spectra_budget: PositiveFloat | None = Field(
        0.1,
        description=(
            "most work of the singular values and the NTK eigenvalues as a fraction of the "
            "training's (both estimated from the shapes; the training's as backpropagation's, "
            "also for linear nets, whose factored step is far cheaper, so that their spectra "
            "are kept at as many steps): above it they are computed at a "
            "log-spaced subset of the logged steps and are NULL at the others; None: every "
            "logged step. Where fewer than 2 logged steps fit, the singular values are kept at "
            "the last and the NTK eigenvalues at the first and the last, over the budget: a run "
            "that short spends one SVD step and two eigenvalue steps (width 256, depth 4, 64 "
            "training points: about 47/steps of its training)."
        ),
    )


class RunConfig(Section):
    """The resolved config of one grid point: everything that determines its training."""

    model: ModelConfig = Field(ModelConfig(), description="The net.")
    data: DataConfig = Field(DataConfig(), description="The data.")
    train: TrainConfig = Field(TrainConfig(), description="The optimizer and its schedule.")
    metrics: MetricsConfig = Field(MetricsConfig(), description="What is recorded at logged steps.")
