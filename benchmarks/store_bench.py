"""Store benchmarks: writing trajectories through ``Store.write_chunk``, and a phase-diagram
aggregate through ``open_catalog`` over the written table.

The trajectories are synthetic but shaped like real ones: ``steps_per_run`` log-spaced
logged steps per run, smooth decaying losses with noise, the default metrics' columns
filled and the columns that do not apply to teacher data NULL, as the trainer writes them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
from phasesweep.storage import Store, open_catalog
from phasesweep.storage import schema as S

#: The phase-diagram aggregate: final-step metrics per (init_scale, width) cell.
PHASE_QUERY = """
SELECT r.init_scale, r.width, count(*) AS runs,
       avg(t.train_loss) AS final_train_loss,
       avg(t.kernel_distance) AS kernel_distance,
       avg(t.param_rel_change) AS param_rel_change
FROM trajectories AS t JOIN runs AS r USING (sweep, run_id)
WHERE t.step = r.steps
GROUP BY r.init_scale, r.width
ORDER BY r.init_scale, r.width
"""

_NULL_TRAJ = {"transversal_grad_sq", "even_part_frac"}  # teacher data: not recorded


def synthetic_chunk(
    first_run: int, n_runs: int, steps: int, log_points: int, rng: np.random.Generator
) -> dict[str, pa.Table]:
    """``runs`` and ``trajectories`` of ``n_runs`` runs with ids from ``first_run`` on."""
    from phasesweep.storage.schema import log_steps

    logged = log_steps(steps, log_points)
    k = len(logged)
    ids = np.array([f"{i:016x}" for i in range(first_run, first_run + n_runs)], dtype=object)
    init_scale = 10.0 ** rng.choice(np.linspace(-2, 0.5, 16), n_runs)
    width = rng.choice([16, 64, 256, 1024], n_runs)
    lr = np.full(n_runs, 0.05)
    rate = 10.0 ** rng.uniform(-3, 0, n_runs)
    loss0 = rng.uniform(0.1, 2.0, n_runs)

    run_of_row = np.repeat(np.arange(n_runs), k)
    step = np.tile(logged, n_runs)
    t = step * lr[run_of_row]
    decay = np.exp(-t * rate[run_of_row])
    noise = lambda: 1.0 + 0.01 * rng.standard_normal(n_runs * k)  # noqa: E731
    train = loss0[run_of_row] * decay * noise()
    rel = (1.0 - decay) / init_scale[run_of_row] * 0.1
    traj = {
        "run_id": pa.array(ids).take(pa.array(run_of_row)),
        "step": step,
        "time": t,
        "train_loss": train,
        "test_loss": train * 1.1 * noise(),
        "param_rel_change": rel,
        "kernel_distance": np.clip(rel * noise(), 0, 1),
        "act_flip_frac": np.clip(0.3 * rel * noise(), 0, 1),
        "kernel_alignment": 0.5 + 0.4 * (1 - decay) * noise(),
        "ntk_eig_min": 1e-3 * noise(),
        "ntk_eig_max": 10.0 * noise(),
        "dead_frac": np.clip(0.05 * noise() - 0.05, 0, 1),
        "grad_norm": np.sqrt(train) * noise(),
        "param_norm": 10.0 * (1 + rel),
        "output_norm": 1.0 - decay * noise() * 0.5,
    }
    assert not (_NULL_TRAJ & traj.keys())
    runs = {
        "run_id": ids,
        "status": ["completed"] * n_runs,
        "init_scale": init_scale,
        "width": width,
        "depth": np.full(n_runs, 3),
        "lr": lr,
        "seed": np.arange(n_runs) % 16,
        "activation": ["relu"] * n_runs,
        "bias": [False] * n_runs,
        "parameterization": ["ntk"] * n_runs,
        "data_kind": ["teacher"] * n_runs,
        "steps": np.full(n_runs, steps),
        "final_train_loss": train[k - 1 :: k],
    }
    return {
        "trajectories": S.to_table("trajectories", traj, n_runs * k),
        "runs": S.to_table("runs", runs, n_runs),
    }


def store_benchmark(
    root: str,
    rows: int,
    chunk_rows: int,
    steps: int = 2000,
    log_points: int = 100,
    query_repeats: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Write ``rows`` trajectory rows in chunks of about ``chunk_rows`` to a store at
    ``root``, then time the phase-diagram aggregate over them."""
    from phasesweep.storage.schema import log_steps

    rng = np.random.default_rng(seed)
    store = Store.open(root)
    per_run = len(log_steps(steps, log_points))
    runs_per_chunk = max(1, chunk_rows // per_run)
    n_chunks = max(1, round(rows / (runs_per_chunk * per_run)))
    write_s = gen_s = 0.0
    written = 0
    for c in range(n_chunks):
        t0 = time.perf_counter()
        tables = synthetic_chunk(c * runs_per_chunk, runs_per_chunk, steps, log_points, rng)
        t1 = time.perf_counter()
        store.write_chunk("bench", f"c{c:05d}", tables)
        write_s += time.perf_counter() - t1
        gen_s += t1 - t0
        written += tables["trajectories"].num_rows
    files = [f for e in store.manifest("bench") for f in e["files"]]
    traj_bytes = sum(f["bytes"] for f in files if f["table"] == "trajectories")

    import pyarrow.parquet as pq

    first = pq.ParquetFile(store.files("trajectories", "bench")[0]).metadata
    row_group_rows = min(first.row_group(i).num_rows for i in range(first.num_row_groups))

    con = open_catalog(store)
    times = []
    result = None
    for _ in range(query_repeats):
        t0 = time.perf_counter()
        result = con.execute(PHASE_QUERY).fetchall()
        times.append(time.perf_counter() - t0)
    total_rows = con.execute("SELECT count(*) FROM trajectories").fetchone()[0]
    con.close()
    return {
        "rows": written,
        "catalog_rows": total_rows,
        "chunks": n_chunks,
        "rows_per_chunk": runs_per_chunk * per_run,
        "write_s": write_s,
        "generate_s": gen_s,
        "write_rows_per_s": written / write_s,
        "bytes_per_row": traj_bytes / written,
        "min_row_group_rows": row_group_rows,
        "query_first_s": times[0],
        "query_best_s": min(times),
        "query_cells": len(result or []),
        "query_runs": int(sum(r[2] for r in result or [])),
    }
