"""Seed 000 (He, Tsai & Ward), §2.4.2: data exactly on the subspace (σ = 0) and a deep
linear net f(x) = wᵀx whose end-to-end vector w = (w_x, w_y) follows the product flow
(2.4) of balanced layers (2.5). The loss does not see w_y, and (2.17) gives

    d/dt w_y = −(L − 1) ‖w‖^(−2/L) s w_y,     s = w_xᵀ ∂J/∂w_x = ⟨f²⟩ − ⟨f g⟩

(⟨·⟩ the mean over the training set, g the labels): depth rescales the normal direction,
which plain regression (L = 1) leaves at its init. The sign is the initial region's
(Lemma 2.1, Theorem 2.4): ‖w_y‖ grows from E⁻ (s < 0, between the origin and the
stationary set Γ₀ = {w_x = w_x*}) and shrinks from U⁺ (beyond H, the tangent plane at
(w_x*, 0) of the cylinder E = {s = 0}); between the two the theorem says nothing. Per run,
with X = ‖w_x‖², Y = ‖w_y‖² at times 0 and T,

    U⁺:  Y_T − Y_0 ≤ (L−1) Y_0 / (L X_0 + Y_0) · (X_T − X_0) ≤ 0        (2.20)
    E⁻:  Y_T − Y_0 ≥ (L−1) Y_T / (L X_T + Y_T) · (X_T − X_0) ≥ 0        (2.21)

The depth law follows from (2.17) alone: wᵀ dw/dt = −L ‖w‖^(2−2/L) s, so

    d log‖w_y‖ / d log‖w‖ = (L − 1) / L      at every t, whatever the region:

the fraction 1 − 1/L of the end-to-end growth or decay goes into w_y (none at L = 1).

Read from the store at the first and last logged step: Y = ``transversal_grad_sq`` (∇ₓf =
w for a linear net, and P⊥ projects on the codimension), ‖w‖ = Π_l ``layers.fro_norm``
(the balanced init ``model.init: balanced`` is rank one, and gradient descent keeps every
layer rank one and aligned, so the product's norm is the product of the norms; the
standard parameterization has no forward multipliers). The regions need s and the side of
H at init, which the store does not hold: they are rebuilt from the run's data config and
its initial weights (the trainer's own init, from the run's model config and seed), on the
training inputs. H's normal at (w_x*, 0) is the gradient of s there, 2A w_x* − b = b with
A = ⟨x xᵀ⟩, b = ⟨g x⟩ = A w_x*, so the side of H is the sign of bᵀw_x − bᵀw_x* =
⟨f₀ g⟩ − ⟨f* g⟩, f* the least-squares fit of the labels.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from phasesweep._gallery._fit import Check, Fit, fraction_interval, slope_interval
from phasesweep._gallery._result import Result, Size
from phasesweep._gallery.results import transversal

#: The region labels: Theorem 2.4's two, and the rest (its conclusion not stated there).
GROWS, SHRINKS, BETWEEN = "E⁻", "U⁺", "between"

#: A run keeps (2.20)/(2.21) when each inequality holds to within this fraction of its
#: |Y_T − Y_0|: gradient descent departs from the flow by O(lr) relative to the change.
PER_RUN_TOLERANCE = 0.01

SQL = """\
WITH norms AS (
    SELECT run_id, step, exp(sum(ln(fro_norm))) AS w_norm
    FROM layers WHERE sweep = {sweep} GROUP BY run_id, step
),
ends AS (
    SELECT t.run_id, max(t.time) AS t_final,
           arg_min(t.transversal_grad_sq, t.step) AS wy_sq_0,
           arg_max(t.transversal_grad_sq, t.step) AS wy_sq_t,
           arg_min(n.w_norm, t.step) AS w_norm_0,
           arg_max(n.w_norm, t.step) AS w_norm_t
    FROM trajectories t JOIN norms n USING (run_id, step)
    WHERE t.sweep = {sweep} GROUP BY t.run_id
)
SELECT r.depth, r.init_scale, r.seed, r.lr, e.t_final, e.wy_sq_0, e.wy_sq_t, e.w_norm_0,
       e.w_norm_t,
       0.5 * ln(e.wy_sq_t / e.wy_sq_0) AS dlog_wy,
       ln(e.w_norm_t / e.w_norm_0) AS dlog_w,
       json_extract(r.config, '$.model') AS model_config,
       json_extract(r.config, '$.data') AS data_config
FROM runs r JOIN ends e USING (run_id)
WHERE r.sweep = {sweep} AND r.status = 'completed' AND r.activation = 'linear'
  AND NOT r.bias AND r.noise_sigma = 0 AND r.parameterization = 'standard'
  AND json_extract_string(r.config, '$.model.init') IN ('balanced', 'balanced_rank_one')
ORDER BY r.depth, r.init_scale, r.seed"""


def initial_outputs(model_config: str, data_config: str, seed: int) -> np.ndarray:
    """The run's f₀, the labels g and the least-squares fit f* on its training inputs,
    rebuilt from its model and data config JSON and its seed: (3, N)."""
    from phasesweep.pipeline.data._datasets import data_seed, make_dataset
    from phasesweep.pipeline.spec import DataConfig, ModelConfig
    from phasesweep.pipeline.train._init import init_params
    from phasesweep.pipeline.train._models import EnsembleMLP

    data = DataConfig.model_validate(json.loads(data_config))
    model = ModelConfig.model_validate(json.loads(model_config))
    ds = make_dataset(data, data_seed(data, seed))
    net = EnsembleMLP(model, ds.x_train.shape[1], ds.y_train.shape[1])
    f0 = net(init_params(net, [model], [seed]), ds.x_train[None])[0, :, 0].numpy()
    x, g = ds.x_train.numpy(), ds.y_train[:, 0].numpy()
    # the codimension's columns are zero (up to a rotation's rounding): left out by rcond
    fit = x @ np.linalg.lstsq(x, g, rcond=1e-8)[0]
    return np.stack([f0, g, fit])


def region(f0: np.ndarray, g: np.ndarray, fit: np.ndarray) -> str:
    """Theorem 2.4's region of an init from its outputs on the training inputs (each (N,)):
    E⁻ where s = ⟨f₀²⟩ − ⟨f₀ g⟩ < 0, U⁺ beyond H (⟨f₀ g⟩ > ⟨f* g⟩), else between."""
    if np.mean(f0 * f0) < np.mean(f0 * g):
        return GROWS
    return SHRINKS if np.mean(f0 * g) > np.mean(fit * g) else BETWEEN


def with_regions(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with each run's initial ``region`` (:func:`region` of its rebuilt init)."""
    regions = [
        region(*initial_outputs(row.model_config, row.data_config, row.seed))
        for row in frame.itertuples()
    ]
    return frame.assign(region=regions)


def theorem_terms(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame (with its ``region`` column) and Theorem 2.4's two sides over Y_0:
    ``change`` = (Y_T − Y_0)/Y_0 and ``bound``, the middle term of (2.20) in U⁺, of (2.21)
    in E⁻ (NaN between), and whether the run ``kept`` both inequalities (each to
    ``PER_RUN_TOLERANCE`` of |change|)."""
    y0, yt = frame.wy_sq_0, frame.wy_sq_t
    x0, xt = frame.w_norm_0**2 - y0, frame.w_norm_t**2 - yt
    depth = frame.depth
    from_init = (depth - 1) * y0 / (depth * x0 + y0) * (xt - x0)
    from_end = (depth - 1) * yt / (depth * xt + yt) * (xt - x0)
    out = frame.assign(change=(yt - y0) / y0)
    grows, shrinks = out.region == GROWS, out.region == SHRINKS
    out["bound"] = np.where(shrinks, from_init / y0, np.where(grows, from_end / y0, np.nan))
    slack = PER_RUN_TOLERANCE * out.change.abs()
    sign = np.where(grows, 1.0, -1.0)  # E⁻: change ≥ bound ≥ 0; U⁺: change ≤ bound ≤ 0
    out["kept"] = (sign * (out.change - out.bound) >= -slack) & (sign * out.bound >= -slack)
    return out


def _theorem_check(terms: pd.DataFrame, which: str, equation: str) -> Check:
    """The fraction of the depth ≥ 2 runs from region ``which`` that break ``equation``."""
    deep = terms[terms.depth >= 2]
    runs = deep[deep.region == which]
    broken = int((~runs.kept).sum())
    fit = fraction_interval(broken, len(runs)) if len(runs) else Fit(*[np.nan] * 3, 0.0, 0)
    return Check(
        f"depth ≥ 2, from {which} ({len(runs)} of {len(deep)} runs, "
        f"{int((deep.region == BETWEEN).sum())} between not checked): fraction breaking "
        f"({equation})",
        fit,
        0.0,
        0.15,
        "none broken in ≥ 23 runs bounds it below 0.15 at 95 %",
        bound="below",
    )


def judge(terms: pd.DataFrame) -> list[Check]:
    """The checks of :func:`theorem_terms`' frame: Theorem 2.4 per run (the fraction of the
    E⁻ and of the U⁺ runs at depth ≥ 2 that break (2.21), (2.20): its 95 % interval below
    0.15), and per depth the slope of Δ log‖w_y‖ on Δ log‖w‖ over all its runs against
    (L − 1)/L."""
    checks = [_theorem_check(terms, GROWS, "2.21"), _theorem_check(terms, SHRINKS, "2.20")]
    for depth, grp in terms.groupby("depth"):
        checks.append(
            Check(
                f"depth {depth}: slope of Δ log‖w_y‖ on Δ log‖w‖ ({len(grp)} runs)",
                slope_interval(grp.dlog_w, grp.dlog_wy),
                (depth - 1) / depth,
                0.01,
                "GD's O(lr) drift from the balanced flow (2.5)",
            )
        )
    return checks


def measure(frame: pd.DataFrame) -> list[Check]:
    """:func:`judge` of the SQL's frame, its regions rebuilt."""
    return judge(theorem_terms(with_regions(frame)))


def draw(frame: pd.DataFrame, checks: list[Check]):  # noqa: ANN201 (a matplotlib Figure)
    import matplotlib.pyplot as plt
    from phasesweep.analysis._style import palette

    from phasesweep._gallery._figure import fit_label

    terms = theorem_terms(with_regions(frame))
    depths = sorted(terms.depth.unique())
    colours = dict(zip(depths, palette(len(depths))))
    markers = {GROWS: "^", SHRINKS: "v", BETWEEN: "o"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), layout="constrained")
    deep = terms[(terms.depth >= 2) & (terms.region != BETWEEN)]
    for (depth, which), grp in deep.groupby(["depth", "region"]):
        left.plot(
            grp.bound,
            grp.change / grp.bound,
            markers[which],
            ms=4,
            color=colours[depth],
            label=f"L = {depth}, from {which} ({len(grp)})",
        )
    left.axhline(1.0, color="k", ls="--", lw=1, label="Theorem 2.4: ratio ≥ 1")
    left.axhspan(0.0, 1.0, color="0.92", zorder=0)
    left.text(0.5, 0.25, "broken", transform=left.transAxes, ha="center", color="0.5")
    left.axvline(0.0, color="0.7", lw=0.5)
    left.set_xscale("symlog", linthresh=1e-2)
    left.set(
        ylim=(0.0, None),
        xlabel="middle term of (2.20) (U⁺, ≤ 0) / (2.21) (E⁻, ≥ 0), over ‖w_y(0)‖²",
        ylabel="(‖w_y(T)‖² − ‖w_y(0)‖²) / middle term",
    )
    left.set_title("Theorem 2.4 per run: ‖w_y‖ shrinks from U⁺, grows from E⁻")
    left.legend(fontsize=6, ncols=2)
    slopes = {c.label.split(":")[0]: c.fit for c in checks}
    for depth, grp in terms.groupby("depth"):
        for which, part in grp.groupby("region"):
            right.plot(
                part.dlog_w,
                part.dlog_wy,
                markers[which],
                ms=4,
                mfc="none" if which == BETWEEN else colours[depth],
                color=colours[depth],
            )
        ends = np.array([grp.dlog_w.min(), grp.dlog_w.max()])
        theory = f"{depth - 1}/{depth}" if depth > 1 else "0"
        right.plot(
            ends,
            (depth - 1) / depth * ends,
            "-",
            lw=1,
            color=colours[depth],
            label=fit_label(f"L = {depth}: slope", slopes[f"depth {depth}"], theory),
        )
    for which, marker in markers.items():
        hollow = "none" if which == BETWEEN else "0.4"
        right.plot([], [], marker, color="0.4", mfc=hollow, label=f"from {which}")
    right.axhline(0.0, color="0.7", lw=0.5)
    right.axvline(0.0, color="0.7", lw=0.5)
    right.set(xlabel="Δ log‖w‖ (0 → T)", ylabel="Δ log‖w_y‖ (0 → T)")
    right.set_title("(2.17): d log‖w_y‖ = (1 − 1/L) d log‖w‖ (lines: theory)")
    right.legend(fontsize=6)
    return fig


RESULT = Result(
    name="depth_region",
    seed="000",
    paper=transversal.RESULT.paper,  # the same paper
    reproduces=(
        "at σ = 0 depth grows ‖w_y‖ from E⁻ and shrinks it from U⁺, by the fraction 1 − 1/L "
        "of the end-to-end change; regression (L = 1) leaves it (eq. 2.17, Lemma 2.1, "
        "Theorem 2.4: eqs. 2.20–2.21, Fig. 2.7)"
    ),
    sweep="lowdim_noise",
    conditions=(
        "bias-free linear nets of depth 1–4, width 4, balanced rank-one init (2.5) "
        "‖W_l(0)‖_F = g, g = 0.4–2 (‖w(0)‖ = g^L), standard parameterization; subspace "
        "data: 2-d subspace of R^10 (rotated), σ = 0, N = 64, tanh teacher on z; full-batch "
        "GD lr 5e-4 to t = 5; ‖w_y‖² = ‖P⊥ ∇ₓ f‖², ‖w‖ = Π‖W_l‖_F at the first and last "
        "logged step; regions from the init rebuilt on the training inputs; Theorem 2.4 "
        f"per run to {PER_RUN_TOLERANCE:g} of |ΔY|, runs between E⁻ and U⁺ left out"
    ),
    sql=SQL,
    default=Size(
        (
            "model.init=balanced",
            "model.parameterization=standard",
            "model.width=4",
            "grid={activation: [linear], noise_sigma: [0.0], depth: [1, 2, 3, 4], "
            "init_scale: {logspace: [-0.4, 0.3, 8]}, seed: {range: [0, 12]}}",
            "train.lr=0.0005",
            "train.steps=10000",
            "train.log_points=30",
        ),
        0.7,
    ),
    full=Size(
        (
            "model.init=balanced",
            "model.parameterization=standard",
            "model.width=4",
            "grid={activation: [linear], noise_sigma: [0.0], depth: [1, 2, 3, 4, 5, 6], "
            "init_scale: {logspace: [-0.4, 0.3, 15]}, seed: {range: [0, 24]}}",
            "train.lr=0.00002",
            "train.steps=250000",
            "train.log_points=60",
        ),
        40.0,
    ),
    measure=measure,
    draw=draw,
    caveat=(
        "Most inits start between E⁻ and U⁺, where Theorem 2.4 says nothing (the rank-one "
        "init's random sign puts about half of all at ⟨f₀ g⟩ < 0): drawn, and in the depth "
        "law, which holds in every region. Assumption 2.2 (the path never crosses E) is not "
        "checked: the store keeps no w(t), so every run of a region counts. The same g "
        "starts deeper nets farther out (‖w(0)‖ = g^L), so depths are compared through the "
        "rate 1 − 1/L, not at one w(0) as in Fig. 2.7."
    ),
)
