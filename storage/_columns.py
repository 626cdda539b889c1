"""The :class:`Column` declaration of the store's columns, and the columns of its tables
without metrics: ``runs``, ``plateaus``, ``scaling_fits``, ``boundaries`` and
``gallery_checks``.

:mod:`storage.schema` (public) declares the metric tables (``trajectories``, ``layers``,
``summaries``), assembles every table from its declarations and re-exports the public
names of this module; it is the one to import.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa

F64 = pa.float64()
I64 = pa.int64()

#: Loss fractions whose first crossing time is recorded, and their column names.
CROSSING_FRACTIONS: tuple[float, ...] = (0.99, 0.9, 0.5, 0.1, 0.01)
CROSSING_COLUMNS: tuple[str, ...] = tuple(
    f"t_cross_{round(f * 100):03d}" for f in CROSSING_FRACTIONS
)

#: ``runs`` columns besides depth that split the scaling fits where they are grid axes;
#: ``scaling_fits`` holds the group's value of each (NULL: not a grid axis).
FIT_GROUP_COLUMNS: tuple[str, ...] = ("width", "activation", "noise_sigma", "lr")

#: ``runs`` columns that ``boundaries`` holds typed, the line's value of each (NULL: not
#: an axis of the line).
LINE_COLUMNS: tuple[str, ...] = ("width", "depth", "noise_sigma", "lr", "activation", "n_train")


class ColumnDoc(NamedTuple):
    """What a store column means, its unit, and when it is NULL (docs/reference/store.md)."""

    meaning: str
    unit: str = ""
    null: str = "never"


class Column(NamedTuple):
    """One column of a store table, declared once: everything else about it is derived.

    ``meaning``, ``unit`` and ``null`` are its :class:`ColumnDoc`. ``label``: the axis or
    colour-bar label of figures that show it, with what it is and its unit
    (``analysis._style.label``; empty: the name with spaces). For a ``summaries`` column:
    ``final_of`` names the ``trajectories`` column whose last finite value it holds
    (``analyze`` reads that column of every run); ``phase`` makes it a phase-diagram value,
    named as ``final_of`` (else as the column itself); ``from_zero``: the value is 0 for a
    run that did not move, so a linear colour scale of it starts at 0.
    """

    name: str
    type: pa.DataType
    meaning: str
    unit: str = ""
    null: str = "never"
    label: str = ""
    final_of: str = ""
    phase: bool = False
    from_zero: bool = False

    @property
    def doc(self) -> ColumnDoc:
        return ColumnDoc(self.meaning, self.unit, self.null)


TIME_UNIT = "gradient-flow time t = Σ_k lr_k (lr after schedules and lr_scaling)"
LOSS_UNIT = "loss L = 1/(2n) Σ_i ‖f(x_i) − y_i‖²"
FAILED = "failed runs"
SWEEP = ColumnDoc("sweep name (the partition directory sweep=NAME)")
RUN_ID = Column(
    "run_id",
    pa.string(),
    "deterministic id of the grid point: hash of sweep name and resolved config",
)
ATTEMPT = Column("attempt", pa.string(), "id of the chunk attempt that wrote the row (debugging)")

RUNS_COLUMNS: tuple[Column, ...] = (
    RUN_ID,
    ATTEMPT,
    Column("chunk_id", pa.string(), "id of the chunk (ensemble) the run trained in"),
    Column(
        "status",
        pa.string(),
        "'completed' | 'diverged' (loss above train.divergence_factor × L0 or not finite) "
        "| 'failed' (its trial failed after all retries; a relaunch trains it again)",
    ),
    Column(
        "init_scale",
        F64,
        "model.init_scale: multiplier of every layer's initial weights",
        label="init scale α  (× the parameterization's init std)",
    ),
    Column(
        "width",
        I64,
        "model.width: units per hidden layer",
        label="width  (hidden units per layer)",
    ),
    Column(
        "depth",
        I64,
        "model.depth: number of weight matrices (2 = one hidden layer)",
        label="depth  (weight matrices)",
    ),
    Column(
        "noise_sigma",
        F64,
        "data.noise_sigma",
        "input units",
        label="noise σ  (std in the codimension)",
    ),
    Column(
        "lr", F64, "train.lr as given (before lr_scaling and schedules)", label="learning rate η"
    ),
    Column("seed", I64, "train.seed"),
    Column("activation", pa.string(), "model.activation"),
    Column("bias", pa.bool_(), "model.bias"),
    Column("parameterization", pa.string(), "model.parameterization"),
    Column("data_kind", pa.string(), "data.kind"),
    Column("steps", I64, "train.steps: steps asked for", "steps"),
    Column(
        "config",
        pa.string(),
        "the run's resolved config (model, data, train, metrics) as JSON",
    ),
    Column(
        "final_train_loss",
        F64,
        "train loss at the last step",
        LOSS_UNIT,
        "diverged and failed runs",
    ),
    Column(
        "final_test_loss", F64, "test loss at the last step", LOSS_UNIT, "diverged and failed runs"
    ),
    Column(
        "wall_seconds",
        F64,
        "chunk wall time / chunk size (members train together)",
        "seconds",
        FAILED,
    ),
    Column("device", pa.string(), "'cpu' or the GPU's name", "", FAILED),
    Column(
        "finished_at",
        pa.timestamp("us", tz="UTC"),
        "when the chunk finished",
        "UTC timestamp",
    ),
    # additions
    Column("input_dim", I64, "data.input_dim: input features", "", FAILED),
    Column("n_train", I64, "data.n_train: training points", label="training points n"),
    Column(
        "leaky_slope",
        F64,
        "model.leaky_slope (used by leaky_relu only)",
        label="leaky-ReLU slope",
    ),
    Column("optimizer", pa.string(), "train.optimizer: 'gd' | 'sgd'"),
    Column("initial_train_loss", F64, "train loss at step 0 (L0)", LOSS_UNIT, FAILED),
    Column(
        "final_step",
        I64,
        "last step trained (the divergence step for diverged runs)",
        "steps",
        FAILED,
    ),
    Column("final_time", F64, "gradient-flow time at final_step", TIME_UNIT, FAILED),
    Column(
        "init_fro_norms",
        pa.list_(F64),
        "realised ‖W_l(0)‖_F of layers 1..depth (list)",
        "",
        FAILED,
    ),
    *(
        Column(
            c,
            F64,
            f"first time the train loss falls below {f:g} × L0, checked at every step "
            "(interpolated in t between steps)",
            TIME_UNIT,
            "the loss never got there (or failed runs)",
        )
        for c, f in zip(CROSSING_COLUMNS, CROSSING_FRACTIONS)
    ),
    Column("chunk_size", I64, "members of the run's chunk", "count", FAILED),
    Column("chunk_wall_seconds", F64, "wall time of the whole chunk", "seconds", FAILED),
    Column("error", pa.string(), "error message of a failed run", "", "runs that did not fail"),
    Column(
        "torch_threads",
        I64,
        "torch intra-op threads the trial trained with (= its CPUs)",
        "count",
        FAILED,
    ),
    Column(
        "node_id", pa.string(), "Ray node that trained the run", "", "outside Ray, or failed runs"
    ),
    Column("lr_effective", F64, "train.lr after the spec's lr_scaling rule (before schedules)"),
)

PLATEAUS_COLUMNS: tuple[Column, ...] = (
    RUN_ID,
    Column("level", F64, "loss on the plateau", LOSS_UNIT),
    Column("start", F64, "start of the plateau", TIME_UNIT),
    Column("end", F64, "end of the plateau (the drop begins)", TIME_UNIT),
    Column("duration", F64, "end − start", TIME_UNIT),
    # additions (analysis)
    Column("plateau_index", I64, "0-based order within the run (0: the plateau at L0)"),
    Column("drop_frac", F64, "relative loss decrease of the drop that ends the plateau", "0..1"),
    Column("contrast", F64, "peak loss-decay rate of that drop / rate on the plateau", "ratio"),
)

SCALING_FITS_COLUMNS: tuple[Column, ...] = (
    Column("depth", I64, "depth of the fitted runs"),
    Column(
        "x",
        pa.string(),
        "'log_init_scale' | 'log_inv_init_scale' | 'log_log_inv_init_scale' (what slope "
        "differentiates by)",
    ),
    Column("slope", F64, "fitted d y / d x"),
    Column("ci_low", F64, "lower end of the confidence interval of slope", "", "too few seeds"),
    Column("ci_high", F64, "upper end of the confidence interval", "", "too few seeds"),
    Column("theory_slope", F64, "slope the theory predicts", "", "the theory gives none"),
    Column("n_points", I64, "runs fitted", "count"),
    Column("n_seeds", I64, "seeds among them", "count"),
    # additions (analysis)
    Column("y", pa.string(), "'log_escape_time' | 'escape_time'"),
    Column("intercept", F64, "y = intercept + slope × x"),
    Column("eps", F64, "eps of the escape times fitted"),
    # the other grid axes of the group (FIT_GROUP_COLUMNS; NULL: not a grid axis)
    Column("width", I64, "the group's width", "", "width is not a grid axis"),
    Column("activation", pa.string(), "the group's activation", "", "not a grid axis"),
    Column("noise_sigma", F64, "the group's noise_sigma", "", "not a grid axis"),
    Column("lr", F64, "the group's lr", "", "not a grid axis"),
    Column("init_scale_min", F64, "smallest init scale fitted"),
    Column("init_scale_max", F64, "largest init scale fitted"),
    Column("ci_method", pa.string(), "'seeds_t' (t-interval of per-seed slopes) | 'ols_t'"),
    Column("confidence", F64, "confidence level of the interval (analysis.fit_confidence)"),
    Column(
        "theory", pa.string(), "the law the theory slope comes from", "", "the theory gives none"
    ),
)

_RUN_TYPES = {c.name: c.type for c in RUNS_COLUMNS}

#: ``phasesweep refine``: one row per line (value of the grid axes other than the searched
#: one and the seeds) per refinement (metric, level, axis); partition: the refinement sweep.
BOUNDARIES_COLUMNS: tuple[Column, ...] = (
    Column("parent", pa.string(), "the sweep refined"),
    Column(
        "metric",
        pa.string(),
        "the order parameter: final value of a trajectories or runs column",
    ),
    Column("level", F64, "the level whose crossing is sought", "metric's unit"),
    Column("axis", pa.string(), "the searched grid axis (as the parent's grid names it)"),
    Column("axis_scale", pa.string(), "'log' (searched in log10) | 'linear'"),
    Column("line", pa.string(), "JSON of the line's values of the other grid axes"),
    *(
        Column(k, _RUN_TYPES[k], f"the line's {k}", "", "not an axis of the line")
        for k in LINE_COLUMNS
    ),
    Column(
        "boundary",
        F64,
        "where the seed-mean metric crosses the level, interpolated in the bracket",
        "axis unit",
        "not bracketed",
    ),
    Column(
        "bracket_low",
        F64,
        "lower end of the bracket (the seed mean lies on opposite sides of the level at its "
        "two ends, with no measured point between)",
        "axis unit",
        "not bracketed",
    ),
    Column("bracket_high", F64, "upper end of the bracket", "axis unit", "not bracketed"),
    Column(
        "seed_boundaries",
        pa.list_(F64),
        "each seed's own crossing inside the bracket (list)",
        "axis unit",
        "not bracketed",
    ),
    Column(
        "seed_spread",
        F64,
        "sample std of seed_boundaries (log10 units on a log axis)",
        "axis unit or decades",
        "fewer than two seed crossings",
    ),
    Column("bracketed", pa.bool_(), "whether the level is crossed within the axis range"),
    Column(
        "side",
        pa.string(),
        "'above' | 'below': the metric's side of the level over the whole range",
        "",
        "bracketed",
    ),
    Column("converged", pa.bool_(), "bracketed and the bracket is at most tol wide"),
    Column("tol", F64, "bracket width that ends a line (log10 units on a log axis)"),
    Column("axis_low", F64, "lowest axis value searched", "axis unit"),
    Column("axis_high", F64, "highest axis value searched", "axis unit"),
    Column("n_runs", I64, "runs of the line used (parent's and refinement's)", "count"),
    Column("n_refine_runs", I64, "of which trained by the refinement", "count"),
)

#: ``phasesweep gallery``: one row per check of a gallery result evaluated on the sweep
#: (``phasesweep._gallery._fit.Check``), with the state of the sweep's runs it read.
GALLERY_CHECKS_COLUMNS: tuple[Column, ...] = (
    Column("result", pa.string(), "the gallery result (`phasesweep gallery --list`)"),
    Column("seed_text", pa.string(), "the seed text it reproduces (000 … 004)"),
    Column("paper", pa.string(), "the paper (authors, year) and the equation or figure"),
    Column("label", pa.string(), "what the check measures"),
    Column("estimate", F64, "the fitted value (a slope, an exponent or a ratio)"),
    Column("ci_low", F64, "lower end of its confidence interval"),
    Column("ci_high", F64, "upper end of its confidence interval"),
    Column("confidence", F64, "confidence level of the interval"),
    Column("n_points", I64, "points fitted", "count"),
    Column("expected", F64, "the paper's value"),
    Column("tolerance", F64, "how far the interval may miss expected and still pass"),
    Column("why_tolerance", pa.string(), "where the tolerance comes from"),
    Column(
        "bound",
        pa.string(),
        "'equal' (the interval within tolerance of expected) | 'upper' (its low end at most "
        "expected + tolerance)",
    ),
    Column("passed", pa.bool_(), "whether the check passed"),
    Column("figure", pa.string(), "path of the figure's PNG as written", "", "not drawn"),
    Column("evaluated_at", pa.timestamp("us", tz="UTC"), "when the check ran", "UTC timestamp"),
    # the state of the sweep it read: the row is current while the sweep's runs still have
    # this count and latest finished_at (a new, extended or retrained run changes them)
    Column("source_runs", I64, "runs of the sweep when the check ran (any status)", "count"),
    Column(
        "source_finished_at",
        pa.timestamp("us", tz="UTC"),
        "latest runs.finished_at of the sweep when the check ran",
        "UTC timestamp",
        "no run recorded a finish time",
    ),
    Column(
        "source_missing_points",
        I64,
        "grid points of the sweep not done when the check ran (failed after retries, or not "
        "yet trained): the checks read the rest, and the result is INCOMPLETE",
        "count",
        "checked before this column existed",
    ),
)
