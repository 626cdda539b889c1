"""Regime classification against a hand-made table."""

from __future__ import annotations

import numpy as np
from phasesweep.analysis._regimes import classify

nan = np.nan

# status, loss_ratio, kernel_distance, param_rel_change -> regime, parameter used, value
CASES = [
    ("completed", 0.01, 0.05, 0.9, "lazy", "kernel_distance", 0.05),
    ("completed", 0.01, 0.5, 0.01, "rich", "kernel_distance", 0.5),
    ("completed", 0.01, 0.1, 0.0, "rich", "kernel_distance", 0.1),  # at the threshold: rich
    ("completed", 0.5, 0.5, 0.5, "not_converged", "kernel_distance", 0.5),
    ("completed", 0.01, nan, 0.02, "lazy", "param_rel_change", 0.02),  # NTK not logged
    ("completed", 0.01, nan, 0.3, "rich", "param_rel_change", 0.3),
    ("completed", 0.01, nan, nan, None, None, nan),  # nothing to compare
    ("completed", nan, 0.5, 0.5, None, "kernel_distance", 0.5),  # no loss logged
    ("diverged", nan, 0.5, 0.5, "diverged", "kernel_distance", 0.5),
    ("diverged", 0.01, 0.01, 0.01, "diverged", "kernel_distance", 0.01),
    ("failed", nan, nan, nan, None, None, nan),
]


def test_classify_table():
    cols = list(zip(*CASES))
    res = classify(
        np.array(cols[0], dtype=object),
        np.array(cols[1], dtype=float),
        np.array(cols[2], dtype=float),
        np.array(cols[3], dtype=float),
    )
    assert list(res.regime) == list(cols[4])
    assert list(res.order_parameter) == list(cols[5])
    np.testing.assert_array_equal(res.order_value, np.array(cols[6], dtype=float))
    expected_thr = [nan if c[5] is None else 0.1 for c in CASES]
    np.testing.assert_array_equal(res.threshold, expected_thr)


def test_classify_thresholds_and_fallback():
    status = np.array(["completed"] * 3, dtype=object)
    ratio = np.array([0.01, 0.01, 0.2])
    kd = np.array([0.3, nan, 0.3])
    prc = np.array([0.0, 0.03, 0.0])
    res = classify(
        status,
        ratio,
        kd,
        prc,
        lazy_threshold=0.5,
        fallback_lazy_threshold=0.02,
        converged_loss_frac=0.25,
    )
    assert list(res.regime) == ["lazy", "rich", "lazy"]
    assert list(res.threshold) == [0.5, 0.02, 0.5]
    # param_rel_change as the primary parameter
    res = classify(status, ratio, kd, prc, order_parameter="param_rel_change")
    assert list(res.order_parameter) == ["param_rel_change"] * 3
    assert list(res.regime) == ["lazy", "lazy", "not_converged"]
