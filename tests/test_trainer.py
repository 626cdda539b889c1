"""The vectorized ensemble trainer against each point trained alone and a plain PyTorch loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from phasesweep.pipeline.data._datasets import data_seed, make_dataset
from phasesweep.pipeline.data._seeding import permutations
from phasesweep.pipeline.grid import Chunk, expand, make_chunks
from phasesweep.pipeline.spec import validate_spec
from phasesweep.pipeline.train._init import init_params
from phasesweep.pipeline.train._models import EnsembleMLP
from phasesweep.pipeline.train._trainer import configure_tf32, train_chunk
from phasesweep.storage.schema import log_steps

FLOAT_COLS = {
    "trajectories": [
        "time",
        "train_loss",
        "test_loss",
        "param_rel_change",
        "grad_norm",
        "param_norm",
    ],
    "layers": ["fro_norm", "rel_change"],
    "runs": ["final_train_loss", "final_test_loss", "initial_train_loss", "final_time"],
}


def _spec(**sections):
    base = {
        "name": "t",
        "model": {"depth": 3, "width": 12, "activation": "relu", "bias": True},
        "data": {
            "kind": "subspace",
            "n_train": 16,
            "n_test": 20,
            "input_dim": 5,
            "subspace_dim": 2,
        },
        "train": {"steps": 60, "lr": 0.1, "log_points": 12},
        "metrics": {"probe_size": 8},
    }
    for key, value in sections.items():
        if key == "grid":
            base["grid"] = value
        else:
            base.setdefault(key, {}).update(value)
    return validate_spec(base)


def _sorted(table, name):
    keys = {
        "runs": ["run_id"],
        "trajectories": ["run_id", "step"],
        "layers": ["run_id", "step", "layer"],
    }[name]
    return table.to_pandas().sort_values(keys).reset_index(drop=True)


def _assert_same(together, alone, rtol=1e-10):
    for name, cols in FLOAT_COLS.items():
        a, b = _sorted(together[name], name), _sorted(alone[name], name)
        assert len(a) == len(b) and list(a.run_id) == list(b.run_id), name
        for c in cols:
            np.testing.assert_allclose(
                a[c].to_numpy(float),
                b[c].to_numpy(float),
                rtol=rtol,
                atol=1e-300,
                err_msg=f"{name}.{c}",
            )


def _concat(results):
    import pyarrow as pa

    return {k: pa.concat_tables([r[k] for r in results]) for k in results[0]}


@pytest.mark.parametrize("optimizer", ["gd", "sgd"])
def test_ensemble_equals_each_point_alone(optimizer):
    train = {"optimizer": optimizer, "batch_size": 4} if optimizer == "sgd" else {}
    spec = _spec(
        train=train,
        grid={
            "init_scale": [0.3, 1.0, 2.0],
            "lr": [0.05, 0.2],
            "seed": [0, 1],
            "noise_sigma": [0.0, 0.1],
        },
    )
    points = expand(spec)
    chunks = make_chunks(points, spec)
    assert len(chunks) == 1 and len(chunks[0].points) == 24
    together = train_chunk(chunks[0])
    alone = _concat([train_chunk(Chunk(f"c{i}", (p,))) for i, p in enumerate(points)])
    _assert_same(together, alone)
    # the members really differ from each other
    finals = together["runs"].column("final_train_loss").to_numpy()
    assert len(np.unique(np.round(finals, 12))) == len(finals)


def test_matches_plain_pytorch_loop():
    """Full-batch GD of the ensemble = nn.Sequential + torch.optim.SGD on the same init and data."""
    spec = _spec(model={"parameterization": "standard", "activation": "tanh"}, grid={"seed": [3]})
    (point,) = expand(spec)
    cfg = point.config
    tables = train_chunk(Chunk("c", (point,)))
    traj = tables["trajectories"].to_pandas().sort_values("step")

    ds = make_dataset(cfg.data, data_seed(cfg.data, cfg.train.seed))
    net = EnsembleMLP(cfg.model, ds.x_train.shape[1], ds.y_train.shape[1])
    p0 = init_params(net, [cfg.model], [cfg.train.seed])
    layers = []
    for l in range(cfg.model.depth):
        lin = torch.nn.Linear(net.dims[l], net.dims[l + 1], dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(p0.weights[l][0])
            lin.bias.copy_(p0.biases[l][0])
        layers += [lin, torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr)
    losses = []
    for _ in range(cfg.train.steps + 1):
        opt.zero_grad()
        loss = 0.5 * (model(ds.x_train) - ds.y_train).square().sum() / ds.x_train.shape[0]
        losses.append(loss.item())
        loss.backward()
        opt.step()
    steps = traj.step.to_numpy()
    np.testing.assert_allclose(traj.train_loss, np.asarray(losses)[steps], rtol=1e-10)
    np.testing.assert_allclose(traj.time, steps * cfg.train.lr, rtol=1e-12)


def test_divergent_member_is_stopped_and_others_unaffected():
    spec = _spec(grid={"lr": [0.05, 200.0], "seed": [0, 1]})
    points = expand(spec)
    together = train_chunk(make_chunks(points, spec)[0])
    runs = together["runs"].to_pandas().set_index("run_id")
    big = [p.run_id for p in points if p.config.train.lr == 200.0]
    small = [p for p in points if p.config.train.lr == 0.05]
    assert set(runs.loc[big, "status"]) == {"diverged"}
    assert set(runs.loc[[p.run_id for p in small], "status"]) == {"completed"}
    assert runs.loc[big, "final_train_loss"].isna().all()
    assert (runs.loc[big, "final_step"] < spec.train.steps).all()
    # the diverged member's rows stop before it diverged
    traj = together["trajectories"].to_pandas()
    for rid in big:
        assert traj[traj.run_id == rid].step.max() < runs.loc[rid, "final_step"]
        assert np.isfinite(traj[traj.run_id == rid].train_loss).all()
    alone = _concat([train_chunk(Chunk("s", (p,))) for p in small])
    sub = {
        k: v.filter(
            np.isin(v.column("run_id").to_numpy(zero_copy_only=False), [p.run_id for p in small])
        )
        for k, v in together.items()
    }
    _assert_same(sub, alone)


def test_lr_scaling_rule_is_applied_and_stored():
    spec = _spec(
        train={"lr": 0.1, "lr_scaling": {"init_scale_power": -2, "init_scale_floor": 1.0}},
        grid={"init_scale": [0.5, 2.0]},
    )
    runs = (
        train_chunk(make_chunks(expand(spec), spec)[0])["runs"]
        .to_pandas()
        .sort_values("init_scale")
    )
    np.testing.assert_allclose(runs.lr, [0.1, 0.1])
    np.testing.assert_allclose(runs.lr_effective, [0.1, 0.1 / 4])  # floor 1: only g > 1 is scaled
    np.testing.assert_allclose(runs.final_time, runs.lr_effective * spec.train.steps)


def test_log_steps_are_log_spaced_with_ends():
    s = log_steps(5000, 100)
    assert s[0] == 0 and s[-1] == 5000 and np.all(np.diff(s) > 0)
    assert 60 <= len(s) <= 100
    ratios = s[2:] / s[1:-1]
    assert ratios.max() < 1.5 * ratios[-10:].mean() + 1.0  # geometric, not linear, spacing


def test_permutations_are_per_member_and_without_replacement():
    seeds = torch.tensor([5, 7, 5], dtype=torch.int64)
    perm = permutations(seeds, epoch=3, n=50)
    for row in perm:
        assert sorted(row.tolist()) == list(range(50))
    assert torch.equal(perm[0], perm[2]) and not torch.equal(perm[0], perm[1])
    assert not torch.equal(perm[0], permutations(seeds, epoch=4, n=50)[0])
    alone = permutations(seeds[1:2], epoch=3, n=50)
    assert torch.equal(alone[0], perm[1])


def test_singular_value_lists_hold_only_existing_values():
    spec = validate_spec(
        {
            "name": "t",
            "model": {"depth": 2, "width": 3},
            "data": {"n_train": 6, "n_test": 6, "input_dim": 2},
            "train": {"steps": 10, "log_points": 4},
            "metrics": {"top_k": 5, "probe_size": 4},
        }
    )
    layers = train_chunk(make_chunks(expand(spec), spec)[0])["layers"].to_pandas()
    lengths = layers.groupby("layer").top_sv.apply(lambda s: {len(v) for v in s if v is not None})
    assert lengths.to_dict() == {1: {2}, 2: {1}}  # min(fan_out, fan_in) values, no NaN padding
    assert all(np.all(np.diff(v) <= 0) for v in layers.top_sv if v is not None)


def test_tf32_follows_the_spec_on_cuda_and_is_untouched_on_cpu():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        configure_tf32(torch.device("cuda"), True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        configure_tf32(torch.device("cuda"), False)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        configure_tf32(torch.device("cpu"), False)
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _Stop(Exception):
    pass


@pytest.mark.parametrize("optimizer", ["gd", "sgd"])
def test_resume_from_a_snapshot_equals_an_uninterrupted_run(optimizer):
    """Stopped mid-chunk (mid-epoch for SGD, with a member diverged before the stop), the
    serialized state resumed in a fresh trainer gives the uninterrupted run's tables."""
    import io

    train = {"optimizer": optimizer, "batch_size": 4} if optimizer == "sgd" else {}
    spec = _spec(train={**train, "steps": 90}, grid={"lr": [0.05, 0.2, 200.0], "seed": [0, 1]})
    chunk = make_chunks(expand(spec), spec)[0]
    whole = train_chunk(chunk)
    seen = []

    def stop_at_48(k, state):
        seen.append(k)
        if k == 48:
            buf = io.BytesIO()
            torch.save(state(), buf)
            seen.append(buf.getvalue())
            raise _Stop

    with pytest.raises(_Stop):
        train_chunk(chunk, hook=stop_at_48)
    assert seen[:3] == [16, 32, 48]
    later = []
    snapshot = torch.load(io.BytesIO(seen[-1]), weights_only=True)
    resumed = train_chunk(chunk, hook=lambda k, state: later.append(k), resume=snapshot)
    assert later == [64, 80]  # it went on from step 48
    assert set(resumed["runs"].column("status").to_pylist()) == {"completed", "diverged"}
    for name in ("trajectories", "layers"):
        assert _sorted(resumed[name], name).equals(_sorted(whole[name], name)), name
    drop = ["wall_seconds", "chunk_wall_seconds", "finished_at"]
    assert (
        _sorted(resumed["runs"], "runs")
        .drop(columns=drop)
        .equals(_sorted(whole["runs"], "runs").drop(columns=drop))
    )
