"""Order parameters read at a common gradient-flow time (``analysis.at_time``).

References are closed forms of t evaluated directly, never numbers from phasesweep.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from phasesweep.analysis import _series as ser
from phasesweep.analysis._analyze import analyze_frames
from phasesweep.analysis._calibration import lazy_loss, logged_times
from phasesweep.pipeline.spec import AnalysisConfig, SpecError, validate_spec

U = np.finfo(np.float64).eps / 2


def _frame(curves: dict[str, tuple[np.ndarray, dict[str, np.ndarray]]]) -> pd.DataFrame:
    return pd.concat(
        pd.DataFrame({"run_id": rid, "time": t, **cols}) for rid, (t, cols) in curves.items()
    )


def test_value_at_is_exact_for_a_value_linear_in_log_time():
    # v(t) = 3 + 2 log t on the log-spaced logged times of three learning rates: linear
    # interpolation in log t reproduces it up to round-off; t past a run's end is NaN.
    runs = {"a": 0.01, "b": 0.001, "c": 0.1}
    curves = {}
    for rid, lr in runs.items():
        t = logged_times(lr, 10_000, 60)
        with np.errstate(divide="ignore"):
            v = np.where(t > 0, 3.0 + 2.0 * np.log(t), 0.0)
        curves[rid] = (t, {"v": v})
    s = ser.from_frame(_frame(curves), ["v"], run_ids=np.array(list(runs), dtype=object))
    for t_eval in (0.37, 5.0, 10.0, 77.7):
        got = ser.value_at(s, "v", t_eval)
        ends = np.array([lr * 10_000 for lr in runs.values()])
        reached = ends >= t_eval
        expected = 3.0 + 2.0 * np.log(t_eval)
        # two logs and one interpolation: a few ulps of |v| + |2 log t| each
        bound = 16 * U * (abs(expected) + 2 * 2 * abs(np.log(t_eval)) + 3)
        assert np.all(np.abs(got[reached] - expected) <= bound)
        assert np.isnan(got[~reached]).all()
    # at a run's exact end (lr * steps, accumulated in float) the last value is read
    assert ser.value_at(s, "v", 100.0)[0] == pytest.approx(3 + 2 * np.log(100.0), rel=1e-12)


def test_value_at_first_segment_is_linear_in_time_and_skips_nan_rows():
    t = np.array([0.0, 1.0, 2.0, 4.0])
    v = np.array([1.0, 3.0, np.nan, 7.0])
    s = ser.from_frame(_frame({"r": (t, {"v": v})}), ["v"])
    assert ser.value_at(s, "v", 0.25)[0] == pytest.approx(1.5, rel=1e-15)  # 1 + 2 * 0.25
    # the NaN row at t = 2 is left out: from (1, 3) to (4, 7), linear in log t
    expected = 3 + 4 * np.log(2.0) / np.log(4.0)
    assert ser.value_at(s, "v", 2.0)[0] == pytest.approx(expected, rel=1e-15)
    assert ser.value_at(s, "v", 0.0)[0] == 1.0


def _runs(ids):
    return pd.DataFrame(
        {
            "run_id": ids,
            "status": ["completed"] * len(ids),
            "init_scale": [1.0] * len(ids),
            "width": [16] * len(ids),
            "depth": [2] * len(ids),
            "noise_sigma": [0.0] * len(ids),
            "lr": [0.01, 0.1, 0.002][: len(ids)],
            "seed": [0] * len(ids),
            "activation": ["relu"] * len(ids),
        }
    )


def test_regimes_at_a_common_time_agree_where_final_values_do_not():
    # the same closed-form trajectory in t, logged by runs whose learning rates differ
    # 10x and 50x: they stop at t = 100, 1000 and 20. kernel_distance(t) = 0.04 log(1 + t)
    # grows with t, so final values differ with the end time; at t = 50 they agree.
    ids = ["a", "b", "c"]
    curves = {}
    for rid, lr in zip(ids, [0.01, 0.1, 0.002]):
        t = logged_times(lr, 10_000, 80)
        curves[rid] = (
            t,
            {
                "train_loss": lazy_loss(t, [0.05], [1.0]),
                "test_loss": lazy_loss(t, [0.05], [1.2]),
                "kernel_distance": 0.04 * np.log1p(t),
                "param_rel_change": 0.02 * np.log1p(t),
            },
        )
    traj = _frame(curves)
    for c in ("act_flip_frac", "transversal_grad_sq"):
        traj[c] = np.nan
    cfg = dict(lazy_threshold=0.2, converged_loss_frac=0.1)
    final = analyze_frames(_runs(ids), traj, AnalysisConfig(**cfg))["summaries"].to_pandas()
    # final: a at t = 100 (0.185, lazy), b at t = 1000 (0.276, rich), c at t = 20 (0.122,
    # but its loss ratio e^-2 = 0.135 is above 0.1: not converged)
    assert final["regime"].tolist() == ["lazy", "rich", "not_converged"]
    assert final["eval_time"].to_numpy() == pytest.approx([100, 1000, 20], rel=1e-9)

    at = analyze_frames(_runs(ids), traj, AnalysisConfig(at_time=50.0, **cfg))["summaries"]
    at = at.to_pandas()
    kd50 = 0.04 * np.log1p(50.0)  # 0.157: lazy; loss ratio e^-5
    # log-time interpolation of log(1 + t) between logged points ~6 % apart in t
    assert at.loc[:1, "eval_kernel_distance"].to_numpy() == pytest.approx([kd50] * 2, rel=1e-4)
    assert at.loc[:1, "order_value"].to_numpy() == pytest.approx([kd50] * 2, rel=1e-4)
    assert at.loc[:1, "eval_param_rel_change"].to_numpy() == pytest.approx(
        [0.02 * np.log1p(50.0)] * 2, rel=1e-4
    )
    # the loss e^-0.1t is convex in log t for t > 10 and interpolated in log t between points
    # up to 12 % apart:
    # the chord lies above it, by at most (dt)^2/8 * max L'' = 6 % here
    ratio = at.loc[:1, "eval_loss_ratio"].to_numpy()
    assert np.all((ratio >= np.exp(-5)) & (ratio <= 1.07 * np.exp(-5)))
    assert at["regime"].tolist()[:2] == ["lazy", "lazy"]
    assert at.loc[:1, "eval_time"].tolist() == [50.0, 50.0]
    # run c stopped at t = 20 < 50: nothing is read, no regime (NULL, not a guess)
    c = at.iloc[2]
    assert pd.isna(c["regime"])
    for col in ("eval_time", "eval_kernel_distance", "eval_loss_ratio", "order_value"):
        assert np.isnan(c[col])
    # the final columns keep the last logged values
    assert at["final_kernel_distance"].to_numpy() == pytest.approx(
        final["final_kernel_distance"].to_numpy(), rel=0
    )


@pytest.mark.parametrize("bad", [0, -1.0, "soon"])
def test_at_time_must_be_a_positive_number(bad):
    with pytest.raises(SpecError, match="analysis.at_time"):
        validate_spec({"name": "x", "analysis": {"at_time": bad}})


def test_ready_sweeps_reach_equal_time_across_init_scales():
    # constant-lr sweeps: points that differ only in init scale, width or seed end at the
    # same t = lr_effective * steps (so "final" is an equal-time comparison), and at or
    # past analysis.at_time where it is set
    from phasesweep.pipeline.grid import expand
    from phasesweep.pipeline.spec import load_spec_and_raw
    from phasesweep.pipeline.train._trainer import member_lr
    from sweep_runner import SWEEPS

    checked = 0
    for path in sorted(SWEEPS.glob("*.yaml")):
        spec, _ = load_spec_and_raw(path)
        if spec.train.lr_schedule != "constant" or "init_scale" not in spec.grid:
            continue
        ends: dict[tuple, set] = {}
        for p in expand(spec):
            rest = tuple(sorted((k, str(v)) for k, v in p.coords.items() if k not in SWEPT))
            ends.setdefault(rest, set()).add(member_lr(p.config) * p.config.train.steps)
        for group, times in ends.items():
            assert len(times) == 1, (path.stem, group, sorted(times))
            if spec.analysis.at_time is not None:
                assert times.pop() >= spec.analysis.at_time
        checked += 1
    assert checked >= 2  # quickstart and lazy_rich at least


SWEPT = ("init_scale", "width", "seed", "model.init_scale", "model.width", "train.seed")
