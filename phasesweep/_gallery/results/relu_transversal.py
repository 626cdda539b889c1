"""Seed 000 (He, Tsai & Ward), §3–4: ReLU nets on data in a d_x-dimensional subspace of
R^d plus noise of std σ in the codimension. Their Table 1 fits

    ‖Δ_y f‖²  ≈  C / (σ² N^β),   β = 0.33–0.46 for ReLU nets of depth 2, 4, 6  (eq. 4.3)

by least squares of log ‖Δ_y f‖² on log N, against β = 1 for linear nets (the result
``transversal``). The fitted β depends on the training budget (the normal directions
converge on the slow O(σ⁻²) time scale) and on the N range, so both are stated with
the fit. At σ = 0 the loss does not see the codimension: the first layer's codimension
weights W₁V never move (Lemma 3.1), as w_y never moves in linear regression (eq. 1.13).
The function's transversal variation is another matter: the other layers and the ReLU
pattern move it, as the paper shows for deep linear nets (§2.4.1, Fig. 2.6: "w_y(t) is
non-constant even when σ = 0 … due to the mixing that come from the multiple hidden
layers"). The store holds the function's variation, not W₁V, so the σ = 0 runs are drawn
(final against initial) and not checked.

Read from ``trajectories`` at each run's first and last logged step; the exponent is
fitted in raw N with each σ and seed its own constant (the paper's regression).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phasesweep._gallery._fit import Check, loglog_fit
from phasesweep._gallery._result import Result, Size
from phasesweep._gallery.results import transversal

SQL = """\
WITH ends AS (
    SELECT run_id,
           arg_min(transversal_grad_sq, step) AS transversal_init,
           arg_max(transversal_grad_sq, step) AS transversal_final,
           max(time) AS t_final
    FROM trajectories WHERE sweep = {sweep} GROUP BY run_id
)
SELECT r.activation, r.depth, r.noise_sigma, r.n_train, r.seed,
       e.transversal_init, e.transversal_final, e.t_final
FROM runs r JOIN ends e USING (run_id)
WHERE r.sweep = {sweep} AND r.status = 'completed'
ORDER BY r.depth, r.noise_sigma, r.n_train, r.seed"""

#: Table 1's range of β (depths 2, 4, 6; codimensions 1–10).
PAPER_BETA = (0.33, 0.46)


def _conditions(grp: pd.DataFrame) -> str:
    """The budget and the N range of a fit, for its label: ``t = 4000, N 32–512``."""
    return f"t = {grp.t_final.max():g}, N {grp.n_train.min()}–{grp.n_train.max()}"


def measure(frame: pd.DataFrame) -> list[Check]:
    """Per depth: the N-exponent of the final transversal variation (σ > 0, each σ and
    seed its own constant) against Table 1's −β range."""
    low, high = PAPER_BETA
    checks = []
    for depth, grp in frame.groupby("depth"):
        noisy = grp[grp.noise_sigma > 0]
        if len(noisy):
            series = noisy.noise_sigma.astype(str) + "/" + noisy.seed.astype(str)
            checks.append(
                Check(
                    f"relu depth {depth}, {_conditions(noisy)}: N-exponent −β of ‖Δ_y f‖²",
                    loglog_fit(noisy.n_train, noisy.transversal_final, series),
                    -(low + high) / 2,
                    (high - low) / 2,
                    f"Table 1's β = {low}–{high}: the interval must overlap it",
                )
            )
    return checks


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt

    from phasesweep._gallery._figure import fit_label, power_law, spread_points

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    low, high = PAPER_BETA
    # the σ are the colours, the depths the markers and the fits' line styles
    for (depth, grp), marker, line in zip(frame.groupby("depth"), "os^D", ["-", "-.", ":", "--"]):
        noisy = grp[grp.noise_sigma > 0]
        scaled = noisy.assign(by_sigma=noisy.transversal_final * noisy.noise_sigma**2)
        name = f"depth {depth}, σ = {{value:g}}"
        spread_points(left, scaled, "n_train", "by_sigma", "noise_sigma", name, marker)
        check = next(
            c for c in checks if c.label.startswith(f"relu depth {depth},") and "−β" in c.label
        )
        power_law(
            left,
            scaled.n_train,
            scaled.by_sigma,
            check.fit.estimate,
            ls=line,
            label=fit_label(f"depth {depth}: −β", check.fit, f"−{low}…−{high}"),
        )
        for beta in PAPER_BETA:
            power_law(left, scaled.n_train, scaled.by_sigma, -beta, color="grey")
    left.plot([], [], color="grey", ls="--", lw=1, label=f"Table 1: N^-{low}, N^-{high}")
    left.set(
        xscale="log", yscale="log", xlabel="training points N", ylabel="‖P⊥ ∇ₓ f‖² · σ² (final)"
    )
    left.xaxis.set_minor_formatter(plt.NullFormatter())
    left.set_title("σ > 0: transversal variation vs N")
    clean = frame[frame.noise_sigma == 0]
    for (depth, grp), marker in zip(clean.groupby("depth"), "os^D"):
        right.scatter(
            grp.transversal_init, grp.transversal_final, s=18, marker=marker, label=f"depth {depth}"
        )
    if len(clean):
        span = np.geomspace(clean.transversal_init.min(), clean.transversal_init.max(), 20)
        right.plot(span, span, "k--", lw=1, label="final = initial (linear regression)")
    right.set(
        xscale="log",
        yscale="log",
        xlabel="‖P⊥ ∇ₓ f‖² at init",
        ylabel="‖P⊥ ∇ₓ f‖² at the last step",
    )
    right.set_title("σ = 0: W₁V frozen, the variation moved by the other layers")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    return fig


RESULT = Result(
    name="relu_transversal",
    seed="000",
    paper=transversal.RESULT.paper,  # the same paper
    reproduces=(
        "ReLU nets: ‖Δ_y f‖² ≈ C/(σ² N^β), β = 0.33–0.46 (eq. 4.3, Table 1); at σ = 0 "
        "W₁V stays at its init (Lemma 3.1)"
    ),
    sweep="lowdim_noise",
    conditions=(
        "bias-free ReLU nets, depths 2 and 4, width 32, NTK parameterization, init scale 1; subspace "
        "data: 2-d subspace of R^10 (rotated), noise of std σ in the 8-d codimension, tanh "
        "teacher of z; full-batch GD lr 1 for t = 4000 (the budget), read at the last step; "
        "‖P⊥ ∇ₓ f‖² averaged over the 128 test points; N-exponent fitted over N = 32–512 "
        "in raw N, each σ and seed its own constant"
    ),
    sql=SQL,
    default=Size(
        (
            "grid={activation: [relu], depth: [2, 4], noise_sigma: [0.0, 0.3, 1.0], "
            "data.n_train: [32, 64, 128, 256, 512], seed: [0, 1, 2]}",
            "train.steps=4000",
            "train.log_points=30",
        ),
        0.6,
    ),
    full=Size(
        (
            "grid={activation: [relu], depth: [2, 4, 6], noise_sigma: [0.0, 0.1, 0.3, 1.0], "
            "data.n_train: [64, 128, 256, 512, 1024, 2048, 4096], seed: [0, 1, 2, 3, 4]}",
            "model.width=100",
        ),
        60.0,
    ),
    measure=measure,
    draw=draw,
    caveat=(
        "Does not reproduce at depth 2 for this budget: β grows with the training time as the "
        "normal directions converge (over N = 32–512, 3 seeds, in a t = 20000 run: 0.19 at "
        "t = 141, 0.54 at t = 1138, 0.72 at t = 3227, 0.79 at t = 20000), crossing Table 1's "
        "range near t ≈ 500–1000 on its way to the linear nets' 1; at depth 4 it stays at "
        "0.30–0.36 from t = 1138 to 20000. At σ = 0 the nets move the variation (×0.7–1.5 at "
        "depth 2, ×0.8–6.7 at depth 4, by t = 3227): W₁V is frozen, the function's variation "
        "is not (§2.4.1's mixing); the store holds no W₁V to check Lemma 3.1 on, so the σ = 0 "
        "runs are drawn, not checked. "
        "The paper's ‖Δ_y f‖² is a finite difference E_y‖f(x, y) − f(x, 0)‖² at |y| ~ 2^-2 with "
        "biased nets of width 100; the store holds the gradient ‖P⊥ ∇ₓ f‖² of bias-free nets: "
        "for ReLU the two differ by how the pattern changes over the step."
    ),
)
