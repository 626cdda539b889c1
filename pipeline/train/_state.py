"""The per-member state of the step loop besides θ: clock, losses, crossing events,
divergence, and the index of the step being taken.

It lives on the training device and is updated in place, so that a captured step
(:mod:`pipeline.train._capture`) replays on the very same tensors; :attr:`LoopState.SAVED`
names what a checkpoint keeps of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from phasesweep.storage.schema import CROSSING_FRACTIONS
from torch import Tensor


@dataclass
class LoopState:
    """Per-member state of the step loop besides θ, on the training device and updated in
    place (a captured step replays on these very tensors): the gradient-flow time of step
    k (``time_now``) and of step k − 1, the loss at step k − 1, the initial loss and what
    derives from it (the crossing targets, (E, F), and the divergence limit), whether each
    member is alive, its first crossing times (E, F), the step it stopped at, the index
    of the step being taken (for a captured step: no Python value is frozen into it) and
    the step's η (E,)."""

    time_now: Tensor
    prev_time: Tensor
    prev_loss: Tensor | None
    loss0: Tensor | None
    alive: Tensor
    crossing: Tensor
    final_step: Tensor
    step: Tensor
    eta: Tensor
    target: Tensor | None = None
    limit: Tensor | None = None

    #: keys of a checkpoint (:meth:`ChunkTrainer.run`'s ``state()``) that this holds
    SAVED = ("time_now", "alive", "crossing", "final_step", "loss0", "prev_loss", "prev_time")

    @classmethod
    def fresh(cls, E: int, steps: int, dtype: torch.dtype, device: torch.device) -> LoopState:
        time_now = torch.zeros(E, dtype=dtype, device=device)
        return cls(
            time_now=time_now,
            prev_time=time_now.clone(),
            prev_loss=None,
            loss0=None,
            alive=torch.ones(E, dtype=torch.bool, device=device),
            crossing=torch.full((E, len(CROSSING_FRACTIONS)), math.nan, dtype=dtype, device=device),
            final_step=torch.full((E,), steps, dtype=torch.int64, device=device),
            step=torch.zeros((), dtype=torch.int64, device=device),
            eta=torch.zeros(E, dtype=dtype, device=device),
        )

    @classmethod
    def resumed(cls, resume: dict, device: torch.device) -> LoopState:
        """From a checkpoint, wherever its tensors were loaded: moved to ``device``."""
        saved = {key: resume[key].to(device) for key in cls.SAVED}
        return cls(
            **saved,
            step=torch.tensor(resume["k"], dtype=torch.int64, device=device),
            eta=torch.zeros_like(saved["time_now"]),
        )

    def state(self) -> dict[str, Tensor]:
        """The saved tensors, copied to the host (a checkpoint outlives these buffers)."""
        return {key: getattr(self, key).to("cpu", copy=True) for key in self.SAVED}

    def begin(self, loss: Tensor, divergence_factor: float) -> None:
        """Step 0's loss: the initial loss and the previous step's."""
        self.loss0 = loss.clone()
        self.prev_loss = loss.clone()
        self.prev_time.copy_(self.time_now)
        self.derive(divergence_factor)

    def derive(self, divergence_factor: float) -> None:
        fracs = torch.tensor(CROSSING_FRACTIONS, dtype=self.loss0.dtype, device=self.loss0.device)
        self.target = fracs * self.loss0.unsqueeze(1)
        self.limit = divergence_factor * self.loss0

    def check(self, loss: Tensor, k: int | Tensor) -> None:
        """Events and divergence at step ``k`` (an int, or a tensor: see ``step``), in place.

        Events: the first crossing of frac·L0, linearly interpolated in t. Divergence: a
        loss that is not finite or exceeds the limit stops the member at k."""
        hit = torch.lt(loss.unsqueeze(1), self.target)
        hit.logical_and_(self.crossing.isnan()).logical_and_(self.alive.unsqueeze(1))
        w = self.prev_loss.unsqueeze(1) - self.target
        w.div_((self.prev_loss - loss).unsqueeze(1)).clamp_(0, 1).nan_to_num_(1.0)
        w.mul_((self.time_now - self.prev_time).unsqueeze(1)).add_(self.prev_time.unsqueeze(1))
        torch.where(hit, w, self.crossing, out=self.crossing)
        bad = torch.isfinite(loss).logical_not_()
        bad.logical_or_(loss > self.limit).logical_and_(self.alive)
        if isinstance(k, Tensor):
            torch.where(bad, k, self.final_step, out=self.final_step)
        else:
            self.final_step.masked_fill_(bad, k)
        self.alive.logical_and_(bad.logical_not_())

    def advance(self, loss: Tensor, eta: Tensor) -> None:
        """Step k's loss and time become the previous ones; the clock moves by η (E,)."""
        self.prev_loss.copy_(loss)
        self.prev_time.copy_(self.time_now)
        self.time_now.add_(eta)

    def final(self) -> dict[str, np.ndarray]:
        """What the ``runs`` rows read of the state once the loop has ended, on the host:
        ``alive`` (E,), ``final_step`` (E,), ``loss0`` (E,) and ``crossing`` (E, F) in
        float64."""
        return {
            "alive": self.alive.cpu().numpy(),
            "final_step": self.final_step.cpu().numpy(),
            "loss0": self.loss0.cpu().numpy().astype(np.float64),
            "crossing": self.crossing.cpu().numpy().astype(np.float64),
        }
