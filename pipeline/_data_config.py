"""The ``data`` section of a spec (:class:`DataConfig`) and the facts of each
``data.kind`` it checks (:data:`DATA_KINDS`). Public through :mod:`pipeline.spec`.

Every fact of a ``data.kind`` the spec checks is in its :data:`DATA_KINDS` record (its
generator is ``pipeline.data._datasets.GENERATORS[kind]``). The ``arrays`` kind reads
the researcher's files while it validates (:mod:`pipeline.data._user_data`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from phasesweep.pipeline.data._user_data import BASIS, load_arrays, user_file_path
from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from phasesweep._config import Section

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
        path = user_file_path(raw, ("kind", "arrays"), "path", "arrays_sha256", "data kind arrays")
        if path is None:
            return raw
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
