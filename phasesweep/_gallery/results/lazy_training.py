"""Seed 003 (Chizat & Bach's lazy training, in Kim's lecture notes; seed 001 ch. 2): a
two-layer ReLU net in the NTK parameterization, started with the antisymmetric init
(f(θ₀) = 0) at scale g, fits its data while its parameters move by

    ‖θ(t) − θ₀‖ / ‖θ₀‖  ∝  g^-L P^-1/2      (L = 2 layers, P ∝ width parameters)

because the tangent kernel grows like g^(2(L-1)) (the kernel-regression norm
‖Δθ‖ = √(yᵀK⁻¹y) ∝ g^-(L-1)) and ‖θ₀‖ ∝ g √P. The tangent kernel's own relative change is
bounded by the same O(m^-1/2) (Du's Lemma 3.2 flips, seed 001): its width slope is at
most -1/2. Read from ``trajectories`` at each run's last logged step.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phasesweep._gallery._fit import Check, loglog_fit
from phasesweep._gallery._result import Result, Size

SQL = """\
WITH last AS (
    SELECT run_id,
           arg_max(param_rel_change, step) AS param_rel_change,
           arg_max(kernel_rel_change, step) AS kernel_rel_change
    FROM trajectories WHERE sweep = {sweep} GROUP BY run_id
)
SELECT r.depth, r.width, r.init_scale, r.seed, l.param_rel_change, l.kernel_rel_change,
       r.final_train_loss / r.initial_train_loss AS loss_ratio
FROM runs r JOIN last l USING (run_id)
WHERE r.sweep = {sweep} AND r.status = 'completed'
ORDER BY r.depth, r.width, r.init_scale, r.seed"""

#: The init scales the g-law is read on (the lazy side: the loss converges, the change is
#: small); below it the net leaves the kernel regime.
LAZY_FROM = 1.0


def measure(frame: pd.DataFrame) -> list[Check]:
    """The exponents of param_rel_change in g (at each depth, every width pooled after
    dividing out the width law) and in width (every g pooled after dividing out g^-L),
    and the width slope of the kernel's relative change at g = 1."""
    lazy = frame[frame.init_scale >= LAZY_FROM]
    checks = []
    for depth, grp in lazy.groupby("depth"):
        # the nonlinear corrections are O(param_rel_change) ≤ 0.05 relative: ≤ 0.1 on a slope
        checks.append(
            Check(
                f"depth {depth}: exponent of ‖Δθ‖/‖θ₀‖ in g",
                loglog_fit(grp.init_scale, grp.param_rel_change * np.sqrt(grp.width)),
                -float(depth),
                0.1,
                "nonlinear corrections O(‖Δθ‖/‖θ₀‖)",
            )
        )
        checks.append(
            Check(
                f"depth {depth}: exponent of ‖Δθ‖/‖θ₀‖ in width",
                loglog_fit(grp.width, grp.param_rel_change * grp.init_scale**depth),
                -0.5,
                0.1,
                "finite-width kernel fluctuation O(m^-1/2)",
            )
        )
    at_one = frame[np.isclose(frame.init_scale, LAZY_FROM)]
    for depth, grp in at_one.groupby("depth"):
        checks.append(
            Check(
                f"depth {depth}: exponent of ‖K_t − K₀‖/‖K₀‖ in width at g = 1",
                loglog_fit(grp.width, grp.kernel_rel_change),
                -0.5,
                0.0,
                "a bound: flips give m^-1/2, the smooth change m^-1",
                bound="upper",
            )
        )
    return checks


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt

    from phasesweep._gallery._figure import fit_label, power_law, spread_points

    depths = sorted(frame.depth.unique())
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), layout="constrained")
    by_label = {c.label: c for c in checks}
    lazy = frame[frame.init_scale >= LAZY_FROM]
    ax = axes[0]
    for depth in depths:
        rows = frame[frame.depth == depth]
        rows = rows.assign(scaled=rows.param_rel_change * np.sqrt(rows.width))
        spread_points(ax, rows, "init_scale", "scaled", "width", f"L = {depth}, width {{value}}")
        fit = by_label[f"depth {depth}: exponent of ‖Δθ‖/‖θ₀‖ in g"].fit
        sel = lazy[lazy.depth == depth]
        power_law(
            ax,
            sel.init_scale,
            sel.param_rel_change * np.sqrt(sel.width),
            -depth,
            label=fit_label(f"L = {depth}: g-exponent", fit, f"-{depth}"),
        )
    ax.axvspan(
        frame.init_scale.min(), LAZY_FROM, color="0.92", zorder=0, label="rich side (not fitted)"
    )
    ax.set(xscale="log", yscale="log", xlabel="init scale g", ylabel="‖Δθ‖/‖θ₀‖ · √width")
    ax.set_title("relative parameter change vs g")
    ax = axes[1]
    for depth in depths:
        sel = lazy[lazy.depth == depth]
        sel = sel.assign(scaled=sel.param_rel_change * sel.init_scale**depth)
        spread_points(ax, sel, "width", "scaled", "init_scale", f"L = {depth}, g = {{value:.2g}}")
        fit = by_label[f"depth {depth}: exponent of ‖Δθ‖/‖θ₀‖ in width"].fit
        power_law(ax, sel.width, sel.scaled, -0.5, label=fit_label("width-exponent", fit, "-1/2"))
    ax.set(xscale="log", yscale="log", xlabel="width m", ylabel="‖Δθ‖/‖θ₀‖ · g^L")
    ax.set_title("... vs width (g ≥ 1)")
    ax = axes[2]
    at_one = frame[np.isclose(frame.init_scale, LAZY_FROM)]
    for depth in depths:
        sel = at_one[at_one.depth == depth]
        spread_points(ax, sel, "width", "kernel_rel_change", "depth", "L = {value}")
        fit = by_label[f"depth {depth}: exponent of ‖K_t − K₀‖/‖K₀‖ in width at g = 1"].fit
        power_law(
            ax,
            sel.width,
            sel.kernel_rel_change,
            -0.5,
            label=fit_label("width-exponent", fit, "≤ -1/2"),
        )
    ax.set(xscale="log", yscale="log", xlabel="width m", ylabel="‖K_t − K₀‖_F / ‖K₀‖_F")
    ax.set_title("tangent-kernel change at g = 1")
    for ax in axes:
        ax.legend(fontsize=7)
    return fig


RESULT = Result(
    name="lazy_training",
    seed="003",
    paper="Chizat & Bach 2019 lazy training, in J. Kim's lecture notes (and S. Du's thesis, ch. 2)",
    reproduces="‖θ(t) − θ₀‖/‖θ₀‖ ∝ g^-L P^-1/2 on the lazy side; kernel change O(m^-1/2)",
    sweep="lazy_rich",
    conditions=(
        "bias-free ReLU, NTK parameterization, antisymmetric init (f(θ₀) = 0), teacher data "
        "n = 32 in d = 10, full-batch GD with lr = max(g, 1)^-2(L-1), read at the last step "
        "(loss converged); g-law fitted on g ≥ 1, the free constant C of each line fitted"
    ),
    sql=SQL,
    default=Size(
        (
            "train.steps=1000",
            "train.lr_scaling.init_scale_floor=1.0",
            "grid.depth=[2]",
            "grid.width=[64, 256, 1024]",
            "grid.init_scale={logspace: [-1, 1, 9]}",
            "grid.seed=[0, 1]",
        ),
        0.5,
    ),
    full=Size(
        (
            "train.lr_scaling.init_scale_floor=1.0",
            "grid.width=[32, 128, 512, 2048]",
            "grid.init_scale={logspace: [-1.5, 1, 11]}",
        ),
        25.0,
    ),
    measure=measure,
    draw=draw,
    caveat=(
        "The kernel's relative change carries no clean law in g on the lazy side: a "
        "ReLU net's kernel moves by discrete activation flips (O(1/m) each), so at g ≫ 1 "
        "it is a few flips per seed; its width law is checked as the bound it is."
    ),
)
