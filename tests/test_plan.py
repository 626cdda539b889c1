"""The plan (pipeline/run/_plan.py): chunk descriptors of a grid, their ids, what the store
holds, chunks sized for a device; nothing per point in the driver."""

from __future__ import annotations

import pickle
import time
import tracemalloc

import pytest
import yaml
from phasesweep.pipeline.grid import (
    Grid,
    _cost,
    chunk_members,
    expand,
    group_tag,
    make_chunks,
    shape_key,
    tagged,
)
from phasesweep.pipeline.run._plan import (
    ChunkTask,
    expand_task,
    plan_chunks,
    plan_stored,
)
from phasesweep.pipeline.run._trial import stored_reads
from phasesweep.pipeline.spec import SpecError, validate_spec
from phasesweep.storage import Store
from test_grid import MIXED_GRIDS, _naive_expand


def _spec(grid, **extra):
    return validate_spec({"name": "g", "grid": grid, **extra})


def _points_of(grid, tasks):
    return [p for t in tasks for p in expand_task(grid, t).points]


@pytest.mark.parametrize("grid", MIXED_GRIDS)
@pytest.mark.parametrize("max_chunk, min_chunks", [(None, 1), (2, 1), (3, 7), (1, 1)])
def test_every_point_is_in_exactly_one_chunk_with_todays_run_ids(grid, max_chunk, min_chunks):
    """The chunks of a plan hold every grid point once, with the run id, config and
    coords of a whole-RunConfig validation (the run ids of stores written before plans
    were descriptors), repeats left out; every chunk is one group of shapes."""
    spec = _spec(grid, execution={"max_chunk_size": max_chunk})
    g = Grid(spec)
    tasks = plan_chunks(g, min_chunks=min_chunks)
    points = _points_of(g, tasks)
    naive = _naive_expand(spec)
    assert sorted(p.run_id for p in points) == sorted(r for r, _, _ in naive)
    by_id = {r: (coords, config) for r, coords, config in naive}
    for p in points:
        assert (p.coords, p.config) == by_id[p.run_id]
    for t in tasks:
        chunk = expand_task(g, t)
        assert len({shape_key(p.config) for p in chunk.points}) <= 1
        assert all(group_tag(p.config) == t.chunk_id[:8] for p in chunk.points)
        assert max_chunk is None or t.size <= max_chunk
    assert len({t.chunk_id for t in tasks}) == len(tasks)
    assert len(tasks) >= min(min_chunks, len(points))


def test_a_groups_members_go_seed_first_then_in_grid_order():
    """Members that share a seed (their data and initial draws) are neighbours, so a chunk
    makes those once; the other member axes keep the grid's order."""
    spec = _spec({"init_scale": [0.5, 1.0, 2.0], "width": [8, 16], "seed": [3, 1, 2, 0]})
    g = Grid(spec)
    tasks = plan_chunks(g, min_chunks=6)
    in_order = expand(spec)
    seeds = [3, 1, 2, 0]
    for width in (8, 16):
        got = [p.run_id for p in _points_of(g, tasks) if p.config.model.width == width]
        want = sorted(
            (p for p in in_order if p.config.model.width == width),
            key=lambda p: seeds.index(p.config.train.seed),  # stable: grid order within
        )
        assert got == [p.run_id for p in want]


def test_chunk_ids_are_stable_and_name_their_members():
    """The same grid gets the same ids (a relaunch finds its checkpoints and files); a
    new value of a split axis leaves the other groups' ids alone; other member values
    give other ids."""
    grid = {"width": [8, 16], "init_scale": [0.5, 1.0], "seed": {"range": [0, 5]}}
    ids = [t.chunk_id for t in plan_chunks(Grid(_spec(grid)), min_chunks=4)]
    assert ids == [t.chunk_id for t in plan_chunks(Grid(_spec(grid)), min_chunks=4)]
    assert all(tagged(i) for i in ids)
    wider_grid = Grid(_spec({**grid, "width": [8, 16, 32]}))
    wider = [t.chunk_id for t in plan_chunks(wider_grid, min_chunks=4)]
    assert set(ids) <= set(wider) and len(wider) > len(ids)
    more_seeds = {**grid, "seed": {"range": [0, 6]}}
    other = [t.chunk_id for t in plan_chunks(Grid(_spec(more_seeds)), min_chunks=4)]
    assert not set(ids) & set(other)
    assert {i[:8] for i in ids} == {i[:8] for i in other}  # same groups, other parts


def test_a_ten_million_point_plan_builds_no_point(monkeypatch):
    """10⁷ points plan in memory that holds the chunks, not the points (one Point each
    would be tens of GB); no point's config is built in the driver."""
    spec = _spec(
        {
            "init_scale": {"logspace": [-3, 1, 100]},
            "width": [8, 16, 32, 64],
            "seed": {"range": [0, 25000]},
        }
    )
    monkeypatch.setattr(Grid, "point", lambda self, idx: pytest.fail("a point was built"))
    tracemalloc.start()
    try:
        tasks = plan_chunks(Grid(spec), min_chunks=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(t.size for t in tasks) == 10**7
    assert len(tasks) == 4 * -(-(10**7 // 4) // 1024)
    assert peak < 64 * 2**20, peak


def test_what_a_trial_receives_does_not_grow_with_the_grid():
    """A trial gets its task and the grid (axes and spec): a few KB, whatever the size."""
    sizes = []
    for seeds in (10**3, 10**6):
        g = Grid(_spec({"init_scale": [0.5, 1.0], "seed": {"range": [0, seeds]}}))
        task = plan_chunks(g)[-1]
        sizes.append((len(pickle.dumps(task)), len(pickle.dumps(g))))
    assert sizes[0][0] < 300 and sizes[1][0] < 300
    assert sizes[1][1] < 2 * sizes[0][1] < 64 * 1024


def _store_tasks(store, make_chunk, g, tasks, chunk_id=None):
    for t in tasks:
        ids = [p.run_id for p in expand_task(g, t).points]
        store.write_chunk(g.sweep, chunk_id or t.chunk_id, make_chunk(ids))


def _failed(make_chunk, ids):
    import pyarrow as pa

    tables = make_chunk(ids)
    runs = tables["runs"]
    return {
        "runs": runs.set_column(
            runs.column_names.index("status"), "status", pa.array(["failed"] * len(ids))
        )
    }


def test_the_plan_skips_chunks_the_store_holds_under_their_own_ids(
    tmp_path, monkeypatch, store_make_chunk
):
    spec = _spec({"width": [8, 16], "seed": {"range": [0, 10]}}, execution={"max_chunk_size": 4})
    g = Grid(spec)
    tasks = plan_chunks(g)
    store = Store.open(str(tmp_path))
    _store_tasks(store, store_make_chunk, g, tasks[:2])
    half = expand_task(g, tasks[2]).points[:2]
    store.write_chunk("g", tasks[2].chunk_id, store_make_chunk([p.run_id for p in half]))
    failed = [p.run_id for p in expand_task(g, tasks[3]).points]
    store.write_chunk("g", tasks[3].chunk_id, _failed(store_make_chunk, failed))
    monkeypatch.setattr(Grid, "run_id", lambda self, idx: pytest.fail("run ids computed"))
    left, skipped = plan_stored(g, tasks, store)
    assert [t.chunk_id for t in left] == [t.chunk_id for t in tasks[2:]]
    assert skipped == tasks[0].size + tasks[1].size + 2
    assert all(t.stored == b"" for t in left)  # which members: the trial reads its own files


def test_points_stored_under_other_chunk_ids_are_found_by_run_id(tmp_path, store_make_chunk):
    """An extended grid, another chunk size or a store older than group tags: the plan
    finds the stored points by run id, drops complete chunks and hands the others the
    bitmask of what they hold; expansion leaves those members out."""
    small = _spec({"width": [8, 16], "seed": {"range": [0, 6]}})
    big = _spec({"width": [8, 16], "seed": {"range": [0, 9]}}, execution={"max_chunk_size": 5})
    store = Store.open(str(tmp_path))
    g_small = Grid(small)
    _store_tasks(store, store_make_chunk, g_small, plan_chunks(g_small), chunk_id="c0legacy")
    g = Grid(big)
    tasks = plan_chunks(g)
    left, skipped = plan_stored(g, tasks, store)
    assert skipped == 12
    todo = _points_of(g, left)
    stored = {p.run_id for p in expand(small)}
    assert {p.run_id for p in todo} == {p.run_id for p in expand(big)} - stored
    assert len(left) < len(tasks)  # chunks of stored points only are dropped
    assert any(t.stored for t in left)


def test_stored_reads_pick_the_files_that_can_hold_a_chunks_points():
    group, layout = "aaaaaaaa", "aaaaaaaa" + "11111111"
    own, sibling = layout + "00000003", layout + "00000004"
    foreign = group + "22222222" + "00000003"  # the group cut another way
    other_group = "bbbbbbbb" + "11111111" + "00000003"
    planned = time.time()
    select = stored_reads(group, own, planned)
    old, new = planned - 10_000, planned + 1
    assert select(own, old) and select(own, new)
    assert not select(sibling, new)  # the plan's chunks partition the group
    assert not select(other_group, new)  # another shape: other run ids
    assert select(foreign, new) and not select(foreign, old)  # another layout, after the plan
    assert select("c0legacy", new) and not select("c0legacy", old)
    assert select(None, new) and not select(None, old)  # compacted files
    free = stored_reads(group, own, None)  # explicit points: no plan, no layout
    assert free(foreign, old) and free(sibling, old) and free(None, old)
    assert not free(other_group, old)


def test_explicit_chunks_carry_their_group_tag():
    spec = _spec({"width": [8, 16], "seed": [0, 1, 2]})
    chunks = make_chunks(expand(spec), spec)
    for c in chunks:
        assert tagged(c.chunk_id) and c.chunk_id[:8] == group_tag(c.points[0].config)


def test_chunks_on_a_gpu_follow_its_memory_not_the_cpu_caps():
    """On an 80 GiB GPU some 10⁴ small members train as one chunk with the default metrics
    (the predictor's and spectra's matrices dominate), some 10⁵ with them off; the CPU keeps
    its caps; a limit the spec sets holds on both."""
    spec = _spec({"seed": {"range": [0, 10**6]}}, model={"width": 16}, data={"input_dim": 10})
    config = Grid(spec).group_config(())
    assert chunk_members(config, spec.execution) == 1024
    on_gpu = chunk_members(config, spec.execution, 80 * 2**30)
    assert 2 * 10**4 < on_gpu < 10**5
    off = {"ntk": False, "spectra": False, "linearized": False}
    bare = config.model_copy(update={"metrics": config.metrics.model_copy(update=off)})
    assert 10**5 < chunk_members(bare, spec.execution, 80 * 2**30) < 10**6
    assert chunk_members(config, spec.execution, 40 * 2**30) == pytest.approx(on_gpu / 2, rel=1e-3)
    capped = spec.execution.model_copy(update={"max_chunk_size": 5000})
    assert chunk_members(config, capped, 80 * 2**30) == 5000
    tasks = plan_chunks(Grid(spec), device_memory=80 * 2**30)
    assert len(tasks) == -(-(10**6) // on_gpu)


def test_cpu_chunks_of_brief_trainings_hold_about_a_second_of_work():
    """On the CPU, members that train briefly fill chunks past 1024, to
    CPU_CHUNK_WORK FLOPs of training, at most CPU_CHUNK_MAX_MEMBERS and within the memory
    budget; long trainings keep 1024; a limit the spec sets wins."""
    spec = _spec({"seed": [0]}, model={"width": 16}, data={"input_dim": 10, "n_train": 64})
    base = Grid(spec).group_config(())

    def members(steps, **execution):
        train = base.train.model_copy(update={"steps": steps})
        config = base.model_copy(update={"train": train})
        return chunk_members(config, spec.execution.model_copy(update=execution))

    flops = _cost.flops_per_step(base)
    assert flops == 6 * 64 * (10 * 16 + 16 * 1)
    assert members(10**4) == _cost.CPU_CHUNK_MEMBERS
    brief = members(100)
    assert brief == int(_cost.CPU_CHUNK_WORK // (flops * 100)) > _cost.CPU_CHUNK_MEMBERS
    assert members(1) == 2**30 // _cost.member_bytes(base) < _cost.CPU_CHUNK_MAX_MEMBERS
    assert members(1, memory_budget_mb=4096) == _cost.CPU_CHUNK_MAX_MEMBERS
    assert members(100, memory_budget_mb=100) == 100 * 2**20 // _cost.member_bytes(base) < brief
    assert members(100, max_chunk_size=300) == 300


def test_dry_run_plans_for_a_stated_device_memory(tmp_path, capsys):
    from phasesweep._cli import main

    path = tmp_path / "spec.yaml"
    raw = {"name": "gpu", "model": {"width": 16}, "grid": {"seed": {"range": [0, 300000]}}}
    path.write_text(yaml.safe_dump(raw))
    per_chunk = chunk_members(
        Grid(validate_spec(raw)).group_config(()), validate_spec(raw).execution, 80 * 2**30
    )
    args = ["run", str(path), "--store", str(tmp_path / "s"), "--dry-run", "--gpus-per-trial", "1"]
    assert main([*args, "--device-memory", "80"]) == 0
    out = capsys.readouterr().out
    chunks = -(-300000 // per_chunk)
    assert f"300000 to train in {chunks} chunks" in out and "GPU trials of 80.0 GiB" in out
    sizes = out.split("chunk sizes (members): ")[1].splitlines()[0]
    assert all(int(s) > 10**4 for s in sizes.split(", "))
    assert not (tmp_path / "s").exists()


def test_gpu_trials_without_a_gpu_or_a_stated_memory_are_refused(tmp_path, monkeypatch):
    import torch
    from phasesweep.pipeline.run._resources import DEVICE_MEMORY_ENV, trial_resources

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv(DEVICE_MEMORY_ENV, raising=False)
    with pytest.raises(SpecError, match="--device-memory") as err:
        trial_resources(None, 1.0, 1.0)
    assert err.value.key == "--gpus-per-trial"
    monkeypatch.setenv(DEVICE_MEMORY_ENV, "24")
    assert trial_resources(None, 1.0, 0.5) == (2, 12 * 2**30)
    monkeypatch.setenv(DEVICE_MEMORY_ENV, "lots")
    with pytest.raises(SpecError, match="GiB") as err:
        trial_resources(None, 1.0, 1.0)
    assert err.value.key == f"${DEVICE_MEMORY_ENV}"


def test_gpu_trials_count_gpu_slots_not_cpus(monkeypatch):
    """16 CPUs and one GPU: one trial at a time, so a grid of 1000 points is one chunk of
    1000 members, not 16 chunks of 63 that run one after another."""
    from phasesweep.pipeline.run import _resources

    monkeypatch.setattr(_resources.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(_resources, "_gpus", lambda address: (1, 80 * 2**30))
    slots, memory = _resources.trial_resources(None, 1.0, 1.0)
    assert (slots, memory) == (1, 80 * 2**30)
    spec = _spec({"init_scale": [0.5, 1.0], "seed": {"range": [0, 500]}})
    assert [t.size for t in plan_chunks(Grid(spec), min_chunks=slots, device_memory=memory)] == [
        1000
    ]


def test_a_repeated_split_value_is_one_group():
    spec = _spec({"width": [8, 8, 16], "seed": [0, 1]})
    tasks = plan_chunks(Grid(spec))
    assert len({t.chunk_id[:8] for t in tasks}) == 2 == len(tasks)


def _is_stored(task: ChunkTask, offset: int) -> bool:
    """Bit ``offset`` of the task's mask, as :class:`ChunkTask` defines it (bit i of byte
    i // 8, little bit first; none past its end), read one bit at a time."""
    byte = offset >> 3
    return byte < len(task.stored) and bool(task.stored[byte] >> (offset & 7) & 1)


def test_task_bitmask():
    t = ChunkTask("x" * 24, (), 0, 10, 5, bytes([0b101, 0b10]))
    assert [_is_stored(t, i) for i in range(10)] == [1, 0, 1, 0, 0, 0, 0, 0, 0, 1]
    assert t.stored_count == 3 and not _is_stored(t, 99)


def test_a_layout_is_told_by_its_chunk_ids():
    """Chunks of one plan of a group share their first LAYOUT_LEN digits and differ after;
    another chunk size or other member values give another layout tag."""
    from phasesweep.pipeline.grid import LAYOUT_LEN

    spec = _spec({"width": [8, 16], "seed": {"range": [0, 9]}}, execution={"max_chunk_size": 4})
    tasks = plan_chunks(Grid(spec))
    for t in tasks:
        same = {u.chunk_id[:LAYOUT_LEN] for u in tasks if u.group == t.group}
        assert same == {t.chunk_id[:LAYOUT_LEN]}
    other = plan_chunks(Grid(_spec(spec.grid, execution={"max_chunk_size": 5})))
    assert {t.chunk_id[:LAYOUT_LEN] for t in other}.isdisjoint(
        {t.chunk_id[:LAYOUT_LEN] for t in tasks}
    )
    assert {t.chunk_id[:8] for t in other} == {t.chunk_id[:8] for t in tasks}


#: A grid over several member axes of three sections (a repeat among them, scaled learning
#: rates) and a split axis.
COLUMN_GRID = {
    "spec": {
        "name": "columns",
        "model": {"depth": 3, "width": 4, "activation": "leaky_relu"},
        "data": {"kind": "subspace", "n_train": 8, "n_test": 8, "input_dim": 4},
        "train": {
            "steps": 3,
            "lr_scaling": {"init_scale_power": -1.5, "init_scale_depth_power": 0.5},
        },
    },
    "grid": {
        "init_scale": [0.1, 3.0, 0.1],
        "width": [4, 6],
        "lr": [0.05, 0.2],
        "noise_sigma": [0.0, 0.5],
        "seed": [2, 0],
        "leaky_slope": [0.01, 0.3],
    },
}


def test_column_wise_members_are_the_per_point_expansion():
    """:meth:`Grid.group_columns` gives, for any range of any group, the points of the
    per-point :meth:`Grid.group_members` (repeats left out): run ids, configs, coords, and
    learning rates equal to :func:`member_lr` of each config, bit for bit; a task's stored
    bits leave those members out."""
    from phasesweep.pipeline.grid import member_lr

    spec = validate_spec({**COLUMN_GRID["spec"], "grid": COLUMN_GRID["grid"]})
    g = Grid(spec)
    for group in g.groups():
        for start, stop in [(0, g.members), (5, 29), (7, 8), (3, 3)]:
            offsets, members = g.group_columns(group, start, stop)
            naive = [(o, p) for o, p in g.group_members(group, start, stop) if p is not None]
            assert offsets.tolist() == [o for o, _ in naive]
            assert members.points() == tuple(p for _, p in naive)
            assert members.learning_rates().tolist() == [member_lr(p.config) for _, p in naive]
            assert members.config_jsons().to_pylist() == [
                p.config.model_dump_json() for _, p in naive
            ]
    group = next(iter(g.groups()))
    stored = bytes([0b10100101, 0b1])
    task = ChunkTask("t" * 24, group, 2, 14, 3, stored)
    kept = [
        p for o, p in g.group_members(group, 2, 14) if p is not None and not _is_stored(task, o)
    ]
    assert expand_task(g, task).points == tuple(kept)


def test_column_wise_expansion_refuses_a_bad_learning_rate_naming_its_point(monkeypatch):
    """A member whose scaled learning rate overflows is refused as the per-point
    expansion refuses it, naming its point (with the grid's own check at its corners off)."""
    monkeypatch.setattr(Grid, "_check_lr_corners", lambda self: None)
    spec = validate_spec(
        {
            "name": "bad",
            "train": {"lr_scaling": {"init_scale_power": -400.0}},
            "grid": {"init_scale": [1.0, 1e-3], "seed": [0, 1]},
        }
    )
    g = Grid(spec)
    with pytest.raises(SpecError, match="scaled learning rate") as per_point:
        list(g.group_members((), 0, g.members))
    with pytest.raises(SpecError, match="scaled learning rate") as columns:
        g.group_columns((), 0, g.members)
    assert str(columns.value) == str(per_point.value)


def test_run_ids_of_a_small_grid_are_those_main_gave_at_c68494a():
    """Run ids are the store's keys: the ids of this grid, per point and as the plan's
    chunks expand them column-wise, are the ones the per-point code of main c68494a gave
    (pinned: the sha256 of all 64 in grid order, and the first six)."""
    import hashlib

    spec = validate_spec(
        {
            "name": "pinned",
            "model": {"depth": 2, "width": 8, "activation": "leaky_relu"},
            "data": {"kind": "subspace", "n_train": 16, "n_test": 16, "input_dim": 4},
            "train": {"steps": 4, "lr": 0.1, "log_points": 3},
            "grid": {
                "init_scale": [0.1, 1.0],
                "width": [4, 8],
                "lr": [0.05, 0.1],
                "noise_sigma": [0.0, 0.5],
                "seed": [3, 1],
                "leaky_slope": [0.01, 0.2],
            },
        }
    )
    ids = [p.run_id for p in expand(spec)]
    assert ids[:6] == [
        "26df5ba1b7d4668b",
        "c59428c1558543e5",
        "9ca8f1623c4d31dd",
        "2b833868c8be3881",
        "11bb4020e35851ec",
        "8ef7dac408151509",
    ]
    assert hashlib.sha256(",".join(ids).encode()).hexdigest() == (
        "42228bb7f473a1b6ec2a0a0c3bb47d8a95c824b1cc379b295f7932f16226c515"
    )
    g = Grid(spec)
    planned = [r for t in plan_chunks(g) for r in expand_task(g, t).members.run_ids]
    assert sorted(planned) == sorted(ids)


#: Peak device memory per member that benchmarks/gpu.py measured on an NVIDIA H200
#: (benchmarks/results/gpu.json, main 8ea2ef5; torch.cuda.max_memory_allocated over the
#: planner's first chunk of the 10⁶-point grid, 1000 steps): (width, depth, metrics on) ->
#: peak bytes / members.
MEASURED_ON_H200 = {
    (16, 2, False): 51_044_250_112 / 500_000,
    (16, 2, True): 70_875_716_096 / 71_429,
    (256, 4, False): 48_889_638_400 / 6_993,
    (256, 4, True): 69_156_518_400 / 4_808,
}


@pytest.mark.parametrize("shape", list(MEASURED_ON_H200), ids=str)
def test_the_device_estimate_is_within_1_5_of_the_measured_peak(shape):
    """The planner's device memory per member (device_member_bytes) against the peaks an
    H200 measured for the benchmark's grid (benchmarks/gpu.py): within a factor 1.5 either
    way, with the metrics off and with the defaults."""
    from phasesweep.pipeline.grid._cost import device_member_bytes

    width, depth, metrics = shape
    off = {"ntk": False, "spectra": False, "linearized": False}
    spec = validate_spec(
        {
            "name": "gpu",
            "model": {"depth": depth, "width": width, "activation": "relu", "bias": False},
            "data": {"kind": "teacher", "n_train": 64, "n_test": 128, "input_dim": 10},
            "metrics": {} if metrics else off,
            "grid": {"seed": [0]},
        }
    )
    estimate = device_member_bytes(Grid(spec).group_config(()))
    assert 1 / 1.5 <= estimate / MEASURED_ON_H200[shape] <= 1.5
