"""The analysis on curves of the real trainer: the drops the theory predicts (slow).

- XOR-like data of seeds/004 (``layout: paper``) on a bias-free two-layer ReLU net
  from small init: four drops, one per point, largest radius first; the plateaus
  sit at ``(1/(2n)) Σ y²`` over the points not yet learnt: 1/2, 3/8, 1/4, 1/8
  (levels are geometric means over the plateau: the long last one reads ~15 % low).
- A linear teacher with singular values 4, 1, 1/4 on two- and three-layer linear
  nets from small init: three drops, at the saddle levels ½ Σ_{j≥i} s_j² (≈ 8.5,
  0.53, 0.03 for whitened inputs; the finite sample moves them a little).
- A wide ReLU net at large init in the NTK parameterization: lazy, no plateau.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def _train(raw):
    from phasesweep.pipeline.grid import expand, make_chunks
    from phasesweep.pipeline.spec import validate_spec
    from phasesweep.pipeline.train._trainer import train_chunk

    spec = validate_spec(raw)
    (chunk,) = make_chunks(expand(spec), spec)
    tables = train_chunk(chunk)
    return tables["runs"].to_pandas(), tables["trajectories"].to_pandas()


def _analyze(runs, traj):
    from phasesweep.analysis._analyze import analyze_frames

    out = analyze_frames(runs, traj)
    return out["summaries"].to_pandas(), out["plateaus"].to_pandas()


def test_xor_bias_free_relu_four_plateaus():
    runs, traj = _train(
        {
            "name": "xor",
            "model": {
                "depth": 2,
                "width": 60,
                "activation": "relu",
                "bias": False,
                "parameterization": "standard",
                "init_norm": "entry_std",
                "init_scale": 1e-6,
            },
            "data": {"kind": "xor", "layout": "paper", "n_train": 4, "n_test": 4, "input_dim": 2},
            "train": {"lr": 0.05, "steps": 3000, "log_points": 100},
            "metrics": {"probe_size": 4, "ntk": False},
            "grid": {"seed": [0, 1]},
        }
    )
    summ, plat = _analyze(runs, traj)
    assert (summ["n_plateaus"] == 4).all(), summ
    for _, g in plat.groupby("run_id"):
        assert list(g["level"]) == pytest.approx([0.5, 0.375, 0.25, 0.125], rel=0.2)
    assert summ["regime"].isin(["rich"]).all()


@pytest.mark.parametrize("depth,scale,steps", [(2, 1e-3, 2000), (3, 1e-2, 3000)])
def test_linear_teacher_three_singular_values_three_plateaus(depth, scale, steps):
    runs, traj = _train(
        {
            "name": "lin",
            "model": {
                "depth": depth,
                "width": 16,
                "activation": "linear",
                "bias": False,
                "parameterization": "standard",
                "init_norm": "entry_std",
                "init_scale": scale,
            },
            "data": {
                "kind": "teacher",
                "n_train": 256,
                "n_test": 16,
                "input_dim": 4,
                "output_dim": 4,
                "teacher_singular_values": [4.0, 1.0, 0.25],
            },
            "train": {"lr": 0.05, "steps": steps, "log_points": 100},
            "metrics": {"probe_size": 4, "ntk": False},
            "grid": {"seed": [0]},
        }
    )
    summ, plat = _analyze(runs, traj)
    assert summ["n_plateaus"].tolist() == [3]
    levels = plat["level"].tolist()
    assert levels == sorted(levels, reverse=True)
    assert levels == pytest.approx([8.53, 0.53, 0.031], rel=0.25)
    assert summ["escape_time"].notna().all()


def test_wide_relu_large_init_is_lazy_without_plateau():
    runs, traj = _train(
        {
            "name": "lazy",
            "model": {
                "depth": 2,
                "width": 1024,
                "activation": "relu",
                "bias": False,
                "parameterization": "ntk",
                "init_scale": 1.0,
                "init": "antisymmetric",
            },
            "data": {"kind": "teacher", "n_train": 32, "n_test": 32, "input_dim": 5},
            "train": {"lr": 0.5, "steps": 1000, "log_points": 60},
            "metrics": {"probe_size": 16},
            "grid": {"seed": [0]},
        }
    )
    summ, plat = _analyze(runs, traj)
    assert summ["regime"].tolist() == ["lazy"]
    assert summ["n_plateaus"].tolist() == [0] and plat.empty
