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
    ]
)

PLATEAUS = pa.schema(
    [
        ("run_id", pa.string()),
        ("level", F64),
        ("start", F64),
        ("end", F64),
        ("duration", F64),
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
    ]
)

#: Tables written by ``phasesweep analyze``: each replaces the sweep's partition whole.
ANALYSIS_TABLES: dict[str, pa.Schema] = {
    "summaries": SUMMARIES,
    "plateaus": PLATEAUS,
    "scaling_fits": SCALING_FITS,
}
