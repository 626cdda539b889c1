"""Initialization schemes for ensembles.

Each member is drawn from its own generator (seeded from its ``train.seed``), so
its initial weights do not depend on the chunk it was packed into. The loop
over members runs once per chunk, before training.

Schemes (``model.init``):

- ``gaussian``: i.i.d. normal entries; ``init_norm`` says what ``init_scale`` g
  sets: ``fan_in`` — std = g · the parameterization's own std; ``entry_std`` —
  std = g; ``frobenius`` — each layer rescaled to ‖W_l(0)‖_F = g.
- ``balanced`` (alias ``balanced_rank_one``): aligned rank one, W_l = g · u_l u_{l−1}ᵀ
  with random unit vectors u, so W_{l+1}ᵀW_{l+1} = W_l W_lᵀ exactly and ‖W_l‖_F = g
  (``init_norm`` is not used: balance needs equal layer norms). On a deep linear
  net only one mode of the target is seeded; the others start at round-off.
- ``balanced_full``: the small balanced init of the deep-linear literature (Saxe et
  al.; Arora et al.) with full rank r = min(dims): W_l = U_l Σ U_{l−1}ᵀ, U_l
  (n_l × r) with orthonormal columns (Haar, the first r columns of a random
  orthogonal matrix), shared by the two layers that meet at n_l, and Σ = (g/√r) I_r.
  Then W_{l+1}ᵀW_{l+1} = U_l Σ² U_lᵀ = W_l W_lᵀ, every layer has r singular values
  g/√r and ‖W_l‖_F = g (``init_norm`` not used). The rank is limited by the
  narrowest layer: one output makes any balanced init rank one. Where input and
  output dims both equal r, the end-to-end map is square and balanced flow keeps the
  sign of its determinant: if it differs from the target's, one mode stays at 0 (a
  saddle); give the input (or output) more dimensions than r to avoid that.
- ``antisymmetric``: gaussian, then the second half of the last hidden layer
  copies the first half and the output layer sees the two halves with opposite
  signs, so the output is 0 at init (the doubling trick). It is 0 in exact
  arithmetic; a float matmul sums the ± terms in its own order, so the computed
  output is 0 up to rounding (|f| ≤ m·u·Σ_j |a_j h_j|, u the unit roundoff).
  The mirroring precedes the scaling, so ``frobenius`` still gives ‖W_l‖_F = g.

- ``file``: the researcher's weights from ``init_path``: the
  member's own ``W<l>_seed<s>`` (s its ``train.seed``), else the shared ``W<l>``, times
  g; nothing is drawn.

``layer_scales`` multiplies layer l by its entry afterwards (unbalanced init).
Biases start at zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from phasesweep.pipeline.data._datasets import orthogonal_matrix
from phasesweep.pipeline.data._seeding import generator
from phasesweep.pipeline.data._user_data import load_weights, member_weights
from phasesweep.pipeline.spec import ModelConfig
from phasesweep.pipeline.train._models import EnsembleMLP, Params


def _unit(n: int, gen: torch.Generator) -> torch.Tensor:
    v = torch.randn(n, generator=gen, dtype=torch.float64)
    return v / v.norm()


def _draws(net: EnsembleMLP, cfg: ModelConfig, seed: int) -> list[torch.Tensor]:
    """What a member's initial weights are made of before ``init_scale`` (g) enters: the
    same for every g, so members that differ only in g share them. ``gaussian``,
    ``antisymmetric``: the unscaled layers; ``balanced``: the layers at g = 1 (u_l
    u_{l−1}ᵀ); ``balanced_full``: the frames U_l; ``file``: the file's layers."""
    gen = generator(seed, "init")
    dims = net.dims
    if cfg.init in ("balanced", "balanced_rank_one"):
        units = [_unit(n, gen) for n in dims]
        return [torch.outer(units[l], units[l - 1]) for l in range(1, len(dims))]
    if cfg.init == "file":
        return [
            torch.tensor(w, dtype=torch.float64)
            for w in member_weights(cfg.init_path, load_weights(cfg.init_path)[0], dims, seed)
        ]
    if cfg.init == "balanced_full":
        return [orthogonal_matrix(gen, n)[:, : min(dims)] for n in dims]
    weights = [
        torch.randn(dims[l], dims[l - 1], generator=gen, dtype=torch.float64)
        for l in range(1, len(dims))
    ]
    if cfg.init == "antisymmetric":  # mirror before scaling, so frobenius stays exact
        half = dims[-2] // 2
        weights[-2][half:] = weights[-2][:half]
        weights[-1][:, half:] = -weights[-1][:, :half]
    return weights


def _member_weights(
    net: EnsembleMLP, cfg: ModelConfig, draws: list[torch.Tensor]
) -> list[torch.Tensor]:
    """A member's initial weights from its :func:`_draws` (left unchanged)."""
    g = cfg.init_scale
    if cfg.init in ("balanced", "balanced_rank_one", "file"):
        weights = [g * w for w in draws]
    elif cfg.init == "balanced_full":
        sigma = g / math.sqrt(min(net.dims))
        weights = [(draws[l] * sigma) @ draws[l - 1].T for l in range(1, len(draws))]
    else:
        weights = [w.clone() for w in draws]
        for l, w in enumerate(weights, start=1):
            if cfg.init_norm == "fan_in":
                w *= g * net.base_std(l)
            elif cfg.init_norm == "entry_std":
                w *= g
            else:
                w *= g / w.norm()
    if cfg.layer_scales is not None:
        weights = [w * s for w, s in zip(weights, cfg.layer_scales)]
    return weights


def init_params(
    net: EnsembleMLP,
    configs: Sequence[ModelConfig],
    seeds: Sequence[int],
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> Params:
    """Initial parameters of an ensemble: member e uses ``configs[e]`` and ``seeds[e]``.

    Drawn in float64 on the CPU (identical on every device), then cast and moved; drawn
    once per seed (members that differ in init scale or layer scales scale the same
    draws, bit for bit as if each drew its own).
    """
    draws: dict[int, list[torch.Tensor]] = {}  # seed -> draws: the members of a chunk share
    # every model field but the member fields, and no member field changes what is drawn
    per_member = [
        _member_weights(net, c, draws.get(s) or draws.setdefault(s, _draws(net, c, s)))
        for c, s in zip(configs, seeds)
    ]
    weights = [
        torch.stack([m[l] for m in per_member]).to(device=device, dtype=dtype)
        for l in range(net.depth)
    ]
    biases = None
    if net.config.bias:
        biases = [torch.zeros(len(configs), n, dtype=dtype, device=device) for n in net.dims[1:]]
    return Params(weights, biases)
