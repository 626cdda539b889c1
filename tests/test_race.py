"""Two launches race on a 10⁵-point grid, packed into different chunks: every point is
stored exactly once (claims and done-checks cost O(chunks), see storage/_claims.py)."""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from phasesweep.pipeline.grid import Grid
from phasesweep.pipeline.run._plan import expand_task, plan_chunks, plan_stored
from phasesweep.pipeline.run._trial import train_and_store
from phasesweep.pipeline.spec import validate_spec
from phasesweep.storage import Store

#: Fresh interpreters: a child forked from a test session that ran Ray, torch's thread pools
#: or fsspec's IO thread can inherit a lock held by a thread that does not exist in it, and
#: hang (it did on CI, after the rest of the suite).
CTX = multiprocessing.get_context("spawn")

#: 10 init scales × 10⁴ seeds of a 2 → 2 → 1 net, one step: one group of 10⁵ members, so
#: every claim of both launches meets in one group's lock.
RACE = {
    "name": "race",
    "model": {"depth": 2, "width": 2},
    "data": {"n_train": 4, "n_test": 4, "input_dim": 2},
    "train": {"steps": 1, "log_points": 2},
    "metrics": {
        "probe_size": 2,
        "ntk": False,
        "spectra": False,
        "transversal": False,
        "linearized": False,
    },
    "analysis": {"at_time": None},
    "grid": {"init_scale": {"logspace": [-1, 0, 10]}, "seed": {"range": [0, 10**4]}},
}


def _launch(root: str, max_chunk: int, backwards: bool, barrier, out) -> None:  # noqa: ANN001
    """One launch, as a Ray trial per chunk would run it, but in one process."""
    import torch

    torch.set_num_threads(1)
    spec = validate_spec({**RACE, "execution": {"max_chunk_size": max_chunk}})
    grid = Grid(spec)
    store = Store.open(root)
    planned_at = time.time()
    tasks, _ = plan_stored(grid, plan_chunks(grid), store)
    barrier.wait()
    totals = Counter()
    for task in reversed(tasks) if backwards else tasks:
        summary = train_and_store(
            root,
            "race",
            expand_task(grid, task),
            "cpu",
            planned_at=planned_at,
        )
        totals.update({k: summary[k] for k in ("points", "busy", "skipped")})
    out.put(dict(totals))


@pytest.mark.slow
@pytest.mark.process
def test_two_launches_with_other_chunks_store_each_point_of_a_1e5_grid_once(tmp_path):
    root = str(tmp_path / "store")
    barrier, out = CTX.Barrier(2), CTX.Queue()
    procs = [
        CTX.Process(target=_launch, args=(root, size, backwards, barrier, out))
        for size, backwards in ((1000, False), (1536, True))
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=600) for _ in procs]  # about 15 s on 2 idle cores
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.exitcode is None:
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    runs = ds.dataset(Path(root) / "runs", format="parquet", partitioning="hive")
    ids = runs.to_table(columns=["run_id"]).column("run_id").to_pylist()
    counts = Counter(ids)
    assert len(counts) == 10**5  # every point ...
    assert max(counts.values()) == 1  # ... once
    assert sum(r["points"] for r in results) == 10**5
    assert all(r["points"] > 0 for r in results)  # both trained: they did race
    # what one launch skipped as busy, the other trained
    assert all(r["busy"] + r["skipped"] > 0 for r in results)
    # a relaunch finds every chunk stored, from the chunk ids alone
    spec = validate_spec({**RACE, "execution": {"max_chunk_size": 1000}})
    grid = Grid(spec)
    left, skipped = plan_stored(grid, plan_chunks(grid), Store.open(root))
    assert skipped == 10**5 and not left
