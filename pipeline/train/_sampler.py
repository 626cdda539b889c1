"""The minibatches of SGD: per member, without replacement within an epoch, groups kept.

Each member draws its own permutation of the training set's groups per epoch from its SGD
seed (``derive_seed(train.seed, "sgd")``, :mod:`pipeline.data._seeding`), so a member's
minibatches do not depend on the chunk it trains in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from phasesweep.pipeline.data._datasets import DataBatch
from phasesweep.pipeline.data._seeding import derive_seed, permutations
from phasesweep.pipeline.spec import RunConfig
from phasesweep.pipeline.train._models import shares_input
from torch import Tensor


class MinibatchSampler:
    """``sampler(batch, k)``: the (x, y) minibatch of step k of every member from the
    chunk's data ``batch``, x (E, batch_size, d) and y (E, batch_size, output_dim);
    ``batch_size`` rounded down to whole groups of the
    training set (at least one group). An epoch's permutations are drawn at its first
    step taken and kept for its others (a pure function of the seeds and the epoch, so a
    run resumed within an epoch draws the same).

    Members that share their training inputs and SGD seed get one (batch, d) input
    matrix expanded over E (see :func:`pipeline.train._models.shares_input`)."""

    def __init__(self, configs: Sequence[RunConfig], device: torch.device) -> None:
        self.batch_size = configs[0].train.batch_size
        self.E = len(configs)
        self.device = device
        sgd_seeds = [derive_seed(c.train.seed, "sgd") for c in configs]
        self.sgd_seeds = torch.tensor(sgd_seeds, device=device)
        self._perm: Tensor | None = None  # the group permutation of epoch _epoch, (E, groups)
        self._epoch = -1
        self._one_seed = len(set(sgd_seeds)) == 1

    def __call__(self, batch: DataBatch, k: int) -> tuple[Tensor, Tensor]:
        b = batch
        g = b.group_size
        n_groups = b.x_train.shape[1] // g
        per_step = max(self.batch_size // g, 1)
        steps_per_epoch = max(n_groups // per_step, 1)
        epoch, pos = divmod(k, steps_per_epoch)
        if epoch != self._epoch or self._perm is None:
            self._perm = permutations(self.sgd_seeds, epoch, n_groups)
            self._epoch = epoch
        groups = self._perm[:, pos * per_step : (pos + 1) * per_step]
        idx = (groups.unsqueeze(-1) * g + torch.arange(g, device=self.device)).reshape(self.E, -1)
        rows = torch.arange(self.E, device=self.device).unsqueeze(1)
        # members sharing their inputs and their SGD seed share each minibatch's inputs too
        if self._one_seed and shares_input(b.x_train):
            return b.x_train[0, idx[0]].expand(self.E, -1, -1), b.y_train[rows, idx]
        return b.x_train[rows, idx], b.y_train[rows, idx]
