"""docs/seeding.md, followed step by step with plain hashlib and torch, reproduces a run's
data and initial weights bit for bit (nothing from phasesweep's seeding or datasets)."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import validate_spec
from phasesweep.pipeline.train._trainer import ChunkTrainer

F64 = torch.float64


def gen_for(seed: int, purpose: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=F64)


def haar(gen, m):
    q, r = torch.linalg.qr(randn(gen, m, m))
    return q * torch.sign(torch.diagonal(r))


def _trainer(model: dict, data: dict, seeds: list[int]) -> ChunkTrainer:
    spec = validate_spec(
        {
            "name": "seeding",
            "model": model,
            "data": data,
            "train": {"steps": 1, "log_points": 2},
            "metrics": {"probe_size": 4},
            "grid": {"seed": seeds},
        }
    )
    (chunk,) = make_chunks(expand(spec), spec)
    return ChunkTrainer(chunk)


@pytest.mark.parametrize("param", ["standard", "ntk"])
def test_teacher_data_with_label_noise_and_gaussian_init(param):
    d, k, n, n_test, tw, width, depth, g = 5, 2, 12, 7, 3, 6, 3, 0.7
    seeds = [0, 11]
    tr = _trainer(
        {"depth": depth, "width": width, "parameterization": param, "init_scale": g},
        {
            "kind": "teacher",
            "input_dim": d,
            "output_dim": k,
            "n_train": n,
            "n_test": n_test,
            "teacher_width": tw,
            "label_noise": 0.1,
        },
        seeds,
    )
    for e, seed in enumerate(seeds):
        # data: data.seed is null, so the data seed is train.seed
        gd = gen_for(seed, "data")
        w1 = randn(gd, tw, d) / math.sqrt(d)
        w2 = randn(gd, k, tw) / math.sqrt(tw)
        x_tr, x_te = randn(gd, n, d), randn(gd, n_test, d)
        y_tr = torch.relu(x_tr @ w1.T) @ w2.T
        y_te = torch.relu(x_te @ w1.T) @ w2.T
        y_tr = y_tr + 0.1 * randn(gen_for(seed, "label_noise"), n, k)
        b = tr.batch
        assert torch.equal(b.x_train[e], x_tr) and torch.equal(b.x_test[e], x_te)
        assert torch.equal(b.y_train[e], y_tr) and torch.equal(b.y_test[e], y_te)
        # init: gaussian, fan_in: g times 1/sqrt(fan_in) (standard) or 1 (ntk)
        gi = gen_for(seed, "init")
        dims = [d] + [width] * (depth - 1) + [k]
        for l in range(1, depth + 1):
            w = randn(gi, dims[l], dims[l - 1])
            std = 1 / math.sqrt(dims[l - 1]) if param == "standard" else 1.0
            w *= g * std
            assert torch.equal(tr.params0.weights[l - 1][e], w)


def test_data_seed_linear_teacher_and_balanced_full_init():
    d, k, width, g = 4, 3, 5, 0.2
    s = [3.0, 1.0]
    tr = _trainer(
        {
            "depth": 2,
            "width": width,
            "activation": "linear",
            "init": "balanced_full",
            "init_scale": g,
        },
        {
            "kind": "teacher",
            "input_dim": d,
            "output_dim": k,
            "n_train": 6,
            "n_test": 4,
            "teacher_singular_values": s,
            "seed": 42,
        },
        [3],
    )
    gd = gen_for(42, "data")  # data.seed set: it replaces train.seed for the data
    u, v = haar(gd, k), haar(gd, d)
    w_star = (u[:, :2] * torch.tensor(s, dtype=F64)) @ v[:, :2].T
    x_tr, x_te = randn(gd, 6, d), randn(gd, 4, d)
    assert torch.equal(tr.batch.x_train[0], x_tr)
    assert torch.equal(tr.batch.y_train[0], x_tr @ w_star.T)
    assert torch.equal(tr.batch.y_test[0], x_te @ w_star.T)
    gi = gen_for(3, "init")
    dims = [d, width, k]
    r = min(dims)
    frames = [haar(gi, m)[:, :r] for m in dims]
    for l in (1, 2):
        w = (frames[l] * (g / math.sqrt(r))) @ frames[l - 1].T
        assert torch.equal(tr.params0.weights[l - 1][0], w)
