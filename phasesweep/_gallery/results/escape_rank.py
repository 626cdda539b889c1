"""Seed 002 (Bantzis, Simon & Jacot, Thm. 3.1 and §3–4): a bias-free ReLU net started at
a small scale g escapes the saddle at the origin along a direction whose deeper weight
matrices are approximately rank one (the first layers may keep a higher rank, §4). At the
first escape the weights are still dominated by the update, so the weight change
ΔW_l = W_l(t) − W_l(0) of every hidden layer 2..L−1 should be rank one: its stable rank

    srank(ΔW_l) = ‖ΔW_l‖²_F / s₁(ΔW_l)²        (≥ 1, = 1 exactly for rank one)

is read at the first logged step with t ≥ ``runs.t_cross_050`` (the loss below L0/2)
that has spectra (``metrics.spectra_budget`` may thin them), with ‖ΔW_l‖_F =
``layers.rel_change`` × ‖W_l(0)‖_F and s₁ = ``layers.delta_top_sv[1]``. The check: per
depth, the mean of srank − 1 over hidden layers, init scales and seeds, whose 95 %
t-interval must lie below a tolerance. The random init's own stable rank (``stable_rank``
at step 0, of order width/4) is drawn for contrast; layer 1 (higher rank allowed) and
layer L (a vector, rank one whatever happens) are left out of the check.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phasesweep._gallery._fit import Check, mean_interval
from phasesweep._gallery._result import Result, Size
from phasesweep._gallery.results import escape_time

#: The largest init scale read: the escape is saddle-dominated only from a small init
#: (the leftover of the random init in ΔW is O(g)).
G_MAX = 1e-3

#: Bound on the mean of srank − 1: srank − 1 ≥ (s₂/s₁)², so 0.05 admits a second singular
#: value up to ~0.2 s₁ only, two orders of magnitude below the init's srank − 1.
TOLERANCE = 0.05

SQL = f"""\
WITH lay AS (
    SELECT r.run_id, r.depth, r.init_scale, r.seed, r.t_cross_050, l.layer, l.step,
           t.time, l.rel_change, l.fro_norm, l.stable_rank, l.delta_top_sv
    FROM layers l JOIN trajectories t USING (run_id, step) JOIN runs r USING (run_id)
    WHERE r.sweep = {{sweep}} AND r.status = 'completed' AND r.t_cross_050 IS NOT NULL
      AND r.depth >= 3 AND r.init_scale <= {G_MAX} * (1 + 1e-9) AND l.layer < r.depth
),
escape AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, layer ORDER BY step) AS k
    FROM lay
    WHERE time >= t_cross_050 AND delta_top_sv IS NOT NULL
)
SELECT e.depth, e.init_scale, e.seed, e.layer, e.step, e.time, e.t_cross_050,
       (e.rel_change * i.fro_norm) ^ 2 / e.delta_top_sv[1] ^ 2 AS delta_srank,
       i.stable_rank AS init_srank
FROM escape e JOIN lay i ON i.run_id = e.run_id AND i.layer = e.layer AND i.step = 0
WHERE e.k = 1
ORDER BY e.depth, e.layer, e.init_scale, e.seed"""


def hidden(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the hidden layers 2..L−1 (the check's), shape (rows, columns)."""
    return frame[(frame.layer >= 2) & (frame.layer < frame.depth)]


def measure(frame: pd.DataFrame) -> list[Check]:
    """Per depth, the mean of srank(ΔW) − 1 over the hidden layers with its t-interval,
    below ``TOLERANCE``."""
    return [
        Check(
            f"depth {depth}: mean stable rank of ΔW − 1, layers 2..{depth - 1}",
            mean_interval(grp.delta_srank - 1.0),
            0.0,
            TOLERANCE,
            "(s₂/s₁)² ≤ 0.05: a second direction under ~0.2 s₁",
            bound="below",
        )
        for depth, grp in hidden(frame).groupby("depth")
    ]


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt
    from phasesweep.analysis._style import palette

    fig, ax = plt.subplots(figsize=(8, 4.2), layout="constrained")
    depths = sorted(frame.depth.unique())
    colours = dict(zip(depths, palette(len(depths))))
    jitter = np.random.default_rng(0)
    fits = {int(c.label.split()[1].rstrip(":")): c.fit for c in checks}
    for depth, grp in frame.groupby("depth"):
        fit = fits.get(depth)
        label = f"ΔW at escape, L = {depth}" + (
            f"; srank − 1: {fit.estimate:.2g} [{fit.low:.2g}, {fit.high:.2g}] 95 %" if fit else ""
        )
        x = grp.layer + 0.15 * (depths.index(depth) - (len(depths) - 1) / 2)
        x = x + jitter.uniform(-0.03, 0.03, len(grp))
        ax.scatter(x, grp.delta_srank - 1, s=14, color=colours[depth], label=label)
        ax.scatter(x, grp.init_srank - 1, s=14, marker="x", color=colours[depth], alpha=0.5)
    ax.scatter([], [], marker="x", color="grey", label="W(0): the random init")
    ax.axhline(TOLERANCE, color="k", lw=1, ls="--", label=f"{TOLERANCE:g}: the tolerance")
    ax.axvspan(0.5, 1.5, color="grey", alpha=0.1, label="layer 1: left out (may keep rank)")
    ax.set(
        yscale="log",
        xlabel="layer l (1 = input; the last, a vector, not drawn)",
        ylabel="stable rank − 1 = ‖·‖²_F / s₁² − 1",
        xticks=sorted(frame.layer.unique()),
    )
    ax.set_title(f"first escape from g ≤ {G_MAX:g}: ΔW_l is rank one in layers 2..L−1")
    ax.legend(fontsize=7)
    return fig


RESULT = Result(
    name="escape_rank",
    seed="002",
    paper=escape_time.RESULT.paper,  # the same paper, the same sweep file
    reproduces="at the first escape from a small init the deeper layers' weight changes are "
    "approximately rank one (Thm. 3.1, §3–4)",
    sweep="saddle_escape",
    conditions=(
        "bias-free ReLU, standard parameterization with fan-in init of scale g ≤ 1e-3, "
        "teacher data n = 64 in d = 10, GD with the norm-adaptive step; ΔW_l read at the "
        "first logged step after the loss falls below L0/2"
    ),
    sql=SQL,
    default=Size(
        (
            "grid.depth=[3, 4, 5, 6]",
            "grid.init_scale=[1.0e-4, 1.0e-3]",
            "grid.seed=[0, 1, 2]",
        ),
        1.2,
    ),
    full=Size((), 6.0),
    measure=measure,
    draw=draw,
)
