"""The one table builder (``storage.schema.to_table``), the one ``runs`` row assembler
(``pipeline.train._runs.runs_table``) and the facts defined once (logged steps, FLOPs per step,
SQL quoting, sweep names, group and line columns), each against an independent
computation: a naive per-value conversion, the configs themselves, a closed form,
DuckDB's own parsing of a literal."""

from __future__ import annotations

import copy
import math
from datetime import datetime, timezone

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from calibration import logged_times, synthetic_sweep
from conftest import TINY_SPEC
from phasesweep.pipeline.grid import expand, flops_per_step, make_chunks, member_lr
from phasesweep.pipeline.run._driver import failed_runs_table
from phasesweep.pipeline.spec import SpecError, validate_spec
from phasesweep.pipeline.train._trainer import train_chunk
from phasesweep.storage import Store, open_catalog, schema
from phasesweep.storage._catalog import sql_string
from phasesweep.storage._store import check_sweep
from phasesweep.storage.schema import log_steps


def _values(field: pa.Field, n: int, rng: np.random.Generator) -> tuple[list, list]:
    """(values as a caller gives them, the Python values the table must hold): NaN and
    None where a column does not apply, numpy scalars, NaN-padded lists."""
    t = field.type
    given, expected = [], []
    for i in range(n):
        hole = i % 3 == 2
        if pa.types.is_floating(t):
            v = float(rng.standard_normal())
            given.append(math.nan if hole and i % 2 else None if hole else np.float64(v))
            expected.append(None if hole else v)
        elif pa.types.is_integer(t):
            v = int(rng.integers(-50, 50))
            given.append(None if hole else np.int64(v))
            expected.append(None if hole else v)
        elif pa.types.is_boolean(t):
            given.append(None if hole else bool(i % 2))
            expected.append(None if hole else bool(i % 2))
        elif pa.types.is_string(t):
            given.append(None if hole else f"{field.name}'{i}")
            expected.append(None if hole else f"{field.name}'{i}")
        elif pa.types.is_timestamp(t):
            v = datetime(2026, 1, 1 + i, tzinfo=timezone.utc)
            given.append(None if hole else v)
            expected.append(None if hole else v)
        elif pa.types.is_list(t):
            v = [float(x) for x in rng.standard_normal(i % 3 + 1)]
            given.append(None if hole else v)
            expected.append(None if hole else v)
        else:
            raise TypeError(f"no test values for {field}")
    return given, expected


@pytest.mark.parametrize("name", sorted(schema.TABLES))
def test_to_table_conforms_every_table_in_order_type_and_nulls(name):
    target = schema.TABLES[name]
    rng = np.random.default_rng(len(name))
    n = 7
    given, expected = {}, {}
    for field in reversed(target):  # given in the wrong order
        if field.name in ("attempt", "chunk_id") or len(given) % 5 == 4:
            expected[field.name] = [None] * n  # not given: NULL
            continue
        given[field.name], expected[field.name] = _values(field, n, rng)
    table = schema.to_table(name, given)
    assert table.schema.equals(target)
    assert table.num_rows == n
    for field in target:
        assert table.column(field.name).to_pylist() == expected[field.name], field.name
    # the store accepts it as it is and DuckDB reads it back unchanged
    assert schema.to_table(name, table, complete=True).equals(table)


def test_to_table_nan_is_null_infinity_is_kept_and_padded_rows_become_lists():
    t = schema.to_table(
        "layers",
        {
            "fro_norm": np.array([1.0, np.nan, np.inf]),
            "top_sv": np.array([[3.0, 2.0, np.nan], [np.nan] * 3, [5.0, 4.0, 1.0]]),
        },
    )
    assert t.column("fro_norm").to_pylist() == [1.0, None, math.inf]
    assert t.column("top_sv").to_pylist() == [[3.0, 2.0], None, [5.0, 4.0, 1.0]]
    assert schema.to_table("plateaus", {}, 3).column("level").null_count == 3
    assert schema.to_table("runs", {}).num_rows == 0


@pytest.mark.parametrize(
    ("columns", "kwargs", "message"),
    [
        ({"run_id": ["a"], "sweep": ["s"]}, {}, r"runs: unknown columns \['sweep'\].*drop 'sweep'"),
        ({"run_id": ["a"]}, {"complete": True}, r"runs: unknown columns \[\], missing columns"),
        ({"final_train_loss": ["oops"]}, {}, r"runs\.final_train_loss: cannot store"),
        ({"width": pa.array(["x"])}, {}, r"runs\.width: cannot store string as int64"),
        ({"run_id": ["a", "b"], "seed": [1]}, {}, r"runs: columns of unequal lengths \[1, 2\]"),
        ({"run_id": ["a"]}, {"n_rows": 2}, "unequal lengths"),
    ],
)
def test_to_table_rejects_what_does_not_fit_naming_table_and_column(columns, kwargs, message):
    n_rows = kwargs.pop("n_rows", None)
    with pytest.raises(ValueError, match=message):
        schema.to_table("runs", columns, n_rows, **kwargs)
    with pytest.raises(ValueError, match="unknown table 'nope'"):
        schema.to_table("nope", {})


def test_every_site_builds_schema_tables():
    """Trainer, failed rows, synthetic sweeps and analysis all hand the store exact schemas."""
    from phasesweep.analysis._analyze import analyze_frames

    spec = validate_spec(copy.deepcopy(TINY_SPEC))
    chunk = make_chunks(expand(spec), spec)[0]
    tables = train_chunk(chunk)
    tables["failed"] = failed_runs_table(chunk.points, chunk.chunk_id, "boom")
    syn = synthetic_sweep(init_scales=(0.01, 1.0), widths=(16,), depths=(2,), seeds=(0, 1))
    tables.update({f"syn_{k}": v for k, v in syn.items()})
    frames = (syn["runs"].to_pandas(), syn["trajectories"].to_pandas())
    tables.update(analyze_frames(*frames, group_axes=["width"]))
    for key, table in tables.items():
        name = "runs" if key == "failed" else key.removeprefix("syn_")
        assert table.schema.equals(schema.TABLES[name]), key


def test_runs_rows_are_assembled_once_with_chunk_and_node(tmp_path):
    """Trained and failed rows carry the same point columns, taken from the configs; the
    chunk and node ids are the ones passed in; trainer -> store -> DuckDB keeps every row."""
    spec = validate_spec(copy.deepcopy(TINY_SPEC))
    chunk = make_chunks(expand(spec), spec)[0]
    tables = train_chunk(chunk, node_id="node-a")
    runs = tables["runs"]
    failed = failed_runs_table(chunk.points, chunk.chunk_id, "boom " * 1000)
    cfg = [p.config for p in chunk.points]
    independent = {
        "run_id": [p.run_id for p in chunk.points],
        "chunk_id": [chunk.chunk_id] * len(cfg),
        "init_scale": [c.model.init_scale for c in cfg],
        "width": [c.model.width for c in cfg],
        "seed": [c.train.seed for c in cfg],
        "lr_effective": [member_lr(c) for c in cfg],
        "config": [c.model_dump_json() for c in cfg],
    }
    for column, values in independent.items():
        assert runs.column(column).to_pylist() == values, column
        assert failed.column(column).to_pylist() == values, column
    assert runs.column("node_id").to_pylist() == ["node-a"] * len(cfg)
    assert failed.column("node_id").null_count == len(cfg)  # NULL: failed runs
    assert set(failed.column("status").to_pylist()) == {"failed"}
    assert failed.column("error").to_pylist()[0] == ("boom " * 1000)[-2000:]

    store = Store.open(str(tmp_path))
    store.write_chunk("s", chunk.chunk_id, tables)
    con = open_catalog(store)
    for name, order in (
        ("runs", "run_id"),
        ("trajectories", "run_id, step"),
        ("layers", "run_id, step, layer"),
    ):
        got = con.sql(f"SELECT * EXCLUDE (sweep, attempt) FROM {name} ORDER BY {order}")
        keys = [(k, "ascending") for k in order.split(", ")]
        want = tables[name].drop_columns(["attempt"]).sort_by(keys)
        assert got.to_arrow_table().to_pylist() == want.to_pylist(), name


def test_store_fills_an_absent_chunk_id_and_rejects_another(tmp_path, store_make_chunk):
    store = Store.open(str(tmp_path))
    store.write_chunk("s", "c0", store_make_chunk(["r1"]))  # absent
    null = store_make_chunk(["r0"])
    null["runs"] = null["runs"].append_column("chunk_id", pa.nulls(1, pa.string()))
    store.write_chunk("s", "cn", null)  # NULL
    tables = store_make_chunk(["r2"])
    tables["runs"] = tables["runs"].append_column("chunk_id", pa.array(["c9"]))
    with pytest.raises(ValueError, match=r"runs\.chunk_id: rows of chunk \['c9'\]"):
        store.write_chunk("s", "c1", tables)
    store.write_chunk("s", "c9", tables)
    got = open_catalog(store).sql("SELECT run_id, chunk_id FROM runs ORDER BY run_id")
    assert got.fetchall() == [("r0", "cn"), ("r1", "c0"), ("r2", "c9")]


def _log_steps_by_hand(steps: int, log_points: int) -> list[int]:
    """0, ``steps`` and ``round(steps ** (i / m))`` for i = 0..m, m = log_points - 2."""
    m = max(log_points - 2, 0)
    inner = [round(steps ** (i / m)) if m else 1 for i in range(m + 1)]
    return sorted({0, steps, *inner})


@pytest.mark.parametrize("log_points", [2, 3, 5, 60, 100])
@pytest.mark.parametrize("steps", [1, 2, 7, 1000, 4999, 10**5])
def test_logged_steps_and_times_include_both_ends(steps, log_points):
    """One definition for the trainer and the closed-form curves; at ``log_points`` 2 the
    curves used to stop at step 1 while the trainer logs the last step too."""
    by_hand = _log_steps_by_hand(steps, log_points)
    assert log_steps(steps, log_points).tolist() == by_hand
    assert (logged_times(0.5, steps, log_points) / 0.5).tolist() == by_hand
    syn = synthetic_sweep((1.0,), (16,), (2,), (0,), steps=steps, log_points=log_points)
    assert syn["trajectories"].column("step").to_pylist() == by_hand


def test_flops_per_step_closed_form_and_the_metrics_budget_uses_it():
    from phasesweep.pipeline.train.metrics._metrics import MetricRecorder

    spec = validate_spec(copy.deepcopy(TINY_SPEC))
    (point, *_) = expand(spec)
    # dims 3 -> 8 -> 1, 8 training points, forward 2 + backward 4 flops per weight per row
    assert flops_per_step(point.config) == 6 * 8 * (3 * 8 + 8 * 1)

    seen = {}

    class Spy(MetricRecorder):
        def __init__(self, *args, train_flops=None, **kwargs):
            seen["train_flops"] = train_flops
            super().__init__(*args, train_flops=train_flops, **kwargs)

    from phasesweep.pipeline.train._trainer import ChunkTrainer

    trainer = ChunkTrainer(make_chunks([point], spec)[0])
    Spy.for_run(trainer.net, trainer.params0, trainer.batch, point.config, [0, 1])
    assert seen["train_flops"] == flops_per_step(point.config) * point.config.train.steps


@pytest.mark.parametrize("text", ["plain", "it's", "''", "a'b'c", "", "ünï'code"])
def test_sql_string_is_read_back_by_duckdb_as_the_same_text(text):
    assert duckdb.sql(f"SELECT {sql_string(text)}").fetchall() == [(text,)]


@pytest.mark.parametrize("name", ["ok", "a-b_9", "Bad", "a b", "x\n", "../s", "", "é"])
def test_spec_and_store_accept_the_same_sweep_names(name):
    spec = copy.deepcopy(TINY_SPEC) | {"name": name}
    try:
        validate_spec(spec)
        spec_ok = True
    except SpecError:
        spec_ok = False
    try:
        check_sweep(name)
        store_ok = True
    except ValueError:
        store_ok = False
    assert spec_ok == store_ok == (name in ("ok", "a-b_9"))


def test_group_and_line_columns_are_typed_like_runs():
    for columns, table in (
        (schema.FIT_GROUP_COLUMNS, schema.SCALING_FITS),
        (schema.LINE_COLUMNS, schema.BOUNDARIES),
    ):
        for c in columns:
            assert table.field(c).type == schema.RUNS.field(c).type, c


def test_chunk_tables_built_column_wise_equal_the_per_point_rows():
    """A chunk's tables, built from its member columns, hold row by row what each point's
    own config says (the per-point assembly they replace): the ``runs`` columns of the
    config and its JSON, the scaled learning rate, the initial norms; ``trajectories`` and
    ``layers`` keyed by each member's run id at its logged steps. The constructor's seconds
    are in the timing (``setup_s``) and in the wall columns."""
    from phasesweep.pipeline.train._trainer import ChunkTrainer

    spec = validate_spec(
        {
            "name": "columns",
            "model": {"depth": 3, "width": 5, "activation": "leaky_relu"},
            "data": {"kind": "subspace", "n_train": 8, "n_test": 8, "input_dim": 4},
            "train": {"steps": 6, "log_points": 3, "lr_scaling": {"init_scale_power": -1.0}},
            "metrics": {"probe_size": 4},
            "grid": {
                "init_scale": [0.3, 2.0],
                "lr": [0.05, 0.2],
                "noise_sigma": [0.0, 0.5],
                "seed": [2, 0],
                "leaky_slope": [0.01, 0.3],
            },
        }
    )
    (chunk,) = make_chunks(expand(spec), spec)
    trainer = ChunkTrainer(chunk)
    tables = trainer.run()
    runs = tables["runs"].to_pylist()
    assert [r["run_id"] for r in runs] == [p.run_id for p in chunk.points]
    for r, p, w0 in zip(runs, chunk.points, zip(*(w.numpy() for w in trainer.params0.weights))):
        c = p.config
        expected = {
            "init_scale": c.model.init_scale,
            "width": c.model.width,
            "depth": c.model.depth,
            "noise_sigma": c.data.noise_sigma,
            "lr": c.train.lr,
            "lr_effective": member_lr(c),
            "seed": c.train.seed,
            "activation": c.model.activation,
            "bias": c.model.bias,
            "parameterization": c.model.parameterization,
            "data_kind": c.data.kind,
            "steps": c.train.steps,
            "config": c.model_dump_json(),
            "n_train": c.data.n_train,
            "leaky_slope": c.model.leaky_slope,
            "optimizer": c.train.optimizer,
            "chunk_id": chunk.chunk_id,
            "chunk_size": len(chunk.points),
            "device": "cpu",
            "input_dim": 4,
        }
        assert {k: r[k] for k in expected} == expected
        naive_norms = [math.sqrt(sum(float(x) ** 2 for x in w.ravel())) for w in w0]
        assert r["init_fro_norms"] == pytest.approx(naive_norms, rel=1e-13)
    logged = log_steps(6, 3).tolist()
    traj = tables["trajectories"].select(["run_id", "step"]).to_pylist()
    assert traj == [{"run_id": p.run_id, "step": k} for p in chunk.points for k in logged]
    layers = tables["layers"].select(["run_id", "step", "layer"]).to_pylist()
    assert layers == [
        {"run_id": p.run_id, "step": k, "layer": l}
        for p in chunk.points
        for k in logged
        for l in (1, 2, 3)
    ]
    timing = trainer.timing
    assert timing["setup_s"] == trainer.setup_s > 0
    wall = runs[0]["chunk_wall_seconds"]
    assert wall >= timing["setup_s"] + timing["train_s"] + timing["metrics_s"]
    assert sum(timing.values()) >= wall - 1e-9  # the tables come after the wall's end


@pytest.mark.parametrize(
    "ids",
    [
        [f"{i:016x}" for i in range(7)],  # the grid's: one length, repeated as bytes
        ["r1", "run-22", "r3", "", "r5"],  # any other: gathered by Arrow
        [],
    ],
    ids=["fixed", "varying", "none"],
)
def test_repeated_run_ids_are_each_id_per_row(ids):
    """The run ids of a table's rows (each member's id once per row, the rows of diverged
    members dropped) are the naive repetition, from a whole array and from a slice."""
    from phasesweep.pipeline.train._tables import repeat_ids

    rng = np.random.default_rng(0)
    whole = pa.array(["x" * 16, *ids, "y" * 16], pa.string())
    for array in (pa.array(ids, pa.string()), whole.slice(1, len(ids))):
        for times in (1, 3):
            naive = [v for v in ids for _ in range(times)]
            assert repeat_ids(array, times, None).to_pylist() == naive
            keep = rng.random(len(naive)) < 0.6
            got = repeat_ids(array, times, keep)
            assert got.to_pylist() == [v for v, k in zip(naive, keep) if k]
            assert got.type == pa.string()
