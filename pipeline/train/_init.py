"""Initialization schemes for ensembles.

Each member is drawn from its own generator (seeded from its ``train.seed``), so
its initial weights do not depend on the chunk it was packed into. A chunk draws once
per seed and gathers and scales the draws per member on its device
(:func:`init_ensemble`), before training.

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
from collections.abc import Callable, Sequence

import numpy as np
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


def _scaled(
    net: EnsembleMLP,
    cfg: ModelConfig,
    draws: list[torch.Tensor],
    per_model: Callable[[Callable[[ModelConfig], float]], torch.Tensor],
    norms: list[torch.Tensor],
) -> list[torch.Tensor]:
    """The initial weights of members from their gathered :func:`_draws` (left unchanged),
    each (E, fan_out, fan_in) (``balanced_full``: the frames, (E, n_l, r)).
    ``per_model(f)``: f of each member's model config, (E, 1, 1) float64; ``norms``: each
    layer's ‖draw‖_F per member (E, 1, 1), for ``frobenius``. The same float64 products,
    factor by factor, as one member's own weights (``balanced_full``: a matmul per member)."""
    g = per_model(lambda m: m.init_scale)
    if cfg.init in ("balanced", "balanced_rank_one", "file"):
        return [w * g for w in draws]
    if cfg.init == "balanced_full":
        sigma = per_model(lambda m: m.init_scale / math.sqrt(min(net.dims)))
        # one matmul per member on U_{l−1}ᵀ laid out row-major as the frame's transpose is
        # (QR's frames are column-major): a batched matmul, or another layout, may sum in
        # another order than the member alone, and the init is the member's in any chunk
        return [
            torch.stack([a @ bt for a, bt in zip(draws[l] * sigma, draws[l - 1].mT.contiguous())])
            for l in range(1, len(draws))
        ]
    if cfg.init_norm == "fan_in":
        return [
            w * per_model(lambda m, l=l: m.init_scale * net.base_std(l))
            for l, w in enumerate(draws, start=1)
        ]
    if cfg.init_norm == "entry_std":
        return [w * g for w in draws]
    return [w * (n.reciprocal() * g) for w, n in zip(draws, norms)]  # torch's g / ‖w‖


def init_params(
    net: EnsembleMLP,
    configs: Sequence[ModelConfig],
    seeds: Sequence[int],
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> Params:
    """Initial parameters of an ensemble: member e uses ``configs[e]`` and ``seeds[e]``
    (:func:`init_ensemble` of the distinct configs, told apart by identity)."""
    slots: dict[int, int] = {}
    distinct: list[ModelConfig] = []
    for c in configs:
        if slots.setdefault(id(c), len(distinct)) == len(distinct):
            distinct.append(c)
    index = np.array([slots[id(c)] for c in configs], dtype=np.int64)
    return init_ensemble(net, distinct, index, np.asarray(seeds, dtype=np.int64), dtype, device)


def init_ensemble(
    net: EnsembleMLP,
    models: Sequence[ModelConfig],
    model_index: np.ndarray,
    seeds: np.ndarray,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> Params:
    """Initial parameters of an ensemble, column-wise: member e uses
    ``models[model_index[e]]`` and ``seeds[e]`` (both (E,)).

    One draw per distinct seed, in float64 on the CPU (identical on every device: the draw
    of the seed's first member's config; the members of a chunk share every model field
    but the member fields, and none of those changes what is drawn); the draws move to
    ``device`` once, are gathered per member there and scaled by its init scale and layer
    scales, bit for bit as if each member drew its own, then cast to ``dtype``.
    """
    unique, first, inverse = np.unique(seeds, return_index=True, return_inverse=True)
    owners = [models[i] for i in model_index[first].tolist()]
    per_seed = [_draws(net, c, int(s)) for c, s in zip(owners, unique.tolist())]
    layers = len(per_seed[0]) if per_seed else net.depth
    gather = torch.from_numpy(inverse.reshape(-1)).to(device)
    on_device = lambda host: host.to(device).index_select(0, gather)  # noqa: E731 - per member
    draws = [on_device(torch.stack([d[l] for d in per_seed])) for l in range(layers)]
    by_model = torch.from_numpy(model_index).to(device)

    def per_model(f: Callable[[ModelConfig], float]) -> torch.Tensor:
        values = torch.tensor([f(m) for m in models], dtype=torch.float64)
        return values.to(device).index_select(0, by_model).view(-1, 1, 1)

    norms = []
    if models[0].init_norm == "frobenius":  # each draw's own norm, as one member takes it
        norms = [
            on_device(torch.stack([d[l].norm() for d in per_seed])).view(-1, 1, 1)
            for l in range(layers)
        ]
    weights = _scaled(net, models[0], draws, per_model, norms)
    if any(m.layer_scales is not None for m in models):
        weights = [
            w * per_model(lambda m, l=l: 1.0 if m.layer_scales is None else m.layer_scales[l])
            for l, w in enumerate(weights)
        ]
    weights = [w.to(dtype=dtype) for w in weights]
    biases = None
    if net.config.bias:
        biases = [torch.zeros(len(seeds), n, dtype=dtype, device=device) for n in net.dims[1:]]
    return Params(weights, biases)
