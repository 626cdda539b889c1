"""The sweep spec: a validated base config plus a ``grid`` of axes.

A spec is YAML (see DESIGN.md). It is validated with pydantic in strict mode:
unknown keys (with the closest known key suggested), wrong types, out-of-range
values and floats that are not finite (``inf``, ``nan``) are errors that name the
dotted key and a bounded excerpt of the offending value (:class:`SpecError`).
The YAML reader refuses documents nested too deeply or whose aliases expand to
too many nodes, before building them. Nothing here touches the store; the CLI
validates the whole spec before anything is written.

The plumbing shared with the analysis (:class:`SpecError`, the YAML reader, the
translation of validation errors, the grid's short names) is :mod:`phasesweep._config`,
re-exported here; the ``analysis`` and ``plots`` sections are the analysis' own
(:mod:`phasesweep.analysis.config`). Every fact of a ``data.kind`` the spec checks is
in its :data:`DATA_KINDS` record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from phasesweep.analysis.config import AnalysisConfig, PlotSpec
from phasesweep.pipeline import activations
from pydantic import (
    AfterValidator,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

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


#: scikit-learn's bundled digits (``load_digits``): 8x8 images, images per class 0..9.
DIGITS_FEATURES = 64
DIGITS_CLASS_COUNTS = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)


@dataclass(frozen=True)
class DataKindFacts:
    """What the spec knows of one ``data.kind``: the one place a kind's declarative facts
    live (its generator is ``pipeline.data._datasets.GENERATORS[kind]``, a test ties the two)."""

    #: one phrase for the reference ("": described with its own fields).
    summary: str = ""
    #: (x, -x) pairs stored consecutively with odd labels (n_train even; ``whiten`` and
    #: ``label_noise_symmetric`` apply; ``even_part_frac`` recorded by default).
    paired: bool = False
    #: one label per point (±1, or an odd teacher's for random perturbed_symmetric):
    #: output_dim must be 1.
    scalar_labels: bool = False
    #: ``layout: paper``: that many fixed points in 2-d (None: no paper layout) ...
    paper_points: int | None = None
    #: ... padded with zeros to input_dim (else input_dim must be 2).
    paper_padded: bool = False
    #: the kind's own checks of a config (raise ``ValueError``), after the ones above.
    check: Callable[[DataConfig], None] | None = None


def _check_subspace(c: DataConfig) -> None:
    if c.subspace_dim > c.input_dim:
        raise ValueError(f"subspace_dim {c.subspace_dim} exceeds input_dim {c.input_dim}")


def _check_orthogonal(c: DataConfig) -> None:
    if c.layout == "random" and c.n_train > c.input_dim:
        raise ValueError(f"orthogonal data: n_train {c.n_train} exceeds input_dim {c.input_dim}")


def _check_perturbed(c: DataConfig) -> None:
    if c.layout == "random" and c.input_dim < 2:
        raise ValueError("perturbed_symmetric data needs input_dim >= 2")


def _check_xor(c: DataConfig) -> None:
    if c.input_dim < 2:
        raise ValueError("xor data needs input_dim >= 2")


def _check_digits(c: DataConfig) -> None:
    classes = list(range(10)) if c.classes is None else c.classes
    if len(classes) < 2 or len(set(classes)) != len(classes) or max(classes) > 9:
        raise ValueError(f"classes {classes}: give two or more distinct digits 0..9")
    available = sum(DIGITS_CLASS_COUNTS[k] for k in classes)
    if c.n_train + c.n_test > available:
        raise ValueError(
            f"n_train + n_test = {c.n_train + c.n_test} exceeds the "
            f"{available} digits images of classes {classes}"
        )


#: data.kind -> its facts, in the order the reference lists them.
DATA_KINDS: dict[str, DataKindFacts] = {
    "teacher": DataKindFacts("Gaussian inputs, labels from a random teacher net"),
    "subspace": DataKindFacts(
        "inputs on a random subspace_dim-dimensional subspace plus noise_sigma in the codimension",
        check=_check_subspace,
    ),
    "symmetric": DataKindFacts("(x, -x) pairs with odd labels", paired=True),
    "perturbed_symmetric": DataKindFacts(
        "symmetric with one point moved by delta",
        paired=True,
        scalar_labels=True,
        paper_points=6,
        check=_check_perturbed,
    ),
    "orthogonal": DataKindFacts(
        "orthogonal inputs with ±1 labels",
        scalar_labels=True,
        paper_points=2,
        check=_check_orthogonal,
    ),
    "xor": DataKindFacts(
        "four clusters with XOR labels",
        scalar_labels=True,
        paper_points=4,
        paper_padded=True,
        check=_check_xor,
    ),
    "digits": DataKindFacts("scikit-learn's 8x8 digits", check=_check_digits),
    "arrays": DataKindFacts(),
}
DataKind = Literal[tuple(DATA_KINDS)]
#: the kinds of (x, -x) pairs.
PAIRED_KINDS = tuple(k for k, f in DATA_KINDS.items() if f.paired)


def _user_file_path(
    raw: Any, selector: tuple[str, str], path_key: str, sha_key: str, what: str
) -> str | None:
    """The file path of a section that reads the researcher's own files (``init: file``,
    ``data.kind: arrays``); None when ``selector`` does not pick that mode (its path and
    hash keys must then be absent)."""
    if not isinstance(raw, dict):
        return None
    key, value = selector
    if raw.get(key) != value:
        if raw.get(path_key) is not None or raw.get(sha_key) is not None:
            raise ValueError(f"{path_key} and {sha_key} apply to {what} only")
        return None
    path = raw.get(path_key)
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what} needs {path_key} (a .npz file or a directory)")
    return path


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
        path = _user_file_path(raw, ("init", "file"), "init_path", "init_sha256", "init file")
        if path is None:
            return raw
        from phasesweep.pipeline.data._user_data import check_weights, load_weights

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


class DataConfig(Section):
    """Training and test data. Inputs have ``input_dim`` features, labels ``output_dim``."""

    kind: DataKind = Field(
        "teacher",
        description="; ".join(f"{k}: {f.summary}" for k, f in DATA_KINDS.items() if f.summary)
        + ".",
    )
    n_train: PositiveInt = Field(64, description="Training points (the loss is a mean over them).")
    n_test: PositiveInt = Field(
        256, description="Test points (the probe set is the first metrics.probe_size of them)."
    )
    input_dim: PositiveInt = Field(10, description="Input features.")
    output_dim: PositiveInt = Field(1, description="Outputs of the net (label dimension).")
    subspace_dim: PositiveInt = Field(
        2, description="subspace data: dimension of the data subspace."
    )
    noise_sigma: NonNegativeFloat = Field(
        0.0,
        description=(
            "subspace data: std of the noise in the codimension (or everywhere, see ``noise``); xor"
            " data: std of the isotropic cluster noise around the four points."
        ),
    )
    noise: Literal["codim", "isotropic"] = Field(
        "codim",
        description=(
            "subspace data: codim adds noise_sigma only in the codimension, isotropic in every "
            "direction."
        ),
    )
    rotate: bool = Field(
        True,
        description="subspace data: rotate the subspace randomly (False: the first coordinates).",
    )
    teacher_width: PositiveInt = Field(
        4,
        description=(
            "teacher net of the labels (teacher, subspace and symmetric data; symmetric data use "
            "its odd part, and default to tanh)."
        ),
    )
    teacher_activation: Literal["linear", "relu", "tanh"] | None = Field(
        None,
        description=(
            "Activation of the teacher net; None: relu for teacher data, tanh for subspace and "
            "symmetric data."
        ),
    )
    teacher_singular_values: list[PositiveFloat] | None = Field(
        None,
        description=(
            "linear teacher with these singular values (descending), e.g. for plateau calibration."
        ),
    )
    whiten: bool = Field(
        False,
        description=(
            "symmetric-type data: make the empirical input covariance (1/n) sum x x^T of the "
            "training set exactly the identity (the test set gets the same map)."
        ),
    )
    delta: NonNegativeFloat = Field(
        0.0,
        description=(
            "perturbed_symmetric: the last training point -x moves to -x + delta ||x|| u, u a unit "
            "vector orthogonal to x (layout paper: [1, 0] -> [1, delta])."
        ),
    )
    label_noise: NonNegativeFloat = Field(
        0.0,
        description=(
            "std of Gaussian noise added to the training labels; ``label_noise_symmetric`` adds "
            "(+eps, -eps) to each (x, -x) pair, so odd labels stay odd."
        ),
    )
    label_noise_symmetric: bool = Field(
        False, description="Add label noise as (+eps, -eps) to each (x, -x) pair (see label_noise)."
    )
    classes: list[NonNegativeInt] | None = Field(
        None,
        description=(
            "digits: which classes to keep (None: all ten). Two classes give ±1 labels (output_dim "
            "1), more give one-hot labels (output_dim = number of classes)."
        ),
    )
    layout: Literal["random", "paper"] = Field(
        "random",
        description=(
            "orthogonal, xor, perturbed_symmetric: ``random`` points, or ``paper``: the exact "
            "points of seed 004 (orthogonal: 2 points, xor: 4, perturbed_symmetric: 6; in 2-d, xor "
            "padded with zeros to input_dim). n_train may be any multiple of that count: the copies"
            " leave the loss (a mean over points) and so the training unchanged, and let one grid "
            "run several of these kinds with the same n_train."
        ),
    )
    seed: NonNegativeInt | None = Field(
        None, description="data seed; None derives it from ``train.seed``."
    )
    path: str | None = Field(
        None,
        description=(
            "arrays: the researcher's own data, a .npz file or a directory of NAME.npy files or "
            "NAME.parquet tables. n_train, n_test, input_dim, output_dim "
            "(and subspace_dim with a ``subspace_basis``) come from the arrays; values given must "
            "match."
        ),
    )
    arrays_sha256: str | None = Field(
        None,
        description=(
            "arrays: SHA-256 of the data files, filled in on load (so the run ids follow the "
            "contents, not only the path); a value given must match the files."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _arrays_dims(cls, raw: Any) -> Any:
        """arrays data: read and check the files; their shapes fix the sizes."""
        path = _user_file_path(raw, ("kind", "arrays"), "path", "arrays_sha256", "data kind arrays")
        if path is None:
            return raw
        from phasesweep.pipeline.data._user_data import BASIS, load_arrays

        arrays, sha = load_arrays(path)
        raw = dict(raw)
        dims = {
            "n_train": arrays["x_train"].shape[0],
            "n_test": arrays["x_test"].shape[0],
            "input_dim": arrays["x_train"].shape[1],
            "output_dim": arrays["y_train"].shape[1],
            "arrays_sha256": sha,
        }
        if BASIS in arrays:
            dims["subspace_dim"] = arrays[BASIS].shape[1]
        for key, value in dims.items():
            given = raw.get(key)
            if given is not None and given != value:
                raise ValueError(f"{key} is {given!r} but the arrays in {path} give {value!r}")
            raw[key] = value
        return raw

    @model_validator(mode="before")
    @classmethod
    def _digits_dims(cls, raw: Any) -> Any:
        """digits fixes its own dims: 64 features; 1 output for two classes, else one per class.

        ``input_dim``/``output_dim`` left out (or at their defaults) are filled in;
        any other value is an error.
        """
        if not isinstance(raw, dict) or raw.get("kind") != "digits":
            return raw
        raw = dict(raw)
        classes = raw.get("classes")
        n_classes = len(classes) if isinstance(classes, list) else 10
        dims = {"input_dim": (DIGITS_FEATURES, 10), "output_dim": (n_classes, 1)}
        if n_classes == 2:
            dims["output_dim"] = (1, 1)
        for key, (value, default) in dims.items():
            given = raw.get(key, default)
            if given == default:
                raw[key] = value
            elif given != value:
                raise ValueError(
                    f"{key} is {given} but digits data with these classes has {key} {value} "
                    "(leave it out)"
                )
        return raw

    @model_validator(mode="after")
    def _kind_fits(self) -> DataConfig:
        k, n, d, facts = self.kind, self.n_train, self.input_dim, DATA_KINDS[self.kind]
        if facts.paired and n % 2:
            raise ValueError(f"{k} data stores (x, -x) pairs: n_train {n} must be even")
        if self.whiten:
            if not facts.paired:
                raise ValueError(f"whiten applies to symmetric data, not {k}")
            if n // 2 < d:
                raise ValueError(
                    f"whiten needs n_train/2 >= input_dim ({n // 2} < {d}): the covariance "
                    "of fewer pairs is singular"
                )
        if self.label_noise_symmetric and not facts.paired:
            raise ValueError(f"label_noise_symmetric needs (x, -x) pairs, {k} data has none")
        if facts.scalar_labels and self.output_dim != 1:
            raise ValueError(f"{k} data has ±1 labels: output_dim must be 1")
        if facts.check is not None:
            facts.check(self)
        count = facts.paper_points
        if self.layout == "paper" and count and (n % count or d != 2 and not facts.paper_padded):
            raise ValueError(
                f"layout paper of {k} data is {count} points in 2-d: "
                f"n_train {n} must be a multiple of {count}"
                + ("" if facts.paper_padded else f" and input_dim {d} must be 2")
            )
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
            "log-spaced subset of the logged steps (the first and last always) and are NULL at the "
            "others; None: every logged step."
        ),
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


class RunConfig(Section):
    """The resolved config of one grid point: everything that determines its training."""

    model: ModelConfig = Field(ModelConfig(), description="The net.")
    data: DataConfig = Field(DataConfig(), description="The data.")
    train: TrainConfig = Field(TrainConfig(), description="The optimizer and its schedule.")
    metrics: MetricsConfig = Field(MetricsConfig(), description="What is recorded at logged steps.")


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
        from phasesweep.pipeline._axes import axis_path, axis_values
        from phasesweep.pipeline.data._user_data import load_weights, member_weights

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

    def check_at_time(self) -> None:
        """Refuse an ``analysis.at_time`` that no point of the grid reaches
        (:func:`pipeline.grid._horizon.check_at_time`; a launch calls it, a stored spec is not
        held to it)."""
        from phasesweep.pipeline.grid._horizon import check_at_time

        check_at_time(self)


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as YAML; returns (dotted key, value)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise SpecError("--set", text, "expected KEY=VALUE")
    try:
        parsed = parse_yaml(value) if value.strip() else None
    except yaml.YAMLError as e:
        raise SpecError(key.strip(), value, yaml_problem(e)) from None
    return key.strip(), parsed


def apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set ``raw[k1][k2]...`` = value for the dotted ``key``, creating sections as needed.

    Under ``grid.`` the rest of the key is one axis name, which may itself be a
    dotted path: ``grid.data.delta=[0, 0.1]`` sets the axis ``data.delta``.
    """
    parts = key.split(".")
    if parts[0] == "grid" and len(parts) > 2:
        parts = ["grid", ".".join(parts[1:])]
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise SpecError(
                ".".join(parts[: i + 1]), child, "is not a section, cannot set a key in it"
            )
        node = child
    node[parts[-1]] = value


#: Largest spec file read (bytes); larger ones (or endless ones, /dev/zero) are refused.
MAX_SPEC_BYTES = 16 * 2**20


def load_raw(path: str | Path) -> dict[str, Any]:
    """Read a spec file (UTF-8 YAML, at most :data:`MAX_SPEC_BYTES`) as a plain dict.

    No validation beyond the YAML itself and a mapping at the top level.
    """
    parts, size = [], 0
    try:
        with open(path, "rb") as f:
            while size <= MAX_SPEC_BYTES and (part := f.read(2**16)):  # no 16 MiB buffer
                parts.append(part)
                size += len(part)
    except OSError as e:
        raise SpecError("SPEC", str(path), f"cannot read: {e.strerror}") from None
    if size > MAX_SPEC_BYTES:
        raise SpecError("SPEC", str(path), f"larger than {MAX_SPEC_BYTES} bytes: not a spec")
    data = b"".join(parts)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(
            "SPEC", str(path), f"not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})"
        ) from None
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        raise SpecError("SPEC", str(path), yaml_problem(e)) from None
    if not isinstance(raw, dict):
        raise SpecError("SPEC", str(path), "top level must be a mapping of keys")
    return raw


def validate_spec(raw: dict[str, Any]) -> SweepSpec:
    """Validate a raw spec dict; raises :class:`SpecError`."""
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise_from_validation(e, raw, SweepSpec)
        raise  # unreachable: raise_from_validation always raises


def load_spec(path: str | Path, overrides: list[str] = ()) -> tuple[SweepSpec, dict[str, Any]]:
    """Load, override (``--set``) and validate a spec; returns the spec and its raw dict."""
    raw = load_raw(path)
    for text in overrides:
        apply_override(raw, *parse_override(text))
    return validate_spec(raw), raw
