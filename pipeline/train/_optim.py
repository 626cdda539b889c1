"""The optimizers and the learning-rate schedules: each is one class here, and the trainer,
the grid and the horizon ask it instead of switching on its name.

An optimizer (``train.optimizer``, :data:`OPTIMIZERS`) says

- which rows a step trains on: how many (:meth:`Optimizer.step_rows`, for the grid's cost
  model and the choice of step engine), which (:meth:`Optimizer.minibatch`), and whether
  that is the whole training set (:attr:`Optimizer.full_batch`; if not, a logged step
  computes the full-batch loss and gradient apart);
- how θ moves given a step's η (E,): :meth:`Optimizer.step` for a non-logged step (gd and
  sgd: the step engines' fused ``θ ← θ − η∇L`` in one pass, for speed) and
  :meth:`Optimizer.update` at a logged step, whose gradients the metrics read first;
- its checkpoint state (:meth:`Optimizer.state`; gd and sgd have none).

A schedule (``train.lr_schedule``, :data:`SCHEDULES`) says

- η_k (E,) of step k for every member (:meth:`Schedule.__call__`), capture-safe: with the
  step index as a device tensor (a captured CUDA step, :mod:`pipeline.train._capture`) it
  reads tables built beforehand with ``index_select``, never a value on the host;
- the final gradient-flow time ``Σ_{k<steps} η_k`` in closed form
  (:meth:`Schedule.final_time`, an upper bound where η depends on θ) for the horizon
  (:mod:`pipeline.grid._horizon`), and the config fields besides ``train.lr`` and
  ``train.steps`` that it depends on (:attr:`Schedule.time_fields`);
- the fields the members of one chunk may differ in (:attr:`Schedule.member_fields`: the
  learning rate, one per member), part of the grid's ``MEMBER_FIELDS``;
- its checkpoint state (:meth:`Schedule.state`; these three have none).

Adding an optimizer or a schedule touches three files: its class here with its entry in
:data:`OPTIMIZERS` or :data:`SCHEDULES`; its name in the literal of ``TrainConfig.optimizer``
or ``TrainConfig.lr_schedule`` in :mod:`pipeline._run_config` (the spec's train section),
beside any field of its own (tests/test_lr.py checks that the literals and the registries
agree); and tests/test_lr.py, whose checks of η_k against the closed forms run over every
registered schedule. ``docs/reference/`` is regenerated from the spec, not edited.

The grid imports this module and must not load torch (the CLI starts without it), so the
tensor math here is tensor methods only; the SGD sampler, which imports torch, is
imported where an SGD optimizer is built.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol, cast

if TYPE_CHECKING:
    import torch
    from phasesweep.pipeline.data._datasets import DataBatch
    from phasesweep.pipeline.spec import RunConfig, TrainConfig
    from phasesweep.pipeline.train._models import Params
    from torch import Tensor


class Stepper(Protocol):
    """A step engine (:class:`~pipeline.train._models.EnsembleStep`,
    :class:`~pipeline.train._linear_step.LinearStep`), as far as an optimizer uses it
    (named here, not imported: the step engines import the grid, which imports this)."""

    def step(self, params: Params, x: Tensor, y: Tensor, eta: Tensor) -> Tensor:
        """θ ← θ − η∇L on (x, y) in place; the loss (E,) before the update."""
        ...


# -- optimizers ---------------------------------------------------------------------------------


class Optimizer:
    """``gd``: full-batch gradient descent, θ ← θ − η_k ∇L(θ) on the whole training set.

    Built per chunk from the members' ``configs`` and the training ``device``; the base of
    every optimizer."""

    #: whether :meth:`minibatch` is the whole training set (the loss every step sees is the
    #: full training loss)
    full_batch: ClassVar[bool] = True
    #: (section, field) of the config that may differ between the members of a chunk
    member_fields: ClassVar[tuple[tuple[str, str], ...]] = ()

    @staticmethod
    def step_rows(config: RunConfig) -> int:
        """Samples one training step sees."""
        return config.data.n_train

    def __init__(self, configs: Sequence[RunConfig], device: torch.device) -> None:
        """gd keeps nothing of the chunk: its rows are the training set of each call's data."""

    def minibatch(self, batch: DataBatch, k: int) -> tuple[Tensor, Tensor]:
        """The (x, y) of the chunk's data ``batch`` that step k trains on, x (E, rows, d)
        and y (E, rows, output_dim)."""
        return batch.x_train, batch.y_train

    def step(self, stepper: Stepper, params: Params, x: Tensor, y: Tensor, eta: Tensor) -> Tensor:
        """A non-logged step on (x, y) with η ``eta`` (E,), θ updated in place; returns the
        loss (E,) at θ before the update. Reads nothing on the host."""
        return stepper.step(params, x, y, eta)

    def update(self, params: Params, grads: Params, eta: Tensor) -> None:
        """θ ← θ − η ∇L in place at a logged step, from the gradients there (overwritten)."""
        for p, g in zip(params.tensors(), grads.tensors()):
            p.sub_(g.mul_(eta.view(-1, *([1] * (g.dim() - 1)))))

    def state(self) -> dict[str, Tensor]:
        """What a checkpoint keeps of the optimizer, tensors on the host under keys of their
        own (gd: nothing)."""
        return {}

    def load_state(self, saved: dict) -> None:
        """Take back :meth:`state` from a checkpoint (loaded wherever its tensors were)."""


class MinibatchSGD(Optimizer):
    """``sgd``: the gd update on a minibatch of ``train.batch_size`` rows per step, drawn per
    member without replacement within an epoch (:class:`~pipeline.train._sampler.MinibatchSampler`)."""

    full_batch = False

    @staticmethod
    def step_rows(config: RunConfig) -> int:
        return cast(int, config.train.batch_size)  # the spec requires it for sgd

    def __init__(self, configs: Sequence[RunConfig], device: torch.device) -> None:
        from phasesweep.pipeline.train._sampler import MinibatchSampler

        self.sampler = MinibatchSampler(configs, device)

    def minibatch(self, batch: DataBatch, k: int) -> tuple[Tensor, Tensor]:
        return self.sampler(batch, k)


#: ``train.optimizer`` -> its class (``TrainConfig.optimizer``'s literal lists the same names).
OPTIMIZERS: dict[str, type[Optimizer]] = {"gd": Optimizer, "sgd": MinibatchSGD}


# -- schedules ----------------------------------------------------------------------------------


class Schedule:
    """``constant``: η_k = η, the member's scaled learning rate.

    Built per chunk from ``lr`` (E,), the members' scaled learning rates
    (:func:`pipeline.grid._grid.member_lr`) on the training device, the chunk's ``train``
    section and its nets' ``depth`` (weight matrices); the base of every schedule."""

    #: config fields besides ``train.lr``, ``train.steps`` and the scaling of lr that
    #: :meth:`final_time` depends on, as dotted paths; it must be monotone in each (the
    #: horizon looks for the largest final time of a grid at the corners of its axes)
    time_fields: ClassVar[tuple[str, ...]] = ()
    #: (section, field) of the config that may differ between the members of a chunk
    member_fields: ClassVar[tuple[tuple[str, str], ...]] = (("train", "lr"),)

    @classmethod
    def final_time(cls, lr: float, train: TrainConfig) -> float:
        """Σ_{k<steps} η_k for scaled learning rate ``lr``: ``steps · η``."""
        return lr * train.steps

    def __init__(self, lr: Tensor, train: TrainConfig, depth: int) -> None:
        self.lr, self.train, self.depth = lr, train, depth

    def __call__(self, k: int | Tensor, params: Params) -> Tensor:
        """η_k (E,) at θ = ``params`` (before the alive mask). ``k``: a Python int, or a 0-dim
        int64 tensor on the training device (a step that must not read the host)."""
        return self.lr

    def clock(self, steps: Sequence[int]) -> Tensor | None:
        """The trainer's clock Σ_{k<s} η_k (E, len(steps)) at each of the ascending
        ``steps``, summed as the trainer sums it (one η_k after another, the same ops), so
        equal to its ``time`` bit for bit while a member lives: what the kernel predictor
        evaluates ahead (:class:`~pipeline.train.metrics._ntk.KernelFlow`). None where η
        depends on θ. Cost: one addition of (E,) per step up to the last of ``steps``."""
        E = len(self.lr)
        out, time = self.lr.new_empty(E, len(steps)), self.lr.new_zeros(E)
        for j, (start, stop) in enumerate(zip([0, *steps[:-1]], steps)):
            for k in range(start, stop):
                time = time + self(k, None)  # type: ignore[arg-type]
            out[:, j] = time
        return out

    def state(self) -> dict[str, Tensor]:
        """What a checkpoint keeps of the schedule, tensors on the host under keys of their
        own (none for these)."""
        return {}

    def load_state(self, saved: dict) -> None:
        """Take back :meth:`state` from a checkpoint (loaded wherever its tensors were)."""


class Cosine(Schedule):
    """``cosine``: η_k = η (m + (1 − m) (1 + cos(πk/steps)) / 2), from η to m·η at the last
    step, m = ``train.lr_min_frac``.

    Its final time is η (steps · m + (1 − m) (steps + 1) / 2), since Σ_{k<N} cos(πk/N) = 1."""

    time_fields = ("train.lr_min_frac",)

    @staticmethod
    def factor(train: TrainConfig, k: int) -> float:
        """η_k / η."""
        m = train.lr_min_frac
        return m + (1 - m) * 0.5 * (1 + math.cos(math.pi * k / train.steps))

    @classmethod
    def final_time(cls, lr: float, train: TrainConfig) -> float:
        m = train.lr_min_frac
        return lr * (train.steps * m + (1 - m) * (train.steps + 1) / 2)

    def __init__(self, lr: Tensor, train: TrainConfig, depth: int) -> None:
        super().__init__(lr, train, depth)
        #: η_k / η of every step k ≤ steps (steps + 1,): what a device-tensor k indexes
        self.table = lr.new_tensor([self.factor(train, j) for j in range(train.steps + 1)])

    def __call__(self, k: int | Tensor, params: Params) -> Tensor:
        if isinstance(k, int):
            return self.lr * self.factor(self.train, k)
        return self.lr * self.table.index_select(0, k.view(1))


class NormAdaptive(Schedule):
    """``norm_adaptive``: η_k = min(η, c ‖θ_k‖^(2−L)), c = ``train.lr_c``, L the depth, the
    norm ``‖θ‖/√L`` for ``train.lr_norm`` = ``layer_rms``.

    η_k ≤ η, so ``steps · η`` bounds its final time."""

    def clock(self, steps: Sequence[int]) -> None:
        """None: η_k depends on θ_k, so the clock is not known ahead."""
        return None

    def __call__(self, k: int | Tensor, params: Params) -> Tensor:
        norm = params.sq_norm().sqrt()
        if self.train.lr_norm == "layer_rms":
            norm = norm / math.sqrt(self.depth)
        return self.lr.minimum(self.train.lr_c * norm.pow(2 - self.depth))


#: ``train.lr_schedule`` -> its class (``TrainConfig.lr_schedule``'s literal lists the same names).
SCHEDULES: dict[str, type[Schedule]] = {
    "constant": Schedule,
    "cosine": Cosine,
    "norm_adaptive": NormAdaptive,
}


# -- what the grid and the horizon ask -------------------------------------------------------

#: Fields the members of one chunk may differ in because an optimizer or schedule reads them
#: per member (part of the grid's ``MEMBER_FIELDS``).
MEMBER_FIELDS: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys(f for c in (*OPTIMIZERS.values(), *SCHEDULES.values()) for f in c.member_fields)
)

#: Fields a final time depends on through its schedule (part of the horizon's ``TIME_FIELDS``).
TIME_FIELDS: tuple[str, ...] = tuple(
    dict.fromkeys(f for s in SCHEDULES.values() for f in s.time_fields)
)


def step_rows(config: RunConfig) -> int:
    """Samples one training step of ``config`` sees (its optimizer's :meth:`~Optimizer.step_rows`)."""
    return OPTIMIZERS[config.train.optimizer].step_rows(config)


def final_time(lr: float, train: TrainConfig) -> float:
    """Σ_{k<steps} η_k of a run with scaled learning rate ``lr`` (its schedule's
    :meth:`~Schedule.final_time`)."""
    return SCHEDULES[train.lr_schedule].final_time(lr, train)
