"""Regime of a run (lazy / rich / diverged / not_converged) from continuous order parameters.

The label is a threshold on a continuous order parameter, and both the value and
the threshold are stored beside it, so a phase diagram can be redrawn with any
other threshold without re-running anything.

The values compared are the run's last logged ones ("final" below), or, with
``analysis.at_time``, those at that common gradient-flow time (see
``analysis._analyze``), so that runs with different learning rates compare at equal t.

Rules, in order (vectorized over runs):

1. ``status == 'diverged'`` -> ``'diverged'``; ``status == 'failed'`` (no
   trajectory) -> NULL.
2. final / initial train loss above ``converged_loss_frac`` -> ``'not_converged'``
   (a NULL ratio, i.e. no finite logged loss, -> NULL).
3. Otherwise compare the order parameter's final value with ``lazy_threshold``:
   below -> ``'lazy'``, at or above -> ``'rich'``. The order parameter is
   ``order_parameter`` (``kernel_distance`` by default: 1 - cos(K_t, K_0) of the
   empirical NTK; ``lin_distance``, the RMS distance on the probe set between the
   net and its linearization at init trained to the same t, is the third choice);
   if it is NULL for a run (NTK not logged), ``param_rel_change`` (or, when that is
   the primary one, ``kernel_distance``) is used with ``fallback_lazy_threshold``
   (default: the same threshold), and ``order_parameter`` in the summary says which
   one. If both are NULL the regime is NULL.

Width (why ``kernel_distance`` is the default): the lazy/rich crossover of a depth-L
net in the NTK parameterization sits at init scale g* ∝ width^(-1/(2L)): the kernel,
and each neuron, move relatively by ~ 1/(g^L sqrt(width)). ``param_rel_change``
divides by ||θ_0|| ~ g sqrt(P) instead, and the parameter count P grows like width²
once there is a width x width layer: at depth >= 3 it is ~ 1/(g^L width), sqrt(width)
smaller than the kernel change, and a fixed threshold on it puts the boundary at
g* ∝ width^(-1/L) or steeper (measured at depth 3, widths 32-256, t = 3000, threshold
0.1: -0.456, 95 % [-0.488, -0.423], theory -1/6; ``kernel_distance`` 0.1: -0.216,
[-0.317, -0.116]; ``tests/test_regime_width_exponent.py``). At depth 2, P ∝ width and
the two agree in law: ``param_rel_change`` at 0.03 gives -0.250, [-0.261, -0.240]
(widths 256-4096), drifting to -0.258, -0.275, -0.287 at 0.1, 0.3, 1 as the level leaves
the lazy regime, while ``kernel_distance`` at 0.01 (``sweeps/lazy_rich.yaml``) gives
-0.278, [-0.294, -0.262] (-0.293 at 0.001, -0.271 at 0.1): steeper than -1/4 at these
widths, plausibly from the incoherent part of the kernel change (activation flips of
either sign), whose share falls with the width. Read the boundary at one gradient-flow
time (``at_time``) late enough for the runs near it to converge: at t = 1000 the
small-g runs at large width lag, which steepens every exponent (-0.28 ... -0.32).

These exponents belong to their setup, not to the rule: the width exponent of a fixed
``kernel_distance`` threshold depends on the data, the threshold and the time it is read
at. At depth 2, widths 256-4096, threshold 0.01, t = 3000, it was -0.278 on
``lazy_rich.yaml``'s data (teacher, input_dim 10, n_train 32), -0.264 [-0.278, -0.249]
with n_train 64 and a width-8 teacher, -0.293 [-0.316, -0.270] with input_dim 5 and
n_train 16, and -0.307 [-0.43, -0.18] (threshold 0.003) on the quickstart's data at
t = 1500; -0.36 to -0.48 were reported on other data (issue 26). So a threshold tuned at
one width does not carry to another by a fixed exponent: read each width's boundary
from its own stored runs (the phase diagram, or ``phasesweep refine``).

Caveat: the kernel distance of a two-layer *linear* net barely moves even from
a tiny init (its NTK keeps the ``‖W2‖² XXᵀ`` part, which only grows in scale),
so such runs read "lazy" by ``kernel_distance`` while their weights move by
O(1/α); choose ``order_parameter: param_rel_change`` for linear nets. The
scaling fits therefore select runs by whether they left a plateau, not by regime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import numpy as np
from phasesweep.analysis.config import OrderParameter

#: The ``trajectories`` columns the regime rule can read (``analysis.order_parameter``).
ORDER_PARAMETERS: tuple[str, ...] = get_args(OrderParameter)


@dataclass(frozen=True)
class RegimeResult:
    regime: np.ndarray  # (R,) object: 'lazy' | 'rich' | 'diverged' | 'not_converged' | None
    order_parameter: np.ndarray  # (R,) object: the parameter compared, or None
    order_value: np.ndarray  # (R,) float (NaN: none)
    threshold: np.ndarray  # (R,) float (NaN: none)


def classify(
    status: np.ndarray,
    loss_ratio: np.ndarray,
    kernel_distance: np.ndarray,
    param_rel_change: np.ndarray,
    *,
    lin_distance: np.ndarray | None = None,
    order_parameter: str = "kernel_distance",
    lazy_threshold: float = 0.1,
    fallback_lazy_threshold: float | None = None,
    converged_loss_frac: float = 0.1,
) -> RegimeResult:
    """Regimes of R runs from their status, final/initial loss ratio and final order parameters."""
    if order_parameter not in ORDER_PARAMETERS:
        raise ValueError(f"order_parameter must be one of {ORDER_PARAMETERS}")
    status = np.asarray(status, dtype=object)
    ratio = np.asarray(loss_ratio, dtype=np.float64)
    values = {
        "kernel_distance": np.asarray(kernel_distance, dtype=np.float64),
        "param_rel_change": np.asarray(param_rel_change, dtype=np.float64),
        "lin_distance": np.full(len(status), np.nan)
        if lin_distance is None
        else np.asarray(lin_distance, dtype=np.float64),
    }
    other = "kernel_distance" if order_parameter == "param_rel_change" else "param_rel_change"
    fallback = lazy_threshold if fallback_lazy_threshold is None else fallback_lazy_threshold
    primary = values[order_parameter]
    use_primary = np.isfinite(primary)
    use_other = ~use_primary & np.isfinite(values[other])
    value = np.where(use_primary, primary, np.where(use_other, values[other], np.nan))
    threshold = np.where(use_primary, lazy_threshold, np.where(use_other, fallback, np.nan))
    name = np.where(use_primary, order_parameter, np.where(use_other, other, None)).astype(object)

    n = len(status)
    regime = np.full(n, None, dtype=object)
    has_value = np.isfinite(value)
    regime[has_value & (value < threshold)] = "lazy"
    regime[has_value & (value >= threshold)] = "rich"
    with np.errstate(invalid="ignore"):
        regime[np.isfinite(ratio) & (ratio > converged_loss_frac)] = "not_converged"
    regime[~np.isfinite(ratio) & (status != "diverged")] = None
    regime[status == "failed"] = None
    regime[status == "diverged"] = "diverged"
    return RegimeResult(regime, name, value, threshold)
