"""Seed 001 (S. Du's thesis, balancedness of homogeneous nets): gradient flow conserves
the layer balance ``D_l = W_{l+1}ᵀW_{l+1} − W_l W_lᵀ`` between linear layers (for ReLU the
per-neuron, hence Frobenius, difference ``‖W_{l+1}‖²_F − ‖W_l‖²_F``); a gradient-descent
step changes it by ``lr² (G_{l+1}ᵀG_{l+1} − G_l G_lᵀ)``, so over the t/lr steps up to a
fixed gradient-flow time t the drift is

    balance_defect(t)  =  lr ∫₀ᵗ (…) ds + O(lr² λ_max)  ∝  lr¹

That exponent is the check. ``layers.balance_defect`` (its absolute value) is read at the
same time t = 2 for every lr, linearly interpolated between the two logged steps around
it, in SQL.
"""

from __future__ import annotations

import pandas as pd

from phasesweep._gallery._fit import Check, loglog_fit
from phasesweep._gallery._result import Result, Size
from phasesweep._gallery.results import ntk_gram

#: The gradient-flow time every run's defect is read at (the sweep's smallest lr
#: reaches it within its steps).
READ_AT = 2.0

SQL = f"""\
WITH defect AS (
    SELECT r.activation, r.depth, r.lr, r.seed, l.layer, t.time,
           abs(l.balance_defect) AS defect,
           lead(t.time) OVER w AS next_time,
           lead(abs(l.balance_defect)) OVER w AS next_defect
    FROM layers l JOIN trajectories t USING (run_id, step) JOIN runs r USING (run_id)
    WHERE r.sweep = {{sweep}} AND r.status = 'completed' AND l.layer < r.depth
    WINDOW w AS (PARTITION BY l.run_id, l.layer ORDER BY t.time)
)
SELECT activation, depth, lr, seed, layer,
       defect + ({READ_AT} - time) / (next_time - time) * (next_defect - defect)
           AS defect_at_t
FROM defect
WHERE time <= {READ_AT} AND next_time > {READ_AT}
ORDER BY activation, depth, layer, seed, lr"""


def _series(frame: pd.DataFrame) -> pd.Series:
    """Each defect curve's label (depth, layer, seed): its own constant, one exponent."""
    return frame.depth.astype(str) + "/" + frame.layer.astype(str) + "/" + frame.seed.astype(str)


def measure(frame: pd.DataFrame) -> list[Check]:
    """Per activation, the exponent of the defect at t = 2 in lr, every depth, layer and
    seed pooled with its own constant, against 1."""
    return [
        Check(
            f"{activation}: exponent of the balance defect at t = {READ_AT:g} in lr",
            loglog_fit(grp.lr, grp.defect_at_t, _series(grp)),
            1.0,
            0.1,
            "the O(lr·λ_max) correction: lr·λ_max ≈ 0.25 at lr = 0.01",
        )
        for activation, grp in frame.groupby("activation")
    ]


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt

    from phasesweep._gallery._figure import fit_label, power_law, spread_points

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    by_activation = {c.label.split(":")[0]: c for c in checks}
    frame = frame.assign(
        curve=frame.activation
        + ", L = "
        + frame.depth.astype(str)
        + ", l = "
        + frame.layer.astype(str),
        per_lr=frame.defect_at_t / frame.lr,
    )
    colours = spread_points(left, frame, "lr", "defect_at_t", "curve", "{value}")
    spread_points(right, frame, "lr", "per_lr", "curve", "{value}")
    for activation, grp in frame.groupby("activation"):
        first = colours[grp.curve.min()]
        power_law(
            left,
            grp.lr,
            grp.defect_at_t,
            1.0,
            color=first,
            label=fit_label(f"{activation}: exponent", by_activation[activation].fit, "1"),
        )
    left.set(
        xscale="log",
        yscale="log",
        xlabel="learning rate lr",
        ylabel=f"|balance defect| at t = {READ_AT:g}",
    )
    left.set_title("GD breaks the balance by O(lr) (gradient flow: lr → 0 keeps it)")
    right.set(xscale="log", yscale="log", xlabel="learning rate lr", ylabel="defect / lr")
    right.set_title("compensated: flat where the drift is ∝ lr")
    fits = [(h, lab) for h, lab in zip(*left.get_legend_handles_labels()) if "exponent" in lab]
    left.legend(*zip(*fits), fontsize=7, loc="upper left")
    right.legend(fontsize=6, ncols=2)
    return fig


RESULT = Result(
    name="balance",
    seed="001",
    paper=ntk_gram.RESULT.paper,  # the same paper
    reproduces=(
        "layer balance conserved by gradient flow, broken by O(lr) under GD at fixed time "
        "(balancedness of homogeneous nets)"
    ),
    sweep="balancedness",
    conditions=(
        "bias-free linear and ReLU nets, depth 3 and 4, width 32, standard "
        "parameterization, init scale 1, teacher data n = 64 in d = 10, full-batch GD with "
        f"a constant lr, read at gradient-flow time t = {READ_AT:g} (interpolated between "
        "logged steps); linear nets: matrix defect ‖D_l(t) − D_l(0)‖_F, ReLU: Frobenius "
        "difference, both over ‖W_l(0)‖²_F + ‖W_l+1(0)‖²_F; each depth, layer and seed "
        "its own constant, one exponent per activation"
    ),
    sql=SQL,
    default=Size(("grid.lr={logspace: [-3.5, -2, 4]}", "grid.seed=[0, 1]"), 0.5),
    full=Size((), 0.7),
    measure=measure,
    draw=draw,
)
