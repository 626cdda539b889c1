"""Metrics recorded at logged steps, batched over the ensemble.

:class:`MetricRecorder` is built once per chunk with the initial parameters and
the data; at each logged step the trainer calls :meth:`~MetricRecorder.trajectory`
and :meth:`~MetricRecorder.layers`. Each returns tensors with the ensemble axis
first; the keys are column names of ``storage.schema.TRAJECTORIES`` and
``LAYERS``. A column a recorder does not return is stored as NULL.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.datasets import DataBatch
from pipeline.models import EnsembleMLP, Params
from pipeline.spec import MetricsConfig


def _flat_sq(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], -1).square().sum(1)


class MetricRecorder:
    """Metrics of one chunk relative to its initial parameters ``params0``."""

    def __init__(
        self, net: EnsembleMLP, params0: Params, batch: DataBatch, cfg: MetricsConfig
    ) -> None:
        self.net, self.batch, self.cfg = net, batch, cfg
        self.params0 = params0.clone()
        self.norm0 = self.params0.sq_norm().sqrt()
        self.w0_fro = [_flat_sq(w).sqrt() for w in self.params0.weights]

    def trajectory(self, params: Params, grads: Params) -> dict[str, Tensor]:
        """Per-member scalars, each (E,)."""
        diff_sq = sum(_flat_sq(p - p0) for p, p0 in zip(params.tensors(), self.params0.tensors()))
        return {
            "param_rel_change": diff_sq.sqrt() / self.norm0,
            "param_norm": params.sq_norm().sqrt(),
            "grad_norm": grads.sq_norm().sqrt(),
        }

    def layers(self, params: Params) -> dict[str, Tensor]:
        """Per-member, per-layer values: (E, depth) scalars."""
        fro = torch.stack([_flat_sq(w).sqrt() for w in params.weights], 1)
        delta = torch.stack(
            [_flat_sq(w - w0).sqrt() for w, w0 in zip(params.weights, self.params0.weights)], 1
        )
        return {"fro_norm": fro, "rel_change": delta / torch.stack(self.w0_fro, 1)}
