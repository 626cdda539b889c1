"""Escape times against hand computations and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from calibration import logged_times, logistic_mode, two_layer_escape_time
from phasesweep.analysis import _series as ser
from phasesweep.analysis._escape import escape_time, escape_times


def test_log_loss_interpolation_by_hand():
    # L0 = 1, L_end = 1/16 -> theta(0.5) = 17/32, bracketed by (t=1, L=1) and (t=3, L=1/4):
    # log L linear in t: L(t) = 4^-(t-1)/2, so L = 17/32 at t = 1 + 2 log(32/17) / log 4.
    t = [0.0, 1.0, 3.0, 8.0]
    loss = [1.0, 1.0, 0.25, 1 / 16]
    exact = 1 + 2 * math.log(32 / 17) / math.log(4)
    assert escape_time(t, loss, 0.5) == pytest.approx(exact, rel=1e-12)


def test_linear_interpolation_to_zero_loss():
    # the later point has L = 0 (log undefined): the loss is interpolated linearly in t
    t = [0.0, 1.0, 4.0, 8.0]
    loss = [1.0, 1.0, 0.0, 0.0]
    assert escape_time(t, loss, 0.5) == pytest.approx(2.5, rel=1e-12)
    assert escape_time(t, loss, 0.25) == pytest.approx(1.75, rel=1e-12)


def test_interpolation_from_t0():
    t = [0.0, 2.0, 4.0]
    loss = [1.0, 0.25, 0.0625]
    # theta = 1 - 0.5 (1 - 1/16) = 17/32; log L linear on [0, 2]: L = 4^(-t/2)
    assert escape_time(t, loss, 0.5) == pytest.approx(2 * math.log(32 / 17) / math.log(4))


def test_threshold_is_relative_to_own_range():
    # L0 = 3, L_end = 1: theta(0.5) = 2, between (1, 2.5) and (4, 1.6): log-linear in t
    t = [0.0, 1.0, 4.0, 10.0]
    loss = [3.0, 2.5, 1.6, 1.0]
    exact = 1 + 3 * math.log(2.5 / 2) / math.log(2.5 / 1.6)
    assert escape_time(t, loss, 0.5) == pytest.approx(exact, rel=1e-12)


def test_crossing_must_persist():
    # Dips below theta = 0.5 at t=2, comes back above at t=3, leaves for good after t=5.
    t = [0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0]
    loss = [1.0, 0.9, 0.3, 0.8, 0.6, 0.4, 0.0]
    # last point >= 0.5 is (5, 0.6), next (10, 0.4)
    exact = 5 + 5 * math.log(0.6 / 0.5) / math.log(0.6 / 0.4)
    assert escape_time(t, loss, 0.5) == pytest.approx(exact, rel=1e-12)


def test_exponential_decay_closed_form():
    lam = 0.37
    t = logged_times(0.001, 10**6, 400)
    loss = np.exp(-lam * t)
    l_end = loss[-1]
    for eps in (0.1, 0.5, 0.9):
        theta = 1 - eps * (1 - l_end)
        exact = -math.log(theta) / lam
        assert escape_time(t, loss, eps) == pytest.approx(exact, rel=1e-9)


def test_two_layer_logistic_closed_form():
    # Loss 1/2 (s - u)^2 of one mode: L0 = 1/2 (s - u0)^2, L_end ~ 0, so the eps-threshold
    # is met at u = s - (s - u0) sqrt(1 - eps), inverted from the logistic exactly.
    s, u0 = 2.0, 1e-6
    t = logged_times(0.001, 10**5, 400)
    loss = 0.5 * (s - logistic_mode(t, s, u0)) ** 2
    l0, l_end = loss[0], loss[-1]
    for eps in (0.25, 0.5, 0.75):
        theta = l0 - eps * (l0 - l_end)
        u = s - math.sqrt(2 * theta)
        exact = two_layer_escape_time(s, u0, u / s)
        assert escape_time(t, loss, eps) == pytest.approx(exact, rel=5e-3)


def test_stuck_run_has_no_escape_time():
    # A run stuck at a saddle: the loss drifts by 1e-6 relative. Its own range would give a
    # "crossing" in round-off noise; the min_drop rule returns NaN instead.
    t = logged_times(0.01, 10**4)
    loss = 1.0 - 1e-6 * t / t[-1]
    assert math.isnan(escape_time(t, loss, 0.5))
    # Same for a loss that goes up, or a single point.
    assert math.isnan(escape_time(t, 1.0 + t, 0.5))
    assert math.isnan(escape_time([0.0], [1.0], 0.5))


def test_non_finite_points_are_ignored():
    t = [0.0, 1.0, 2.0, 4.0, 8.0]
    loss = [1.0, np.nan, 1.0, 0.0, np.inf]
    # finite points: (0,1) (2,1) (4,0): theta .5 between t=2 and 4, halfway (L = 0 there)
    assert escape_time(t, loss, 0.5) == pytest.approx(3.0, rel=1e-12)


def test_vectorized_over_runs_matches_each_run():
    rng = np.random.default_rng(0)
    frames, expected = [], {}
    t = logged_times(0.01, 10**4, 80)
    for k in range(40):
        lam = 10 ** rng.uniform(-2, 1)
        loss = np.exp(-lam * t) + 0.1 * rng.random()
        if k % 7 == 0:
            loss = np.ones_like(t)  # stuck
        rid = f"run{k:02d}"
        frames.append(pd.DataFrame({"run_id": rid, "time": t, "train_loss": loss}))
        theta = loss[0] - 0.5 * (loss[0] - loss[-1])
        expected[rid] = (
            np.nan if k % 7 == 0 else -math.log(theta - (loss[-1] - np.exp(-lam * t[-1]))) / lam
        )
    df = pd.concat(frames).sample(frac=1.0, random_state=1)  # shuffled rows
    order = np.array(sorted(expected)[::-1], dtype=object)  # an arbitrary run order
    s = ser.from_frame(df, ["train_loss"], run_ids=np.append(order, "missing"))
    got = escape_times(s, [0.5])[:, 0]
    for rid, value in zip(order, got[:-1]):
        if np.isnan(expected[rid]):
            assert np.isnan(value)
        else:
            assert value == pytest.approx(expected[rid], rel=5e-3)
    assert np.isnan(got[-1])  # a run without rows
