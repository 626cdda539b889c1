"""Seed 001 (S. Du's thesis, ch. 2): at init the empirical tangent kernel of a wide
two-layer ReLU net concentrates on its infinite-width limit. For
f(x) = (1/√m) Σ_r a_r relu(w_r·x/√d), w_r ~ N(0, I), a_r ~ N(0, 1) (NTK parameterization,
init scale 1), both layers trained, the kernel is an average of m i.i.d. terms whose mean
is the closed form

    K∞(x, x′) = (x·x′/d) (π − θ)/(2π)                               [Du's H∞: layer 1]
              + (‖x‖‖x′‖/d) (sin θ + (π − θ) cos θ)/(2π)           [layer 2: arc-cosine]

(θ the angle between x and x′), so ‖K_m − K∞‖ = O(m^-1/2), and by Weyl's inequality
every eigenvalue gap |λ(K_m) − λ(K∞)| ≤ ‖K_m − K∞‖₂: to first order vᵀ(K_m − K∞)v, a
zero-mean fluctuation of size ∝ m^-1/2. The store keeps the kernel's extreme eigenvalues
(``trajectories.ntk_eig_min/max`` at step 0), not the matrix: those are compared with the
eigenvalues of K∞ on the same probe inputs, rebuilt from the run's data config and seed.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from phasesweep._gallery._fit import Check, loglog_fit
from phasesweep._gallery._result import Result, Size

SQL = """\
SELECT r.width, r.seed, t.ntk_eig_min, t.ntk_eig_max,
       json_extract(r.config, '$.data') AS data_config,
       CAST(json_extract(r.config, '$.metrics.probe_size') AS INTEGER) AS probe_size
FROM runs r JOIN trajectories t USING (run_id)
WHERE r.sweep = {sweep} AND r.status = 'completed' AND t.step = 0
ORDER BY r.width, r.seed"""

#: Widths below this are left out of the fit: the eigenvalue gap's second-order part
#: (O(1/m), a bias that crowds the smallest eigenvalues) is not yet negligible there.
FIT_FROM = 256


def limit_kernel(x: np.ndarray) -> np.ndarray:
    """K∞ of the module's docstring on inputs x (P, d): (P, P). Both layers' terms, init
    scale 1 (each term scales as g² with the init scale g)."""
    x = np.asarray(x, np.float64)
    d = x.shape[1]
    norms = np.linalg.norm(x, axis=1)
    outer = np.outer(norms, norms)
    cos = np.clip(x @ x.T / outer, -1.0, 1.0)
    theta = np.arccos(cos)
    first = (x @ x.T / d) * (np.pi - theta) / (2 * np.pi)
    second = outer / d * (np.sin(theta) + (np.pi - theta) * cos) / (2 * np.pi)
    return first + second


def probe_inputs(data_config: str, probe_size: int, train_seed: int) -> np.ndarray:
    """The probe set the trainer's kernel used (the first ``probe_size`` test inputs of the
    run's dataset, rebuilt from its data config JSON and seed): (P, d)."""
    from phasesweep.pipeline.data._datasets import data_seed, make_dataset
    from phasesweep.pipeline.spec import DataConfig

    cfg = DataConfig.model_validate(json.loads(data_config))
    return make_dataset(cfg, data_seed(cfg, train_seed)).x_test[:probe_size].numpy()


def with_gaps(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with K∞'s extreme eigenvalues on each run's probe set (``limit_min``,
    ``limit_max``) and the absolute gaps (``gap_min``, ``gap_max``)."""
    cache: dict[tuple, tuple[float, float]] = {}
    limits = []
    for row in frame.itertuples():
        cfg = json.loads(row.data_config)
        key = (row.data_config, row.probe_size, row.seed if cfg.get("seed") is None else None)
        if key not in cache:
            eig = np.linalg.eigvalsh(
                limit_kernel(probe_inputs(row.data_config, row.probe_size, row.seed))
            )
            cache[key] = (float(eig[0]), float(eig[-1]))
        limits.append(cache[key])
    low, high = np.array(limits).T
    return frame.assign(
        limit_min=low,
        limit_max=high,
        gap_min=(frame.ntk_eig_min - low).abs(),
        gap_max=(frame.ntk_eig_max - high).abs(),
    )


def measure(frame: pd.DataFrame) -> list[Check]:
    """The width exponents of the gaps of the smallest and largest eigenvalue, every seed's
    point pooled (each |gap| = σ_m |Z|: log |Z| shifts the line, not its slope)."""
    gaps = with_gaps(frame)
    wide = gaps[gaps.width >= FIT_FROM]
    return [
        Check(
            f"exponent of |λ_{which}(K_m) − λ_{which}(K∞)| in width",
            loglog_fit(wide.width, wide[f"gap_{which}"]),
            -0.5,
            0.05,
            "second-order O(1/m) part of the gap",
        )
        for which in ("min", "max")
    ]


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt

    from phasesweep._gallery._figure import fit_label, power_law, spread_points

    gaps = with_gaps(frame)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for which, marker in (("min", "o"), ("max", "s")):
        left.plot(
            gaps.width,
            gaps[f"ntk_eig_{which}"],
            marker,
            ms=3,
            alpha=0.5,
            label=f"λ_{which}(K_m), each seed",
        )
        left.axhline(gaps[f"limit_{which}"].iloc[0], color="k", lw=1, ls="--")
    left.plot([], [], "k--", lw=1, label="λ_min, λ_max of the closed-form K∞ (no free constant)")
    left.set(xscale="log", yscale="log", xlabel="width m", ylabel="eigenvalue at init")
    left.set_title("empirical NTK at init vs its infinite-width limit")
    long = pd.concat(
        [gaps.assign(which=which, gap=gaps[f"gap_{which}"]) for which in ("min", "max")]
    )
    colours = spread_points(right, long, "width", "gap", "which", "|λ_{value} gap| (seeds' range)")
    wide = long[long.width >= FIT_FROM]
    for check, which in zip(checks, ("min", "max")):
        sel = wide[wide.which == which]
        power_law(
            right,
            sel.width,
            sel.gap,
            -0.5,
            color=colours[which],
            label=fit_label(f"λ_{which}: exponent", check.fit, "-1/2"),
        )
    right.axvspan(gaps.width.min(), FIT_FROM, color="0.92", zorder=0, label="not fitted")
    right.set(xscale="log", yscale="log", xlabel="width m", ylabel="|λ(K_m) − λ(K∞)|")
    right.set_title("eigenvalue gap ∝ m^-1/2")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    return fig


RESULT = Result(
    name="ntk_gram",
    seed="001",
    paper="S. S. Du, Gradient descent for non-convex problems in modern machine learning (thesis)",
    reproduces=(
        "the empirical NTK at init approaches the closed-form two-layer ReLU Gram H∞ as width "
        "grows, distance ∝ m^-1/2 (ch. 2, the H∞ concentration lemma)"
    ),
    sweep="width_laziness",
    conditions=(
        "bias-free two-layer ReLU, NTK parameterization, i.i.d. Gaussian init of scale 1, "
        "teacher inputs x ~ N(0, I₁₀), kernel of both layers on the 32 probe inputs at step 0; "
        "compared: the stored extreme eigenvalues λ_min, λ_max of K_m against those of the "
        "closed form K∞ = H∞ (Du's first-layer Gram, over d) + the output layer's arc-cosine "
        f"kernel, on the same inputs; fitted on widths ≥ {FIT_FROM}"
    ),
    sql=SQL,
    default=Size(
        (
            "model.init=gaussian",
            "train.steps=1",
            "train.log_points=2",
            "grid.width=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]",
            "grid.seed={range: [0, 16]}",
        ),
        0.5,
    ),
    full=Size(
        (
            "model.init=gaussian",
            "train.steps=1",
            "train.log_points=2",
            "grid.width=[64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]",
            "grid.seed={range: [0, 24]}",
        ),
        0.8,
    ),
    measure=measure,
    draw=draw,
    caveat=(
        "Du's H∞ is the first layer's kernel with the output weights fixed; phasesweep trains "
        "both layers, so the limit compared here adds the output layer's term (its own closed "
        "form): the m^-1/2 law is the same for both."
    ),
)
