"""Plateau detection on closed-form loss curves with known numbers of drops."""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
import pytest
from calibration import (
    deep_linear_loss,
    lazy_loss,
    logged_times,
    two_layer_escape_time,
    two_layer_linear_loss,
    xor_relu_loss,
)
from phasesweep.analysis import _series as ser
from phasesweep.analysis._plateaus import detect_plateaus, plateau_frame

S3 = (4.0, 1.0, 0.25)  # well-separated target singular values


def _levels(s):
    """Saddle levels 1/2 sum_{j >= i} s_j^2 of the whitened linear net (modes learnt in order)."""
    return [0.5 * sum(x * x for x in s[i:]) for i in range(len(s))]


def test_two_layer_linear_three_modes_three_plateaus_in_order():
    u0 = 1e-6
    t = logged_times(0.01, 20000)
    found = detect_plateaus(t, two_layer_linear_loss(t, S3, u0))
    assert len(found) == 3
    levels = [p.level for p in found]
    assert levels == sorted(levels, reverse=True)
    # level = geometric mean of the loss on the plateau: near the saddle value, a little
    # below it on the later plateaus, where the next mode already grows
    for p, level in zip(found, _levels(S3)):
        assert p.level == pytest.approx(level, rel=0.15)
    # the first plateau is the saddle at the origin: it starts at t = 0
    assert found[0].start == 0.0
    # each plateau ends before its mode's half-way time and after the previous one's
    half = [two_layer_escape_time(s, u0, 0.5) for s in S3]
    for i, p in enumerate(found):
        assert p.end < half[i]
        if i:
            assert p.start > half[i - 1]
        assert p.duration > 0
        assert p.drop_frac > 0.5


@pytest.mark.parametrize("depth,steps", [(3, 10**6), (4, 10**7)])
def test_deep_linear_three_modes_three_plateaus(depth, steps):
    t = logged_times(0.01, steps)
    found = detect_plateaus(t, deep_linear_loss(t, S3, 1e-6, depth))
    assert len(found) == 3
    for p, level in zip(found, _levels(S3)):
        assert p.level == pytest.approx(level, rel=0.15)


def test_xor_bias_free_relu_four_drops():
    # seeds/004 Fig. 4: XOR-like data, w_init 1e-6: the loss of a bias-free ReLU net
    # overlaps four independent linear nets, one per point: four drops, one per point...
    t = logged_times(0.01, 20000)
    found = detect_plateaus(t, xor_relu_loss(t, 1e-6))
    assert len(found) == 4
    # ... from L0 = 1/2 (four labels +-1, 1/(2n) sum y^2) down by 1/8 per learnt point
    for p, level in zip(found, [0.5, 0.375, 0.25, 0.125]):
        assert p.level == pytest.approx(level, rel=0.08)


@pytest.mark.parametrize(
    "rates,weights",
    [
        ([0.5], [1.0]),  # one exponential
        ([5.0], [1.0]),  # fast: converges within a few logged points
        ([5e-4], [1.0]),  # slow: looks flat on log-log axes for decades
        (list(np.logspace(-3, 1, 30)), list(np.linspace(1.0, 0.1, 30))),  # an NTK spectrum
        ([1.0, 1e-3], [1.0, 0.01]),  # two well-separated kernel scales
    ],
)
def test_lazy_runs_have_no_plateau(rates, weights):
    t = logged_times(0.01, 20000)
    assert detect_plateaus(t, lazy_loss(t, rates, weights)) == []
    # nor with a non-zero floor (under-parameterized) or 1 % multiplicative noise
    assert detect_plateaus(t, lazy_loss(t, rates, weights) + 0.05) == []
    rng = np.random.default_rng(0)
    noisy = lazy_loss(t, rates, weights) * (1 + 0.01 * rng.standard_normal(len(t)))
    assert detect_plateaus(t, noisy) == []


def test_single_saddle_single_plateau_at_initial_loss():
    t = logged_times(0.01, 20000)
    loss = two_layer_linear_loss(t, [1.0], 1e-8)
    (p,) = detect_plateaus(t, loss)
    assert p.level == pytest.approx(0.5, rel=0.02)
    assert p.start == 0.0
    assert p.drop_frac > 0.99


def test_stuck_and_flat_runs_have_none():
    t = logged_times(0.01, 20000)
    # never leaves the saddle within training: the final flat stretch is not a plateau
    assert detect_plateaus(t, two_layer_linear_loss(t, [1.0], 1e-300)) == []
    assert detect_plateaus(t, np.ones_like(t)) == []
    assert detect_plateaus(t[:2], [1.0, 0.5]) == []


def test_stopped_on_second_saddle_counts_only_the_left_one():
    # training stops between the first and the second escape
    u0 = 1e-6
    t_end = 0.5 * (two_layer_escape_time(4.0, u0, 0.99) + two_layer_escape_time(1.0, u0, 0.01))
    t = logged_times(t_end / 20000, 20000)
    found = detect_plateaus(t, two_layer_linear_loss(t, S3, u0))
    assert len(found) == 1
    assert found[0].level == pytest.approx(_levels(S3)[0], rel=0.05)


def test_min_drop_rejects_small_steps():
    # modes 4 and 0.3 over a floor 0.5: the second drop is 0.545 -> 0.5, i.e. 8 %
    t = logged_times(0.01, 20000)
    loss = two_layer_linear_loss(t, (4.0, 0.3), 1e-6) + 0.5
    small = detect_plateaus(t, loss, min_drop=0.05)
    assert len(small) == 2
    assert small[1].drop_frac == pytest.approx(1 - 0.5 / (0.5 + 0.5 * 0.3**2), rel=0.05)
    assert len(detect_plateaus(t, loss, min_drop=0.1)) == 1


def test_plateau_frame_rows_and_counts():
    t = logged_times(0.01, 20000)
    curves = {
        "a": two_layer_linear_loss(t, S3, 1e-6),  # 3
        "b": lazy_loss(t, [0.5], [1.0]),  # 0
        "c": xor_relu_loss(t, 1e-6),  # 4
        "d": two_layer_linear_loss(t, S3, 1e-6),  # skipped
    }
    df = pd.concat(
        pd.DataFrame({"run_id": k, "time": t, "train_loss": v}) for k, v in curves.items()
    )
    s = ser.from_frame(df, ["train_loss"])
    frame, counts = plateau_frame(s, skip=np.array([False, False, False, True]))
    assert counts.tolist() == [3, 0, 4, -1]
    assert frame.groupby("run_id").size().to_dict() == {"a": 3, "c": 4}
    assert frame["plateau_index"].tolist() == [0, 1, 2, 0, 1, 2, 3]
    assert np.allclose(frame["duration"], frame["end"] - frame["start"])
    a = frame[frame["run_id"] == "a"]
    assert list(a["level"]) == sorted(a["level"], reverse=True)
    assert (frame["contrast"] >= 3).all()
    assert not math.isnan(frame["drop_frac"].sum())


@functools.cache
def _valley_contrasts(s, u0, t_max):
    """Peak-over-valley ratios of the loss-decay rate -d log L/dt between consecutive drops
    of the closed form, on a dense grid (independent of the detector)."""
    t = np.linspace(0.0, t_max, 200_001)
    rate = -np.gradient(np.log(two_layer_linear_loss(t, s, u0)), t)
    peaks = [
        int(
            np.argmax(
                np.where(np.abs(t - two_layer_escape_time(x, u0, 0.5)) < 0.3 / x, rate, -np.inf)
            )
        )
        for x in s
    ]
    return [rate[b] / rate[a:b].min() for a, b in zip(peaks[:-1], peaks[1:])]


@pytest.mark.parametrize(
    "lr,steps,log_points",
    [(0.01, 2000, 100), (0.01, 2000, 150), (0.01, 5000, 150), (0.001, 20000, 300)],
)
def test_saxe_three_drops_found_over_the_whole_init_range(lr, steps, log_points):
    # modes 4, 2, 1 from init 1e-4 to 1e-2 (u0 = g^2 times a seed-like factor): the middle
    # plateau shrinks to ~0.3 time units at g = 1e-2, yet every drop is found, in order,
    # wherever the logging resolves it (logged times at most 9 % apart: >= 2 points on it)
    s = (4.0, 2.0, 1.0)
    t = logged_times(lr, steps, log_points)
    late = t[t >= 1.0]  # where the drops are
    assert (late[1:] / late[:-1]).max() < 1.09
    for g in np.logspace(-4, -2, 9):
        for factor in (0.5, 1.0, 1.3):
            u0 = g * g * factor
            # the closed form has three separate drops: a valley of contrast > 4 before each
            # (the detector's contrast is 3)
            assert min(_valley_contrasts(s, u0, 15.0)) > 4
            found = detect_plateaus(t, two_layer_linear_loss(t, s, u0))
            assert len(found) == 3, (g, factor, [(p.start, p.end) for p in found])
            half = [two_layer_escape_time(x, u0, 0.5) for x in s]
            # each plateau ends by its mode's half-way time (up to the logging grid) and
            # starts after the previous mode's
            for i, p in enumerate(found):
                assert p.end <= t[np.searchsorted(t, half[i])]
                if i:
                    assert p.start > half[i - 1]
