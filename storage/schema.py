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
