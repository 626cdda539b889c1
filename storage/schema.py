"""Arrow schemas of the store's tables: the public contract of DESIGN.md, plus additions.

Every table is hive-partitioned by ``sweep`` (the partition value lives in the
directory name ``sweep=NAME``, not inside the files). Every row written by a
chunk also carries ``attempt``: the id of the chunk attempt that wrote it. A
run's rows are visible through the catalog only if the ``runs`` table holds the
same ``(run_id, attempt)`` pair, so rows of an attempt that crashed before its
``runs`` file was committed are never seen and never duplicated.

Columns that do not apply to a run are NULL, never a made-up number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

F64 = pa.float64()
I64 = pa.int64()

#: Loss fractions whose first crossing time is recorded, and their column names.
CROSSING_FRACTIONS: tuple[float, ...] = (0.99, 0.9, 0.5, 0.1, 0.01)
CROSSING_COLUMNS: tuple[str, ...] = tuple(
    f"t_cross_{round(f * 100):03d}" for f in CROSSING_FRACTIONS
)

#: Escape-time eps always computed by ``analyze``, and their summaries columns.
ESCAPE_EPS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9)
ESCAPE_COLUMNS: tuple[str, ...] = tuple(f"escape_time_{round(e * 100):03d}" for e in ESCAPE_EPS)

#: ``runs`` columns besides depth that split the scaling fits where they are grid axes;
#: ``scaling_fits`` holds the group's value of each (NULL: not a grid axis).
FIT_GROUP_COLUMNS: tuple[str, ...] = ("width", "activation", "noise_sigma", "lr")

#: ``runs`` columns that ``boundaries`` holds typed, the line's value of each (NULL: not
#: an axis of the line).
LINE_COLUMNS: tuple[str, ...] = ("width", "depth", "noise_sigma", "lr", "activation", "n_train")

RUNS = pa.schema(
    [
        ("run_id", pa.string()),
        ("attempt", pa.string()),
        ("chunk_id", pa.string()),
        ("status", pa.string()),  # 'completed' | 'diverged' | 'failed'
        ("init_scale", F64),
        ("width", I64),
        ("depth", I64),
        ("noise_sigma", F64),
        ("lr", F64),
        ("seed", I64),
        ("activation", pa.string()),
        ("bias", pa.bool_()),
        ("parameterization", pa.string()),
        ("data_kind", pa.string()),
        ("steps", I64),
        ("config", pa.string()),  # JSON of the resolved config
        ("final_train_loss", F64),
        ("final_test_loss", F64),
        ("wall_seconds", F64),  # chunk wall time / chunk size (members train together)
        ("device", pa.string()),
        ("finished_at", pa.timestamp("us", tz="UTC")),
        # additions
        ("input_dim", I64),
        ("n_train", I64),
        ("leaky_slope", F64),
        ("optimizer", pa.string()),
        ("initial_train_loss", F64),
        ("final_step", I64),  # last step trained (the divergence step for diverged runs)
        ("final_time", F64),  # gradient-flow time at final_step
        ("init_fro_norms", pa.list_(F64)),  # realised ||W_l(0)||_F, layer 1..depth
        *((c, F64) for c in CROSSING_COLUMNS),  # first t with train loss < frac * L0
        ("chunk_size", I64),
        ("chunk_wall_seconds", F64),
        ("error", pa.string()),  # message of a failed run, else NULL
        ("torch_threads", I64),  # intra-op threads the trial trained with (= its CPUs)
        ("node_id", pa.string()),  # Ray node that trained the run (NULL outside Ray)
        ("lr_effective", F64),  # train.lr after the spec's lr_scaling rule (before schedules)
    ]
)


def log_steps(steps: int, log_points: int) -> np.ndarray:
    """About ``log_points`` log-spaced steps in [0, steps], 0 and ``steps`` included, unique.

    The steps ``train.log_points`` logs (``trajectories`` rows of a run that does not
    diverge): step 0, then ``log_points - 1`` steps rounded from a geometric sequence
    from 1 to ``steps``, then ``steps`` itself, duplicates dropped. Sorted, int64."""
    inner = np.round(np.logspace(0, np.log10(steps), max(log_points - 1, 1))).astype(np.int64)
    return np.unique(np.concatenate([[0], inner, [steps]]))


TRAJECTORIES = pa.schema(
    [
        ("run_id", pa.string()),
        ("attempt", pa.string()),
        ("step", I64),
        ("time", F64),  # gradient-flow time sum_k lr_k
        ("train_loss", F64),
        ("test_loss", F64),
        ("param_rel_change", F64),  # ||theta(t)-theta(0)|| / ||theta(0)||
        ("kernel_distance", F64),  # 1 - cos(K_t, K_0), empirical NTK on the probe set
        ("act_flip_frac", F64),
        ("transversal_grad_sq", F64),  # subspace data only
        # additions
        ("kernel_alignment", F64),  # <K, yy^T>_F / (||K||_F ||y||^2) on the probe set
        ("ntk_eig_min", F64),
        ("ntk_eig_max", F64),
        ("dead_frac", F64),  # fraction of hidden units inactive on every probe input
        ("grad_norm", F64),  # ||grad_theta L||
        ("param_norm", F64),  # ||theta||
        ("output_norm", F64),  # RMS of f over the probe set
        ("even_part_frac", F64),  # symmetric data: ||f_even|| / ||f|| on the probe set
        ("kernel_rel_change", F64),  # ||K_t - K_0||_F / ||K_0||_F on the probe set
        # the kernel predictor: the linearized model at init trained by gradient flow to the
        # same t (closed form, NTK at init); on the probe set, one output only
        ("probe_test_loss", F64),  # the net's loss 1/(2P) sum ||f - y||^2 on the probe set
        ("lin_test_loss", F64),  # the same loss of the linearized model
        ("lin_distance", F64),  # RMS of f - f_lin over the probe set
    ]
)

LAYERS = pa.schema(
    [
        ("run_id", pa.string()),
        ("attempt", pa.string()),
        ("step", I64),
        ("layer", pa.int32()),  # 1-based from the input
        ("fro_norm", F64),
        ("rel_change", F64),  # ||W_l(t)-W_l(0)||_F / ||W_l(0)||_F
        ("top_sv", pa.list_(F64)),  # largest singular values of W_l(t), descending
        ("stable_rank", F64),  # ||W||_F^2 / ||W||_2^2
        ("balance_defect", F64),  # NULL for the last layer
        ("delta_top_sv", pa.list_(F64)),  # largest singular values of W_l(t) - W_l(0)
    ]
)

SUMMARIES = pa.schema(
    [
        ("run_id", pa.string()),
        ("regime", pa.string()),  # 'lazy' | 'rich' | 'diverged' | 'not_converged'
        ("escape_time", F64),
        ("n_plateaus", I64),
        ("final_param_rel_change", F64),
        ("final_kernel_distance", F64),
        # additions (analysis)
        ("order_parameter", pa.string()),  # name of the order parameter the regime used
        ("order_value", F64),  # its value at eval_time (NULL if neither parameter was logged)
        ("lazy_threshold", F64),  # the threshold it was compared with
        ("initial_train_loss", F64),  # first logged train loss (L0)
        ("final_train_loss", F64),  # last logged finite train loss
        ("loss_ratio", F64),  # final / initial train loss
        ("final_time", F64),  # gradient-flow time of the last logged point
        ("final_test_loss", F64),
        ("final_act_flip_frac", F64),
        ("final_transversal_grad_sq", F64),
        ("escape_eps", F64),  # the eps of escape_time
        *((c, F64) for c in ESCAPE_COLUMNS),  # escape times at ESCAPE_EPS
        ("extra_escape_eps", pa.list_(F64)),  # analysis.extra_escape_eps
        ("extra_escape_times", pa.list_(F64)),  # escape times at those eps, same order
        # the time the regime rule read the run at (analysis.at_time, else final_time), and
        # the values it read there (NULL: the run stopped before analysis.at_time)
        ("eval_time", F64),
        ("eval_loss_ratio", F64),  # train loss / initial train loss at eval_time
        ("eval_param_rel_change", F64),
        ("eval_kernel_distance", F64),
        # the kernel predictor at the last logged point (trajectories.lin_*)
        ("final_lin_test_loss", F64),
        ("final_lin_distance", F64),
    ]
)

PLATEAUS = pa.schema(
    [
        ("run_id", pa.string()),
        ("level", F64),
        ("start", F64),
        ("end", F64),
        ("duration", F64),
        # additions (analysis)
        ("plateau_index", I64),  # 0-based order within the run (0: the plateau at L0)
        ("drop_frac", F64),  # relative loss decrease of the drop that ends the plateau
        ("contrast", F64),  # peak loss-decay rate of that drop / rate on the plateau
    ]
)

#: Tables written by training chunks, in commit order: ``runs`` goes last, it is the commit.
CHUNK_TABLES: dict[str, pa.Schema] = {
    "trajectories": TRAJECTORIES,
    "layers": LAYERS,
    "runs": RUNS,
}

SCALING_FITS = pa.schema(
    [
        ("depth", I64),
        ("x", pa.string()),  # 'log_init_scale' | 'log_inv_init_scale' | 'log_log_inv_init_scale'
        ("slope", F64),  # fitted d log(escape_time) / d x
        ("ci_low", F64),
        ("ci_high", F64),
        ("theory_slope", F64),  # NULL where the theory gives none
        ("n_points", I64),
        ("n_seeds", I64),
        # additions (analysis)
        ("y", pa.string()),  # 'log_escape_time' | 'escape_time' (what slope differentiates)
        ("intercept", F64),  # y = intercept + slope * x
        ("eps", F64),  # eps of the escape times fitted
        ("width", I64),  # the other grid axes of the group (NULL: not a grid axis)
        ("activation", pa.string()),
        ("noise_sigma", F64),
        ("lr", F64),
        ("init_scale_min", F64),
        ("init_scale_max", F64),
        ("ci_method", pa.string()),  # 'seeds_t' (t-interval of per-seed slopes) | 'ols_t'
        ("confidence", F64),
        ("theory", pa.string()),  # the law the theory slope comes from
    ]
)

#: ``phasesweep refine``: one row per line (value of the grid axes other than the searched
#: one and the seeds) per refinement (metric, level, axis); partition: the refinement sweep.
BOUNDARIES = pa.schema(
    [
        ("parent", pa.string()),  # the sweep refined
        ("metric", pa.string()),  # final value of a trajectories (or runs) column
        ("level", F64),
        ("axis", pa.string()),  # the searched axis (as the parent's grid names it)
        ("axis_scale", pa.string()),  # 'log' (searched in log10) | 'linear'
        ("line", pa.string()),  # JSON of the line's other grid axes
        ("width", I64),  # the line's value of these axes (NULL: not a line axis)
        ("depth", I64),
        ("noise_sigma", F64),
        ("lr", F64),
        ("activation", pa.string()),
        ("n_train", I64),
        ("boundary", F64),  # crossing of the seed-mean metric, interpolated in the bracket
        ("bracket_low", F64),  # axis values of the bracket: the metric's seed mean
        ("bracket_high", F64),  # is on opposite sides of the level at its two ends
        ("seed_boundaries", pa.list_(F64)),  # each seed's crossing in the bracket
        ("seed_spread", F64),  # sample std of seed_boundaries, in log10 units on a log axis
        ("bracketed", pa.bool_()),  # False: no crossing within the axis range
        ("side", pa.string()),  # not bracketed: 'above' | 'below' the level everywhere
        ("converged", pa.bool_()),  # bracketed and the bracket is at most tol wide
        ("tol", F64),  # in log10 units on a log axis
        ("axis_low", F64),  # the range searched
        ("axis_high", F64),
        ("n_runs", I64),  # runs of the line used (parent and refinement)
        ("n_refine_runs", I64),  # of which trained by the refinement
    ]
)

#: Tables written by ``phasesweep analyze`` (and ``boundaries`` by ``refine``): each
#: replaces the sweep's partition whole.
ANALYSIS_TABLES: dict[str, pa.Schema] = {
    "summaries": SUMMARIES,
    "plateaus": PLATEAUS,
    "scaling_fits": SCALING_FITS,
    "boundaries": BOUNDARIES,
}

#: Every table the store writes, by name.
TABLES: dict[str, pa.Schema] = {**CHUNK_TABLES, **ANALYSIS_TABLES}


def to_table(
    name: str,
    columns: Mapping[str, Any] | pa.Table,
    n_rows: int | None = None,
    *,
    complete: bool = False,
) -> pa.Table:
    """A table with exactly the schema of store table ``name`` (:data:`TABLES`).

    The one place where values become a store table: the trainer's chunks, the
    analysis frames, synthetic sweeps and the store's own validation go through it,
    so every table agrees with the schema in column order, types and nullability.

    ``columns`` maps column names to values: Arrow arrays (cast to the column's type),
    numpy arrays, pandas Series or Python sequences (converted; NaN, None and pandas'
    NA become NULL, since a column that does not apply is NULL, never a made-up number).
    A 2-D numpy array for a list column holds one row per row, NaN-padded: each row
    becomes the list of its non-NaN values, a row of NaN only becomes NULL. A pandas
    DataFrame or an Arrow table may stand for the mapping.

    Columns not given are NULL, unless ``complete``: then every column must be given
    (the store's check of what callers hand it). ``n_rows``: the row count where no
    column is given (else it must match the columns'). Unknown or missing columns,
    columns of unequal length, and values that do not convert are a ``ValueError``
    naming table and column.
    """
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; known: {sorted(TABLES)}")
    target = TABLES[name]
    given = list(columns.column_names if isinstance(columns, pa.Table) else columns.keys())
    unknown = sorted(set(given) - set(target.names))
    missing = [c for c in target.names if c not in given] if complete else []
    if unknown or missing:
        hint = (
            " (drop 'sweep': it comes from the partition directory)" if "sweep" in unknown else ""
        )
        raise ValueError(f"{name}: unknown columns {unknown}, missing columns {missing}{hint}")
    arrays = {}
    for column in given:
        field = target.field(column)
        try:
            arrays[column] = _array(columns[column], field.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as e:
            raise ValueError(
                f"{name}.{column}: cannot store {_type_name(columns[column])} as {field.type}: "
                f"{str(e)[:200]}"
            ) from e
    lengths = {len(a) for a in arrays.values()} | ({n_rows} if n_rows is not None else set())
    if len(lengths) > 1:
        raise ValueError(f"{name}: columns of unequal lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    return pa.Table.from_arrays(
        [arrays[f.name] if f.name in arrays else pa.nulls(n, f.type) for f in target],
        schema=target,
    )


def _array(values: Any, type_: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``values`` as an Arrow array of ``type_`` (see :func:`to_table`)."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values.cast(type_)
    if isinstance(values, np.ndarray) and values.ndim == 2 and pa.types.is_list(type_):
        keep = ~np.isnan(values)
        lengths = keep.sum(1)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        flat = pa.array(values[keep], type_.value_type)
        return pa.ListArray.from_arrays(offsets, flat, type=type_, mask=pa.array(lengths == 0))
    return pa.array(values, type=type_, from_pandas=True)


def _type_name(values: Any) -> str:
    """The type of ``values`` as an error message names it (Arrow's where it has one)."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return str(values.type)
    return str(getattr(values, "dtype", type(values).__name__))


class ColumnDoc(NamedTuple):
    """What a store column means, its unit, and when it is NULL (docs/reference/store.md)."""

    meaning: str
    unit: str = ""
    null: str = "never"


_T = "gradient-flow time t = Σ_k lr_k (lr after schedules and lr_scaling)"
_LOSS = "loss L = 1/(2n) Σ_i ‖f(x_i) − y_i‖²"
_FAILED = "failed runs"
_SPECTRA = (
    "metrics.spectra false, or at logged steps metrics.spectra_budget leaves out, or failed runs"
)
_KEY = {
    "sweep": ColumnDoc("sweep name (the partition directory sweep=NAME)"),
    "run_id": ColumnDoc(
        "deterministic id of the grid point: hash of sweep name and resolved config"
    ),
    "attempt": ColumnDoc("id of the chunk attempt that wrote the row (debugging)"),
}

#: Every column of every catalog view: table -> column -> :class:`ColumnDoc`.
COLUMN_DOCS: dict[str, dict[str, ColumnDoc]] = {
    "runs": {
        **_KEY,
        "chunk_id": ColumnDoc("id of the chunk (ensemble) the run trained in"),
        "status": ColumnDoc(
            "'completed' | 'diverged' (loss above train.divergence_factor × L0 or not finite) "
            "| 'failed' (its trial failed after all retries; a relaunch trains it again)"
        ),
        "init_scale": ColumnDoc("model.init_scale: multiplier of every layer's initial weights"),
        "width": ColumnDoc("model.width: units per hidden layer"),
        "depth": ColumnDoc("model.depth: number of weight matrices (2 = one hidden layer)"),
        "noise_sigma": ColumnDoc("data.noise_sigma", "input units"),
        "lr": ColumnDoc("train.lr as given (before lr_scaling and schedules)"),
        "seed": ColumnDoc("train.seed"),
        "activation": ColumnDoc("model.activation"),
        "bias": ColumnDoc("model.bias"),
        "parameterization": ColumnDoc("model.parameterization"),
        "data_kind": ColumnDoc("data.kind"),
        "steps": ColumnDoc("train.steps: steps asked for", "steps"),
        "config": ColumnDoc("the run's resolved config (model, data, train, metrics) as JSON"),
        "final_train_loss": ColumnDoc(
            "train loss at the last step", _LOSS, "diverged and failed runs"
        ),
        "final_test_loss": ColumnDoc(
            "test loss at the last step", _LOSS, "diverged and failed runs"
        ),
        "wall_seconds": ColumnDoc(
            "chunk wall time / chunk size (members train together)", "seconds", _FAILED
        ),
        "device": ColumnDoc("'cpu' or the GPU's name", "", _FAILED),
        "finished_at": ColumnDoc("when the chunk finished", "UTC timestamp"),
        "input_dim": ColumnDoc("data.input_dim: input features", "", _FAILED),
        "n_train": ColumnDoc("data.n_train: training points"),
        "leaky_slope": ColumnDoc("model.leaky_slope (used by leaky_relu only)"),
        "optimizer": ColumnDoc("train.optimizer: 'gd' | 'sgd'"),
        "initial_train_loss": ColumnDoc("train loss at step 0 (L0)", _LOSS, _FAILED),
        "final_step": ColumnDoc(
            "last step trained (the divergence step for diverged runs)", "steps", _FAILED
        ),
        "final_time": ColumnDoc("gradient-flow time at final_step", _T, _FAILED),
        "init_fro_norms": ColumnDoc("realised ‖W_l(0)‖_F of layers 1..depth (list)", "", _FAILED),
        **{
            c: ColumnDoc(
                f"first time the train loss falls below {f:g} × L0, checked at every step "
                "(interpolated in t between steps)",
                _T,
                "the loss never got there (or failed runs)",
            )
            for c, f in zip(CROSSING_COLUMNS, CROSSING_FRACTIONS)
        },
        "chunk_size": ColumnDoc("members of the run's chunk", "count", _FAILED),
        "chunk_wall_seconds": ColumnDoc("wall time of the whole chunk", "seconds", _FAILED),
        "error": ColumnDoc("error message of a failed run", "", "runs that did not fail"),
        "torch_threads": ColumnDoc(
            "torch intra-op threads the trial trained with (= its CPUs)", "count", _FAILED
        ),
        "node_id": ColumnDoc("Ray node that trained the run", "", "outside Ray, or failed runs"),
        "lr_effective": ColumnDoc("train.lr after the spec's lr_scaling rule (before schedules)"),
    },
    "trajectories": {
        **_KEY,
        "step": ColumnDoc(
            "logged step (train.log_points log-spaced steps, 0 and the last included)", "steps"
        ),
        "time": ColumnDoc("gradient-flow time at step", _T),
        "train_loss": ColumnDoc("loss on the full training set", _LOSS, "not finite (diverging)"),
        "test_loss": ColumnDoc("loss on the test set", _LOSS, "not finite (diverging)"),
        "param_rel_change": ColumnDoc("‖θ(t) − θ(0)‖ / ‖θ(0)‖ (weights and biases)", "ratio"),
        "kernel_distance": ColumnDoc(
            "1 − ⟨K_t, K_0⟩_F / (‖K_t‖_F ‖K_0‖_F), empirical NTK on the probe set",
            "0..1",
            "metrics.ntk false",
        ),
        "act_flip_frac": ColumnDoc(
            "fraction of (probe input, hidden unit) pairs whose pre-activation sign differs "
            "from step 0",
            "0..1",
            "linear nets and depth 1",
        ),
        "transversal_grad_sq": ColumnDoc(
            "mean over test inputs of ‖P⊥ ∇ₓf(x)‖², P⊥ onto the codimension of the data",
            "",
            "data other than subspace, or metrics.transversal false",
        ),
        "kernel_alignment": ColumnDoc(
            "⟨K_t, YYᵀ⟩_F / (‖K_t‖_F ‖YYᵀ‖_F), Y the probe labels", "-1..1", "metrics.ntk false"
        ),
        "ntk_eig_min": ColumnDoc(
            "smallest eigenvalue of K_t (probe × probe)",
            "",
            "metrics.ntk false, or steps metrics.spectra_budget leaves out",
        ),
        "ntk_eig_max": ColumnDoc(
            "largest eigenvalue of K_t",
            "",
            "metrics.ntk false, or steps metrics.spectra_budget leaves out",
        ),
        "dead_frac": ColumnDoc(
            "fraction of hidden units with pre-activation ≤ 0 on every probe input",
            "0..1",
            "activations other than relu (and leaky_relu with slope 0)",
        ),
        "grad_norm": ColumnDoc("‖∇_θ L‖ of the full training loss"),
        "param_norm": ColumnDoc("‖θ(t)‖"),
        "output_norm": ColumnDoc("RMS of f over the probe set", "output units"),
        "even_part_frac": ColumnDoc(
            "‖f_even‖ / ‖f‖ on the probe set and its mirror image",
            "0..1",
            "data other than symmetric kinds (metrics.even_part)",
        ),
        "kernel_rel_change": ColumnDoc(
            "‖K_t − K_0‖_F / ‖K_0‖_F on the probe set", "ratio", "metrics.ntk false"
        ),
        "probe_test_loss": ColumnDoc(
            "the net's loss 1/(2P) Σ ‖f(x) − y‖² on the probe set (the kernel predictor's "
            "reference)",
            "loss",
            "metrics.linearized or metrics.ntk off, more than one output, or n_train > 512",
        ),
        "lin_test_loss": ColumnDoc(
            "the same loss of the linearized model at init (NTK at t = 0) trained by gradient "
            "flow to the same time t (closed form through the train kernel's eigendecomposition)",
            "loss",
            "as probe_test_loss",
        ),
        "lin_distance": ColumnDoc(
            "RMS over the probe set of f(x) − f_lin(x): the distance to the kernel predictor "
            "(≈ 0 in the lazy regime)",
            "output units",
            "as probe_test_loss",
        ),
    },
    "layers": {
        **_KEY,
        "step": ColumnDoc("logged step", "steps"),
        "layer": ColumnDoc("weight matrix, 1-based from the input"),
        "fro_norm": ColumnDoc("‖W_l(t)‖_F"),
        "rel_change": ColumnDoc("‖W_l(t) − W_l(0)‖_F / ‖W_l(0)‖_F", "ratio"),
        "top_sv": ColumnDoc(
            "metrics.top_k largest singular values of W_l(t), descending (list; entries "
            "beyond min(fan_in, fan_out) NULL)",
            "",
            _SPECTRA,
        ),
        "stable_rank": ColumnDoc("‖W_l‖_F² / ‖W_l‖_2²", "", _SPECTRA),
        "balance_defect": ColumnDoc(
            "drift of the balance gradient flow conserves, normalised by the two layers' "
            "initial size (docs/design.md)",
            "ratio",
            "the last layer, and tanh nets",
        ),
        "delta_top_sv": ColumnDoc(
            "largest singular values of W_l(t) − W_l(0), descending (list)", "", _SPECTRA
        ),
    },
    "summaries": {
        "sweep": _KEY["sweep"],
        "run_id": _KEY["run_id"],
        "regime": ColumnDoc(
            "'lazy' | 'rich' (order parameter below / above lazy_threshold) | 'diverged' | "
            "'not_converged' (final loss above analysis.converged_loss_frac × L0)"
        ),
        "escape_time": ColumnDoc(
            "when the loss leaves its initial plateau for good: the last crossing of "
            "L0 − escape_eps × (L0 − L_end), log-interpolated between logged points",
            _T,
            "the loss fell by less than analysis.escape_min_drop × L0; diverged and failed runs",
        ),
        "n_plateaus": ColumnDoc(
            "plateaus detected in the loss curve", "count", "diverged and failed runs"
        ),
        "final_param_rel_change": ColumnDoc("param_rel_change at the last logged step", "ratio"),
        "final_kernel_distance": ColumnDoc(
            "kernel_distance at the last logged step", "0..1", "metrics.ntk false"
        ),
        "order_parameter": ColumnDoc("the order parameter the regime used"),
        "order_value": ColumnDoc("its final value", "", "neither order parameter was logged"),
        "lazy_threshold": ColumnDoc("the threshold it was compared with"),
        "initial_train_loss": ColumnDoc("first logged train loss (L0)", _LOSS),
        "final_train_loss": ColumnDoc("last logged finite train loss", _LOSS),
        "loss_ratio": ColumnDoc("final / initial train loss", "ratio"),
        "final_time": ColumnDoc("gradient-flow time of the last logged point", _T),
        "final_test_loss": ColumnDoc("last logged finite test loss", _LOSS),
        "final_act_flip_frac": ColumnDoc(
            "act_flip_frac at the last logged step", "0..1", "linear nets"
        ),
        "final_transversal_grad_sq": ColumnDoc(
            "transversal_grad_sq at the last logged step", "", "data other than subspace"
        ),
        "escape_eps": ColumnDoc("the eps of escape_time (analysis.escape_eps)"),
        **{
            c: ColumnDoc(f"escape time at eps = {e:g}", _T, "as escape_time")
            for c, e in zip(ESCAPE_COLUMNS, ESCAPE_EPS)
        },
        "extra_escape_eps": ColumnDoc("analysis.extra_escape_eps (list)"),
        "extra_escape_times": ColumnDoc(
            "escape times at those eps, same order (list)", _T, "entries as escape_time"
        ),
        "eval_time": ColumnDoc(
            "gradient-flow time the order parameters are read at (analysis.at_time, else the "
            "run's last logged time)",
            "gradient-flow time",
            "the run did not reach analysis.at_time",
        ),
        "eval_loss_ratio": ColumnDoc(
            "train loss / initial train loss at eval_time (interpolated in log t)",
            "ratio",
            "as eval_time",
        ),
        "eval_param_rel_change": ColumnDoc(
            "param_rel_change at eval_time (interpolated in log t)", "ratio", "as eval_time"
        ),
        "eval_kernel_distance": ColumnDoc(
            "kernel_distance at eval_time (interpolated in log t)", "", "as eval_time, or no NTK"
        ),
        "final_lin_test_loss": ColumnDoc(
            "lin_test_loss at the last logged step", "loss", "no kernel predictor logged"
        ),
        "final_lin_distance": ColumnDoc(
            "lin_distance at the last logged step", "output units", "no kernel predictor logged"
        ),
    },
    "plateaus": {
        "sweep": _KEY["sweep"],
        "run_id": _KEY["run_id"],
        "level": ColumnDoc("loss on the plateau", _LOSS),
        "start": ColumnDoc("start of the plateau", _T),
        "end": ColumnDoc("end of the plateau (the drop begins)", _T),
        "duration": ColumnDoc("end − start", _T),
        "plateau_index": ColumnDoc("0-based order within the run (0: the plateau at L0)"),
        "drop_frac": ColumnDoc("relative loss decrease of the drop that ends the plateau", "0..1"),
        "contrast": ColumnDoc("peak loss-decay rate of that drop / rate on the plateau", "ratio"),
    },
    "scaling_fits": {
        "sweep": _KEY["sweep"],
        "depth": ColumnDoc("depth of the fitted runs"),
        "x": ColumnDoc(
            "'log_init_scale' | 'log_inv_init_scale' | 'log_log_inv_init_scale' (what slope "
            "differentiates by)"
        ),
        "slope": ColumnDoc("fitted d y / d x"),
        "ci_low": ColumnDoc("lower end of the confidence interval of slope", "", "too few seeds"),
        "ci_high": ColumnDoc("upper end of the confidence interval", "", "too few seeds"),
        "theory_slope": ColumnDoc("slope the theory predicts", "", "the theory gives none"),
        "n_points": ColumnDoc("runs fitted", "count"),
        "n_seeds": ColumnDoc("seeds among them", "count"),
        "y": ColumnDoc("'log_escape_time' | 'escape_time'"),
        "intercept": ColumnDoc("y = intercept + slope × x"),
        "eps": ColumnDoc("eps of the escape times fitted"),
        "width": ColumnDoc("the group's width", "", "width is not a grid axis"),
        "activation": ColumnDoc("the group's activation", "", "not a grid axis"),
        "noise_sigma": ColumnDoc("the group's noise_sigma", "", "not a grid axis"),
        "lr": ColumnDoc("the group's lr", "", "not a grid axis"),
        "init_scale_min": ColumnDoc("smallest init scale fitted"),
        "init_scale_max": ColumnDoc("largest init scale fitted"),
        "ci_method": ColumnDoc("'seeds_t' (t-interval of per-seed slopes) | 'ols_t'"),
        "confidence": ColumnDoc("confidence level of the interval (analysis.fit_confidence)"),
        "theory": ColumnDoc("the law the theory slope comes from", "", "the theory gives none"),
    },
    "boundaries": {
        "sweep": ColumnDoc("the refinement sweep (PARENT__refine_METRIC) the row belongs to"),
        "parent": ColumnDoc("the sweep refined"),
        "metric": ColumnDoc("the order parameter: final value of a trajectories or runs column"),
        "level": ColumnDoc("the level whose crossing is sought", "metric's unit"),
        "axis": ColumnDoc("the searched grid axis (as the parent's grid names it)"),
        "axis_scale": ColumnDoc("'log' (searched in log10) | 'linear'"),
        "line": ColumnDoc("JSON of the line's values of the other grid axes"),
        **{k: ColumnDoc(f"the line's {k}", "", "not an axis of the line") for k in LINE_COLUMNS},
        "boundary": ColumnDoc(
            "where the seed-mean metric crosses the level, interpolated in the bracket",
            "axis unit",
            "not bracketed",
        ),
        "bracket_low": ColumnDoc(
            "lower end of the bracket (the seed mean lies on opposite sides of the level at its "
            "two ends, with no measured point between)",
            "axis unit",
            "not bracketed",
        ),
        "bracket_high": ColumnDoc("upper end of the bracket", "axis unit", "not bracketed"),
        "seed_boundaries": ColumnDoc(
            "each seed's own crossing inside the bracket (list)", "axis unit", "not bracketed"
        ),
        "seed_spread": ColumnDoc(
            "sample std of seed_boundaries (log10 units on a log axis)",
            "axis unit or decades",
            "fewer than two seed crossings",
        ),
        "bracketed": ColumnDoc("whether the level is crossed within the axis range"),
        "side": ColumnDoc(
            "'above' | 'below': the metric's side of the level over the whole range",
            "",
            "bracketed",
        ),
        "converged": ColumnDoc("bracketed and the bracket is at most tol wide"),
        "tol": ColumnDoc("bracket width that ends a line (log10 units on a log axis)"),
        "axis_low": ColumnDoc("lowest axis value searched", "axis unit"),
        "axis_high": ColumnDoc("highest axis value searched", "axis unit"),
        "n_runs": ColumnDoc("runs of the line used (parent's and refinement's)", "count"),
        "n_refine_runs": ColumnDoc("of which trained by the refinement", "count"),
    },
    "manifest": {
        "sweep": _KEY["sweep"],
        "chunk_id": ColumnDoc("the chunk committed"),
        "attempt": ColumnDoc("the committing attempt"),
        "finished_at": ColumnDoc("when the entry was written", "UTC timestamp"),
        "n_runs": ColumnDoc("runs in the chunk", "count"),
        "run_ids": ColumnDoc("their run_ids (list)"),
        "files": ColumnDoc(
            "files written: list of {table, path (from the store root), rows, bytes}"
        ),
    },
}

#: What one row of each catalog view is (docs/reference/store.md).
TABLE_DOCS: dict[str, str] = {
    "runs": (
        "One row per grid point trained (written by `phasesweep run`, one file per chunk). "
        "A point whose rows are all 'failed' is trained again on relaunch, and the view then "
        "shows the new row."
    ),
    "trajectories": (
        "One row per run per logged step (`train.log_points` log-spaced steps, step 0 and "
        "the last included; a diverged run's rows end at its divergence step). Metrics on "
        "the probe set use the first `metrics.probe_size` test inputs."
    ),
    "layers": "One row per run per logged step per weight matrix.",
    "summaries": (
        "One row per run, written by `phasesweep analyze` (replaced whole on every analyze)."
    ),
    "plateaus": "One row per loss plateau of a run, written by `phasesweep analyze`.",
    "scaling_fits": (
        "Fits of log escape time against log init scale, one row per depth, law and group "
        "of the other grid axes, written by `phasesweep analyze`."
    ),
    "manifest": (
        "One row per committed chunk attempt: a log of what was written when "
        "(the runs table stays the truth about which runs are done)."
    ),
    "boundaries": (
        "One row per refined line (a value of the sweep's other grid axes): the phase "
        "boundary along one axis found by `phasesweep refine`, with its bracket, seed spread "
        "and the runs it used."
    ),
}
