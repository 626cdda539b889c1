"""Seed 002 (Bantzis, Simon & Jacot): a bias-free ReLU net started at scale g sits near the
saddle at the origin, where the localized gradient flow is homogeneous of degree L, so the
first escape takes

    t_esc ≈ (1/s) log(1/g) + c                 (depth 2)
    t_esc ≈ C g^-(L-2) + c                      (depth L ≥ 3)

(s, C and c depend on the data: fitted). The time after the escape is O(1) whatever g,
so the differences between neighbouring init scales cancel c:
t(g_k) − t(g_k+1) ∝ g_k^-(L-2) for every L (a constant at depth 2, one increment per
decade of g). That exponent is the check. Escape time: ``runs.t_cross_050``, the
gradient-flow time the train loss first falls below L0/2 (detected at every step).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from phasesweep._gallery._fit import Check, loglog_fit
from phasesweep._gallery._result import Result, Size

SQL = """\
SELECT depth, init_scale, seed, t_cross_050
FROM runs
WHERE sweep = {sweep} AND status = 'completed' AND t_cross_050 IS NOT NULL
ORDER BY depth, seed, init_scale"""


def increments(frame: pd.DataFrame) -> pd.DataFrame:
    """Per depth and seed, the escape time's drop between neighbouring init scales
    (``g``: the smaller one; ``dt``: t(g) − t(next g)), shape (runs − groups, 4)."""
    rows = []
    for (depth, seed), grp in frame.sort_values("init_scale").groupby(["depth", "seed"]):
        g, t = grp.init_scale.to_numpy(), grp.t_cross_050.to_numpy()
        rows += [
            {"depth": depth, "seed": seed, "g": g[k], "dt": t[k] - t[k + 1]}
            for k in range(len(g) - 1)
        ]
    return pd.DataFrame(rows, columns=["depth", "seed", "g", "dt"])


def measure(frame: pd.DataFrame) -> list[Check]:
    """The exponent of the increments in g at each depth, against −(L − 2)."""
    drops = increments(frame)
    return [
        Check(
            f"depth {depth}: exponent of t(g_k) − t(g_k+1) in g",
            loglog_fit(grp.g, grp.dt),
            2.0 - depth,
            0.1,
            "gradient descent's step on the escape and the O(g) non-aligned start",
        )
        for depth, grp in drops.groupby("depth")
    ]


def _theory_curve(g: np.ndarray, t: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The paper's law with its two constants fitted (least squares): t = c + C f(g),
    f = log(1/g) at depth 2, g^-(L-2) deeper; on a grid spanning g."""
    basis = (lambda x: np.log(1 / x)) if depth == 2 else (lambda x: x ** -(depth - 2.0))
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(g), basis(g)]), t, rcond=None)
    grid = np.geomspace(g.min(), g.max(), 60)
    return grid, coef[0] + coef[1] * basis(grid)


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt

    from phasesweep._gallery._figure import fit_label, power_law, spread_points

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    colours = spread_points(left, frame, "init_scale", "t_cross_050", "depth", "L = {value}")
    for depth, grp in frame.groupby("depth"):
        grid, curve = _theory_curve(grp.init_scale.to_numpy(), grp.t_cross_050.to_numpy(), depth)
        left.plot(grid, curve, color=colours[depth], lw=1, ls="--")
    left.plot(
        [], [], "k--", lw=1, label="c + (1/s) log(1/g) (L = 2), c + C g^-(L-2): c, s, C fitted"
    )
    left.set(
        xscale="log", yscale="log", xlabel="init scale g", ylabel="escape time t (loss < L0/2)"
    )
    left.set_title("first escape from the saddle at the origin")
    drops = increments(frame)
    spread_points(right, drops, "g", "dt", "depth", "L = {value}")
    by_depth = {int(c.label.split()[1].rstrip(":")): c for c in checks}
    for depth, grp in drops.groupby("depth"):
        power_law(
            right,
            grp.g,
            grp.dt,
            -(depth - 2.0),
            color=colours[depth],
            label=fit_label(f"L = {depth}:", by_depth[depth].fit, f"{2 - depth}"),
        )
    right.set(xscale="log", yscale="log", xlabel="init scale g_k", ylabel="t(g_k) − t(g_k+1)")
    right.set_title("increments between neighbouring g: exponent −(L−2)")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    return fig


RESULT = Result(
    name="escape_time",
    seed="002",
    paper="I. Bantzis, J. B. Simon, A. Jacot, Saddle-to-saddle dynamics in deep ReLU networks",
    reproduces="escape time ∝ log(1/g) at depth 2, ∝ g^-(L-2) at depth L ≥ 3 (Prop. 2.2 and §3)",
    sweep="saddle_escape",
    conditions=(
        "bias-free ReLU, standard parameterization with fan-in init of scale g, teacher data "
        "n = 64 in d = 10 (one dataset, seeds vary the init), GD with the norm-adaptive step "
        "(near the origin every g takes the same number of steps); escape = first time the "
        "loss falls below L0/2"
    ),
    sql=SQL,
    default=Size(
        (
            "model.width=32",
            "train.steps=4000",
            "grid.depth=[2, 3, 4, 5]",
            "grid.init_scale={logspace: [-4, -1, 7]}",
            "grid.seed=[0, 1, 2]",
        ),
        0.7,
    ),
    full=Size((), 6.0),
    measure=measure,
    draw=draw,
)
