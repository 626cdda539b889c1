"""Seed 003 (Chizat & Bach's lazy training, in Kim's lecture notes): the lazy/rich phase
diagram of a two-layer ReLU net over init scale g × width m, and its boundary.

In the NTK parameterization with the antisymmetric init (f(θ₀) = 0), fitting the data
moves the parameters relatively by

    ‖θ(t) − θ₀‖ / ‖θ₀‖  ≈  C g^-L P^-1/2      (P ∝ m parameters at depth L = 2)

(``lazy_training`` checks that law). A run is lazy when that change stays below a
threshold θ, so the boundary is the level set C g^-L m^-1/2 = θ:

    log g* = const − (1 / 2L) log m           (slope −1/4 at depth 2)

a line in log g – log m whose slope the theory fixes and whose constant it leaves free.
The regime of every run is the analysis' own (``summaries.regime``: the order parameter
``param_rel_change`` against ``analysis.lazy_threshold``); on each (width, seed) line the
boundary g* lies between the two neighbouring init scales where the regime flips from
rich to lazy, interpolated where the order parameter crosses the threshold (linear in
log-log). The check: the slope of log g* on log m, with its 95 % interval over the
widths and seeds, against −1/(2L).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from phasesweep._gallery._fit import Check, Fit, slope_interval
from phasesweep._gallery._result import Result, Size

SQL = """\
SELECT r.depth, r.width, r.init_scale, r.seed, s.regime, s.order_parameter,
       s.order_value, s.lazy_threshold
FROM runs r JOIN summaries s USING (sweep, run_id)
WHERE r.sweep = {sweep} AND r.status = 'completed'
ORDER BY r.depth, r.width, r.seed, r.init_scale"""

LABEL = "depth {depth}: slope of the boundary log g* in log m"


def boundaries(frame: pd.DataFrame) -> pd.DataFrame:
    """One boundary per (depth, width, seed) line whose regime flips from rich to lazy
    once, by increasing g, at the lower edge of its lazy runs: ``g_rich`` and ``g_lazy``
    (the two runs where it flips) and ``g_star`` between them, where the order parameter
    crosses its threshold (linear interpolation of log g in log order value). A line that
    is lazy or rich over its whole range, or whose first lazy run follows a run that is
    not rich (not converged), has no boundary in the grid and is left out."""
    rows = []
    for (depth, width, seed), line in frame.sort_values("init_scale").groupby(
        ["depth", "width", "seed"]
    ):
        lazy = (line.regime == "lazy").to_numpy()
        # the lazy region's lower edge: the first run from which every larger g is lazy
        edge = len(lazy) - int(np.argmin(lazy[::-1])) if not lazy.all() else 0
        if edge == 0 or edge == len(lazy) or line.regime.iloc[edge - 1] != "rich":
            continue
        rich, first_lazy = line.iloc[edge - 1], line.iloc[edge]
        log_value = np.log([first_lazy.order_value, rich.order_value])  # increasing
        log_g = np.log([first_lazy.init_scale, rich.init_scale])
        g_star = math.exp(np.interp(math.log(rich.lazy_threshold), log_value, log_g))
        rows.append(
            {
                "depth": depth,
                "width": width,
                "seed": seed,
                "g_rich": rich.init_scale,
                "g_lazy": first_lazy.init_scale,
                "g_star": g_star,
            }
        )
    return pd.DataFrame(rows, columns=["depth", "width", "seed", "g_rich", "g_lazy", "g_star"])


def finite_width_tolerance(widths: np.ndarray) -> float:
    """The slope error the O(m^-1/2) finite-width correction of the law can leave: a
    relative change of the order parameter of up to m^-1/2 moves log g* by up to
    m^-1/2 / L ≤ m^-1/2 / 2, so across the widths spanned the slope may tilt by
    (m_min^-1/2 − m_max^-1/2) / (2 log(m_max / m_min)), to two significant digits."""
    low, high = float(np.min(widths)), float(np.max(widths))
    return float(f"{(low**-0.5 - high**-0.5) / (2 * math.log(high / low)):.2g}")


def measure(frame: pd.DataFrame) -> list[Check]:
    """Per depth, the slope of log g* on log m (every seed's boundaries pooled) against
    −1/(2L)."""
    checks = []
    for depth, lines in boundaries(frame).groupby("depth"):
        checks.append(
            Check(
                LABEL.format(depth=depth),
                slope_interval(np.log(lines.width), np.log(lines.g_star)),
                -1 / (2 * depth),
                finite_width_tolerance(lines.width.to_numpy()),
                "finite-width O(m^-1/2) correction over the widths spanned",
            )
        )
    return checks


#: How each regime is drawn: (marker, colour, label).
_REGIME_STYLE = {
    "lazy": ("o", "#4c72b0", "lazy (majority of seeds)"),
    "rich": ("s", "#dd8452", "rich"),
    "not_converged": ("x", "0.5", "not converged"),
}


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt
    from phasesweep.analysis._boundaries import draw_boundaries

    from phasesweep._gallery._figure import fit_label

    depths = sorted(frame.depth.unique())
    fig, axes = plt.subplots(
        1, len(depths), figsize=(9 * len(depths), 4.8), squeeze=False, layout="constrained"
    )
    found = boundaries(frame)
    by_label = {c.label: c for c in checks}
    for ax, depth in zip(axes[0], depths):
        cells = frame[frame.depth == depth].groupby(["init_scale", "width"]).regime
        majority = cells.agg(lambda r: r.mode().iloc[0] if r.notna().any() else None)
        for regime, (marker, colour, label) in _REGIME_STYLE.items():
            at = majority[majority == regime].index
            if len(at):
                g, m = zip(*at)
                ax.scatter(g, m, marker=marker, color=colour, s=40, label=label, zorder=3)
        lines = found[found.depth == depth]
        per_width = lines.groupby("width").agg(
            g_star=("g_star", lambda g: float(np.exp(np.log(g).mean()))),
            g_rich=("g_rich", "min"),
            g_lazy=("g_lazy", "max"),
            seeds=("g_star", list),
        )
        check = by_label.get(LABEL.format(depth=depth))
        measured = pd.DataFrame(
            {
                "width": per_width.index.to_numpy(),
                "boundary": per_width.g_star.to_numpy(),
                "bracket_low": per_width.g_rich.to_numpy(),
                "bracket_high": per_width.g_lazy.to_numpy(),
                "seed_boundaries": per_width.seeds.to_numpy(),
                "bracketed": True,
                "axis_scale": "log",
            }
        )
        draw_boundaries(ax, measured, y="width", label="measured g* (bracket: where it flips)")
        if check is not None:
            _theory_line(ax, lines, check.fit, depth)
        ax.set(xscale="log", yscale="log", xlabel="init scale g", ylabel="width m")
        ax.set_title(f"depth {depth}: regime by ‖Δθ‖/‖θ₀‖ vs {frame.lazy_threshold.iloc[0]:g}")
        if check is not None:
            ax.plot([], [], " ", label=fit_label("slope", check.fit, f"-1/{2 * depth}"))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def _theory_line(ax, lines: pd.DataFrame, fit: Fit, depth: int) -> None:
    """The theory's boundary g* = C m^(-1/2L) over the widths, C fitted to the measured
    boundaries (the theory leaves it free), and the measured line (its fitted slope)."""
    m = np.geomspace(lines.width.min(), lines.width.max(), 50)
    theory = -1 / (2 * depth)
    constant = float(np.mean(np.log(lines.g_star) - theory * np.log(lines.width)))
    ax.plot(
        np.exp(constant + theory * np.log(m)),
        m,
        "k--",
        lw=1.2,
        label=f"theory g* ∝ m^-1/{2 * depth} (constant fitted)",
    )
    ax.plot(np.exp(fit.intercept + fit.estimate * np.log(m)), m, ":", color="#1f3b99", lw=1)


RESULT = Result(
    name="lazy_phase",
    seed="003",
    paper="Chizat & Bach 2019 lazy training, in J. Kim's lecture notes",
    reproduces="the lazy/rich boundary g* ∝ m^-1/(2L) in init scale × width",
    sweep="lazy_rich",
    conditions=(
        "bias-free ReLU, depth 2, NTK parameterization, antisymmetric init (f(θ₀) = 0), "
        "teacher data n = 32 in d = 10, full-batch GD with lr 1 for every g ≤ 1, read at "
        "t = 3000 (every run the same time); regime: ‖θ(t) − θ₀‖/‖θ₀‖ against 0.1 "
        "(phasesweep analyze)"
    ),
    sql=SQL,
    default=Size(
        (
            "train.steps=3000",
            "train.log_points=30",
            "train.lr_scaling.init_scale_floor=1.0",
            "analysis.order_parameter=param_rel_change",
            "analysis.lazy_threshold=0.1",
            "grid.depth=[2]",
            "grid.width=[64, 128, 256, 512, 1024]",
            "grid.init_scale={logspace: [-1, 0, 6]}",
            "grid.seed=[0, 1, 2]",
        ),
        1.1,
    ),
    full=Size(
        (
            "train.steps=3000",
            "train.log_points=30",
            "train.lr_scaling.init_scale_floor=1.0",
            "analysis.order_parameter=param_rel_change",
            "analysis.lazy_threshold=0.1",
            "grid.depth=[2]",
            "grid.width=[64, 128, 256, 512, 1024, 2048, 4096]",
            "grid.init_scale={logspace: [-1.5, 0, 16]}",
            "grid.seed=[0, 1, 2, 3, 4]",
        ),
        30.0,
    ),
    measure=measure,
    draw=draw,
    caveat=(
        "The regime is read from the relative parameter change, the quantity of the law; "
        "the sweep's own order parameter, the kernel distance 1 − cos(K_t, K₀), gives a "
        "steeper boundary at these widths (−0.28 [−0.29, −0.26] at widths 256–4096, "
        "analysis._regimes): it also counts activation flips of either sign, whose share "
        "falls with the width. At depth ≥ 3 the parameter count grows like m², so the "
        "parameter change no longer follows m^-1/2 and this check does not apply."
    ),
)
