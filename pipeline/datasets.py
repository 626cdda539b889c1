"""Datasets: generated per member from its own seed, stacked along the ensemble axis.

Every generator returns float64 CPU tensors; :func:`stack` moves them to the
chunk's device and dtype. Inputs are never standardised (PITFALLS: it would
erase the codimension of subspace data).

Kinds (``data.kind``):

- ``teacher``: x ~ N(0, I_d); y = a random teacher net of ``teacher_width``
  hidden units (``teacher_activation``, default relu), or a linear teacher with
  the given ``teacher_singular_values``.
- ``subspace``: x = U z + σ·noise with z ~ N(0, I_{d_x}) and U an orthonormal
  basis of a (randomly rotated, if ``rotate``) d_x-dimensional subspace; the
  noise lies in the codimension (``noise: codim``) or everywhere
  (``isotropic``); y = a smooth teacher (default tanh) of z alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.seeding import generator
from pipeline.spec import DataConfig


@dataclass
class Dataset:
    """One member's data. x: (n, d), y: (n, k); ``codim_basis`` (d, d − d_x) for subspace data."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    codim_basis: Tensor | None = None
    #: minibatches keep groups of this many consecutive training points together
    #: (2 for symmetric data stored as x, −x pairs).
    group_size: int = 1


@dataclass
class DataBatch:
    """A chunk's data, stacked: x (E, n, d), y (E, n, k), codim_basis (E, d, c) or None."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    codim_basis: Tensor | None
    group_size: int

    @property
    def input_dim(self) -> int:
        return self.x_train.shape[-1]

    @property
    def output_dim(self) -> int:
        return self.y_train.shape[-1]


def _randn(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _orthogonal(gen: torch.Generator, d: int) -> Tensor:
    q, r = torch.linalg.qr(_randn(gen, d, d))
    return q * torch.sign(torch.diagonal(r))  # Haar-distributed


def teacher_fn(
    cfg: DataConfig, gen: torch.Generator, d: int, default_act: str
) -> Callable[[Tensor], Tensor]:
    """A random teacher R^d → R^k, drawn from ``gen``."""
    k = cfg.output_dim
    if cfg.teacher_singular_values is not None:
        s = torch.tensor(cfg.teacher_singular_values, dtype=torch.float64)
        r = len(s)
        if r > min(d, k):
            raise ValueError(
                f"data.teacher_singular_values has {r} values, rank is at most {min(d, k)}"
            )
        u = _orthogonal(gen, k)[:, :r]
        v = _orthogonal(gen, d)[:, :r]
        w_star = (u * s) @ v.T
        return lambda x: x @ w_star.T
    act = cfg.teacher_activation or default_act
    w1 = _randn(gen, cfg.teacher_width, d) / math.sqrt(d)
    w2 = _randn(gen, k, cfg.teacher_width) / math.sqrt(cfg.teacher_width)
    phi = {"linear": lambda z: z, "relu": torch.relu, "tanh": torch.tanh}[act]
    return lambda x: phi(x @ w1.T) @ w2.T


def _teacher(cfg: DataConfig, gen: torch.Generator) -> Dataset:
    d = cfg.input_dim
    f = teacher_fn(cfg, gen, d, "relu")
    x_tr, x_te = _randn(gen, cfg.n_train, d), _randn(gen, cfg.n_test, d)
    return Dataset(x_tr, f(x_tr), x_te, f(x_te))


def _subspace(cfg: DataConfig, gen: torch.Generator) -> Dataset:
    d, dx = cfg.input_dim, cfg.subspace_dim
    basis = _orthogonal(gen, d) if cfg.rotate else torch.eye(d, dtype=torch.float64)
    u, v = basis[:, :dx], basis[:, dx:]
    f = teacher_fn(cfg, gen, dx, "tanh")

    def sample(n: int) -> tuple[Tensor, Tensor]:
        z = _randn(gen, n, dx)
        if cfg.noise == "codim":
            noise = _randn(gen, n, d - dx) @ v.T
        else:
            noise = _randn(gen, n, d)
        x = z @ u.T
        if cfg.noise_sigma > 0:  # σ = 0 keeps the codimension exactly zero
            x = x + cfg.noise_sigma * noise
        return x, f(z)

    x_tr, y_tr = sample(cfg.n_train)
    x_te, y_te = sample(cfg.n_test)
    return Dataset(x_tr, y_tr, x_te, y_te, codim_basis=v)


#: data.kind → generator(cfg, gen) -> Dataset
GENERATORS: dict[str, Callable[[DataConfig, torch.Generator], Dataset]] = {
    "teacher": _teacher,
    "subspace": _subspace,
}


def data_seed(cfg: DataConfig, train_seed: int) -> int:
    """The member's data seed: ``data.seed`` if set, else its ``train.seed``."""
    return train_seed if cfg.seed is None else cfg.seed


def make_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """One member's dataset from its data seed."""
    try:
        make = GENERATORS[cfg.kind]
    except KeyError:
        raise NotImplementedError(f"data.kind {cfg.kind!r} has no generator yet") from None
    return make(cfg, generator(seed, "data"))


def stack(datasets: Sequence[Dataset], dtype: torch.dtype, device: torch.device | str) -> DataBatch:
    """Stack members' datasets along a new leading ensemble axis."""

    def st(name: str) -> Tensor:
        return torch.stack([getattr(ds, name) for ds in datasets]).to(device=device, dtype=dtype)

    has_codim = datasets[0].codim_basis is not None
    return DataBatch(
        st("x_train"),
        st("y_train"),
        st("x_test"),
        st("y_test"),
        st("codim_basis") if has_codim else None,
        datasets[0].group_size,
    )
