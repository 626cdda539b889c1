"""Learning-rate rules: the stored time is t = Σ η_k for every schedule, norm-adaptive η never
exceeds η_max and equals min(η_max, c‖θ‖^(2−L)), and lr_scaling follows its formula.

Each registered schedule (:data:`pipeline.train._optim.SCHEDULES`) is checked on its own
too: its per-step η_k against the closed form written here, on both step clocks (a Python
int, and a device tensor as a captured step reads it), and the final time the horizon
reports against Σ_k η_k of the same object."""

from __future__ import annotations

import math
from typing import get_args

import numpy as np
import pandas as pd
import pytest
import torch
from phasesweep.pipeline.grid import expand, make_chunks, member_lr
from phasesweep.pipeline.grid._horizon import final_time
from phasesweep.pipeline.spec import TrainConfig, validate_spec
from phasesweep.pipeline.train._models import Params
from phasesweep.pipeline.train._optim import OPTIMIZERS, SCHEDULES
from phasesweep.pipeline.train._trainer import train_chunk


def _run(model: dict, train: dict, grid: dict | None = None):
    spec = validate_spec(
        {
            "name": "lr",
            "model": {"width": 16, **model},
            "data": {"kind": "teacher", "n_train": 16, "n_test": 8, "input_dim": 5},
            "train": {"log_points": 10_000, **train},  # every step logged
            "metrics": {"probe_size": 4, "ntk": False},
            "grid": grid or {},
        }
    )
    points = expand(spec)
    out = {"runs": [], "trajectories": []}
    for chunk in make_chunks(points, spec):
        tables = train_chunk(chunk)
        for k in out:
            out[k].append(tables[k].to_pandas())
    runs = pd.concat(out["runs"], ignore_index=True)
    traj = pd.concat(out["trajectories"], ignore_index=True)
    return points, runs, traj.sort_values(["run_id", "step"])


def _per_run(traj, run_id, col):
    return traj[traj.run_id == run_id][col].to_numpy(float)


def test_constant_time_is_steps_times_lr():
    points, runs, traj = _run({"depth": 2}, {"lr": 0.03, "steps": 50}, {"seed": [0, 1]})
    for p in points:
        t = _per_run(traj, p.run_id, "time")
        steps = traj[traj.run_id == p.run_id].step.to_numpy()
        np.testing.assert_allclose(t, 0.03 * steps, rtol=1e-13, atol=0)


@pytest.mark.parametrize("min_frac", [0.0, 0.1])
def test_cosine_time_is_the_sum_of_the_schedule(min_frac):
    steps, lr = 40, 0.05
    points, _, traj = _run(
        {"depth": 2}, {"lr": lr, "steps": steps, "lr_schedule": "cosine", "lr_min_frac": min_frac}
    )
    k = np.arange(steps)
    eta = lr * (min_frac + (1 - min_frac) * 0.5 * (1 + np.cos(np.pi * k / steps)))
    want = np.concatenate([[0.0], np.cumsum(eta)])
    (p,) = points
    assert len(_per_run(traj, p.run_id, "time")) == steps + 1
    np.testing.assert_allclose(_per_run(traj, p.run_id, "time"), want, rtol=1e-12, atol=1e-15)
    # the schedule ends at lr·min_frac and starts at lr
    dt = np.diff(_per_run(traj, p.run_id, "time"))
    assert dt[0] == pytest.approx(lr) and dt[-1] == pytest.approx(eta[-1])


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_norm_adaptive_time_and_cap(depth):
    lr_max, c = 0.5, 0.2
    points, runs, traj = _run(
        {"depth": depth, "activation": "relu"},
        {"lr": lr_max, "lr_c": c, "steps": 60, "lr_schedule": "norm_adaptive"},
        # small inits: the cap binds (c‖θ‖^(2-L) is large); large inits: the adaptive branch
        {"init_scale": [0.003, 0.01, 0.3, 2.0], "seed": [0]},
    )
    capped = adaptive = 0
    for p in points:
        t = _per_run(traj, p.run_id, "time")
        norm = _per_run(traj, p.run_id, "param_norm")
        dt = np.diff(t)
        want = np.minimum(lr_max, c * norm[:-1] ** (2 - depth))
        np.testing.assert_allclose(dt, want, rtol=1e-12, atol=0)
        assert (dt <= lr_max * (1 + 1e-15)).all()  # never above η_max
        capped += int(np.sum(want == lr_max))
        adaptive += int(np.sum(want < lr_max))
        assert t[0] == 0.0
    if depth > 2:  # both branches were exercised
        assert capped > 0 and adaptive > 0
    else:  # depth 2: η = min(η_max, c), constant
        assert adaptive > 0 and capped == 0


def test_norm_adaptive_layer_rms_uses_the_rms_layer_norm():
    depth, lr_max, c = 4, 10.0, 0.3
    points, _, traj = _run(
        {"depth": depth},
        {
            "lr": lr_max,
            "lr_c": c,
            "steps": 30,
            "lr_schedule": "norm_adaptive",
            "lr_norm": "layer_rms",
        },
        {"init_scale": [0.01, 0.5]},
    )
    for p in points:
        norm = _per_run(traj, p.run_id, "param_norm")
        dt = np.diff(_per_run(traj, p.run_id, "time"))
        want = np.minimum(lr_max, c * (norm[:-1] / math.sqrt(depth)) ** (2 - depth))
        np.testing.assert_allclose(dt, want, rtol=1e-12, atol=0)
        assert (dt <= lr_max).all()


def test_lr_scaling_rule():
    points, runs, traj = _run(
        {"depth": 3, "init": "antisymmetric"},
        {
            "lr": 0.01,
            "steps": 5,
            "lr_scaling": {
                "init_scale_power": 1.0,
                "init_scale_depth_power": -2.0,
                "init_scale_floor": 1.0,
                "width_power": -0.5,
            },
        },
        {"init_scale": [0.1, 1.0, 2.0, 4.0], "width": [16, 64]},
    )
    for p in points:
        g, m = p.config.model.init_scale, p.config.model.width
        want = 0.01 * max(g, 1.0) ** (1.0 - 2.0 * 2) / math.sqrt(m)
        assert member_lr(p.config) == pytest.approx(want, rel=1e-14)
        dt = np.diff(_per_run(traj, p.run_id, "time"))
        np.testing.assert_allclose(dt, want, rtol=1e-13)


def test_the_spec_names_every_registered_optimizer_and_schedule():
    fields = TrainConfig.model_fields
    assert set(get_args(fields["optimizer"].annotation)) == set(OPTIMIZERS)
    assert set(get_args(fields["lr_schedule"].annotation)) == set(SCHEDULES)


#: η_k of every schedule, written out: (lr (E,), train, depth, ‖θ‖ (E,), k) -> (E,)
CLOSED_FORMS = {
    "constant": lambda lr, t, depth, norm, k: lr,
    "cosine": lambda lr, t, depth, norm, k: (
        lr * (t.lr_min_frac + (1 - t.lr_min_frac) * 0.5 * (1 + np.cos(np.pi * k / t.steps)))
    ),
    "norm_adaptive": lambda lr, t, depth, norm, k: np.minimum(lr, t.lr_c * norm ** (2 - depth)),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_a_schedules_eta_is_its_closed_form_and_sums_to_the_horizons_final_time(name):
    assert set(CLOSED_FORMS) == set(SCHEDULES)  # a new schedule gets its closed form here
    spec = validate_spec(
        {
            "name": "lr",
            "model": {"depth": 3, "width": 4},
            "data": {"kind": "teacher", "n_train": 8, "n_test": 4, "input_dim": 3},
            "train": {"steps": 37, "lr_schedule": name, "lr_min_frac": 0.1, "lr_c": 0.4},
            "grid": {"lr": [0.05, 0.3], "init_scale": [0.5, 2.0]},
        }
    )
    points = expand(spec)
    configs = [p.config for p in points]
    train, depth = configs[0].train, 3
    lr = np.array([member_lr(c) for c in configs])
    schedule = SCHEDULES[name](torch.tensor(lr, dtype=torch.float64), train, depth)
    # θ: one weight matrix of norm 0.5 · (member + 1) per member
    norm = 0.5 * np.arange(1, len(configs) + 1)
    weights = torch.tensor(norm, dtype=torch.float64).view(-1, 1, 1).expand(-1, 2, 2) / 2
    params = Params([weights.contiguous()], None)
    etas = []
    for k in range(train.steps):
        eta = schedule(k, params)
        on_device = schedule(torch.tensor(k), params)  # the captured step's clock
        torch.testing.assert_close(eta, on_device, rtol=0, atol=0)
        want = CLOSED_FORMS[name](lr, train, depth, norm, k) * np.ones(len(configs))
        np.testing.assert_allclose(eta.numpy() * np.ones(len(configs)), want, rtol=1e-14)
        etas.append(want)
    total = np.sum(etas, axis=0)
    reach = np.array([final_time(c) for c in configs])
    if name == "norm_adaptive":  # η_k ≤ η: the horizon bounds the time
        assert (total <= reach * (1 + 1e-14)).all() and (total < reach).any()
    else:
        np.testing.assert_allclose(reach, total, rtol=1e-13)
