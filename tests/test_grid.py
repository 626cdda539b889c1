"""Grid expansion, run ids and chunking."""

from __future__ import annotations

import ast
import gc
import itertools
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml
from phasesweep.pipeline._axes import axis_size
from phasesweep.pipeline.grid import (
    Grid,
    expand,
    grid_size,
    iter_points,
    make_chunks,
    run_id_of,
)
from phasesweep.pipeline.spec import SpecError, validate_spec

ROOT = Path(__file__).resolve().parents[1]


def _spec(grid, **extra):
    return validate_spec({"name": "g", "grid": grid, **extra})


def test_cartesian_product_in_spec_order_with_short_names_and_paths():
    pts = expand(
        _spec(
            {
                "init_scale": {"logspace": [-2, 0, 3]},
                "model.width": [8, 16],
                "seed": {"range": [0, 2]},
            }
        )
    )
    assert len(pts) == 12
    assert [p.coords["seed"] for p in pts[:4]] == [0, 1, 0, 1]  # last axis fastest
    np.testing.assert_allclose(sorted({p.config.model.init_scale for p in pts}), [0.01, 0.1, 1.0])
    assert {p.config.model.width for p in pts} == {8, 16}
    assert {p.config.train.seed for p in pts} == {0, 1}
    lin = expand(_spec({"lr": {"linspace": [0.1, 0.3, 3]}}))
    np.testing.assert_allclose([p.config.train.lr for p in lin], [0.1, 0.2, 0.3])


def test_run_ids_are_deterministic_unique_and_depend_on_sweep_and_config():
    spec = _spec({"width": [8, 16], "seed": [0, 1]})
    a, b = expand(spec), expand(spec)
    assert [p.run_id for p in a] == [p.run_id for p in b]
    assert len({p.run_id for p in a}) == 4
    assert all(run_id_of("g", p.config) == p.run_id for p in a)
    other = expand(validate_spec({"name": "h", "grid": {"width": [8, 16], "seed": [0, 1]}}))
    assert not {p.run_id for p in a} & {p.run_id for p in other}
    # the same point reached through --set instead of the grid has the same id
    single = expand(validate_spec({"name": "g", "model": {"width": 16}, "train": {"seed": 1}}))
    assert single[0].run_id in {p.run_id for p in a}


def test_duplicate_values_give_one_point():
    assert len(expand(_spec({"width": [8, 8, 16]}))) == 2


@pytest.mark.parametrize(
    "grid,key",
    [
        ({"width": [8, 0]}, "grid.width"),
        ({"depth": [2, "x"]}, "grid.depth"),
        ({"activation": ["relu", "gelu"]}, "grid.activation"),
        ({"seed": {"range": [3, 3]}}, "grid.seed"),
        ({"width": 8}, "grid.width"),
        ({"train.nope": [1]}, "grid.train.nope"),
    ],
)
def test_invalid_axes_name_the_axis(grid, key):
    with pytest.raises(SpecError) as err:
        expand(_spec(grid))
    assert err.value.key == key


def test_invalid_combination_is_reported():
    with pytest.raises(SpecError, match="combination"):
        expand(_spec({"model.init": ["gaussian", "antisymmetric"], "width": [3, 4]}))


def test_chunks_group_equal_shapes_and_respect_the_size_limit():
    spec = _spec(
        {"width": [8, 16], "init_scale": [0.5, 1.0, 2.0], "seed": {"range": [0, 5]}},
        execution={"max_chunk_size": 4},
    )
    chunks = make_chunks(expand(spec), spec)
    assert sum(len(c.points) for c in chunks) == 30
    for c in chunks:
        assert len(c.points) <= 4
        assert len({p.config.model.width for p in c.points}) == 1
    assert len({c.chunk_id for c in chunks}) == len(chunks)


def _naive_expand(spec):
    """Reference: every combination validated as a whole RunConfig, repeats dropped by run_id."""
    from phasesweep.pipeline._axes import axis_path, axis_values
    from phasesweep.pipeline.spec import RunConfig

    axes = [(a, axis_path(a), list(axis_values(a, v))) for a, v in spec.grid.items()]
    out, seen = [], set()
    for combo in itertools.product(*(values for _, _, values in axes)):
        raw = spec.base().model_dump()
        for (_, path, _), value in zip(axes, combo):
            *parents, last = path.split(".")
            node = raw
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        config = RunConfig.model_validate(raw)
        run_id = run_id_of(spec.name, config)
        if run_id not in seen:
            seen.add(run_id)
            out.append((run_id, dict(zip((a for a, _, _ in axes), combo)), config))
    return out


#: Axes of several sections, interleaved, with repeated values (1 and 1.0 are one init
#: scale), two axes on one field, and a cross-field rule (antisymmetric needs even widths).
MIXED_GRIDS = [
    {"seed": [1, 0, 1, 2], "width": [8, 8, 16], "lr": [0.1, 0.2], "init_scale": [1, 1.0, 2]},
    {"width": [8, 16], "model.width": [16, 8], "train.seed": [0, 0, 3]},
    {"init_scale": {"logspace": [-1, 1, 3]}, "seed": {"range": [4, 0, -2]}, "depth": [3, 2]},
    {"model.init": ["gaussian", "antisymmetric"], "width": [4, 8], "seed": [0, 1]},
]


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("grid", MIXED_GRIDS)
def test_streamed_expansion_matches_a_naive_loop(monkeypatch, grid, eager):
    """Same points, order, coords and configs as validating every combination whole;
    also when every section is validated lazily (as large sections are)."""
    import phasesweep.pipeline.grid._section_options as grid_mod

    spec = _spec(grid)
    if not eager:
        monkeypatch.setattr(grid_mod, "EAGER_COMBINATIONS", 0)
    got = [(p.run_id, p.coords, p.config) for p in iter_points(spec)]
    assert got == _naive_expand(spec)
    assert [p.run_id for p in expand(spec)] == [r for r, _, _ in got]
    if eager:  # small sections: repeats counted exactly
        assert grid_size(spec) == len(got)
    skip = {r for r, _, _ in got[::2]}
    assert [p.run_id for p in iter_points(spec, skip=skip)] == [r for r, _, _ in got[1::2]]


@pytest.mark.parametrize("grid", MIXED_GRIDS)
def test_groups_and_members_split_the_axes_product(grid):
    """:attr:`Grid.n_groups` counts what :meth:`Grid.groups` lists, and groups times
    members is the product of every axis' length (repeats included)."""
    g = Grid(_spec(grid))
    assert g.n_groups == sum(1 for _ in g.groups())
    assert g.n_groups * g.members == math.prod(axis_size(a, v) for a, v in grid.items())


def test_range_sizes_match_python_ranges_and_step_zero_is_refused():
    rng = np.random.default_rng(0)
    for start, stop, step in rng.integers(-20, 20, (300, 3)):
        if step == 0:
            continue
        args = [int(start), int(stop), int(step)]
        if len(range(*args)):
            assert axis_size("seed", {"range": args}) == len(range(*args))
    assert axis_size("seed", {"range": [0, 10**30, 3]}) == -(-(10**30) // 3)  # > sys.maxsize
    with pytest.raises(SpecError, match="step must not be 0") as err:
        axis_size("seed", {"range": [0, 10, 0]})
    assert err.value.key == "grid.seed"


@pytest.mark.parametrize(
    "axis",
    [
        {"logspace": [0, 400, 3]},  # 10**400 overflows to inf
        {"linspace": [0, float("inf"), 3]},
        {"logspace": [float("nan"), 1, 3]},
    ],
)
def test_spaced_axes_must_stay_finite(axis):
    with pytest.raises(SpecError, match="not a finite number") as err:
        expand(_spec({"lr": axis}))
    assert err.value.key == "grid.lr"


def test_grid_size_is_bounded_before_expansion():
    """The product of the axis sizes is checked before any value is computed: a billion
    seeds or a logspace of 10**12 values is refused at once (it would not fit in memory)."""
    with pytest.raises(SpecError, match="1000000000 points exceed execution.max_points"):
        iter_points(_spec({"seed": {"range": [0, 10**9]}}))
    with pytest.raises(SpecError, match="max_points"):
        iter_points(_spec({"lr": {"logspace": [-3, 0, 10**12]}, "seed": [0, 1]}))
    with pytest.raises(SpecError, match="= 20"):
        iter_points(
            _spec({"seed": {"range": [0, 7]}, "width": [8, 16, 32]}, execution={"max_points": 20})
        )
    assert len(expand(_spec({"seed": {"range": [0, 20]}}, execution={"max_points": 20}))) == 20


def test_grid_size_of_a_huge_grid_without_expanding_it():
    """10**8 points (over the default limit, as a stored spec may be): sized from the axes
    in far less memory than one Point each would take."""
    spec = _spec(
        {
            "init_scale": {"logspace": [-3, 1, 100]},
            "width": [8, 16],
            "seed": {"range": [0, 500000]},
        },
        execution={"max_points": 10**8},
    )
    tracemalloc.start()
    try:
        assert grid_size(spec) == 100 * 2 * 500000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20


def _peak_while_iterating(spec) -> tuple[int, int]:
    """(points, peak traced bytes) of streaming ``spec``'s grid, keeping no point. From a
    collected heap: where the cyclic collector runs during the stream moves the peak by
    about 0.2 MB, and without this that depended on the tests run before."""
    gc.collect()
    tracemalloc.start()
    try:
        n = sum(1 for _ in iter_points(spec))
        return n, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _list_bytes(spec) -> tuple[int, int]:
    """(points, traced bytes) of holding ``spec``'s grid as a list of Points."""
    tracemalloc.start()
    try:
        points = expand(spec)
        return len(points), tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "grid",
    [
        {
            "init_scale": {"logspace": [-2, 0, 20]},
            "width": [8, 16, 32],
            "seed": {"range": [0, 200]},
        },
        {"seed": {"range": [0, 5000]}},  # one large section, validated lazily
        {"width": {"range": [1, 51]}, "init_scale": {"linspace": [0.5, 2, 100]}},  # likewise
    ],
)
def test_streaming_holds_far_less_than_the_list_of_points(grid):
    spec = _spec(grid)
    n, list_bytes = _list_bytes(spec)
    assert n >= 5000
    streamed, peak = _peak_while_iterating(spec)
    assert streamed == n
    assert peak < list_bytes / 10, (peak, list_bytes)


@pytest.mark.slow
def test_a_large_grid_streams_in_bounded_memory():
    """10**5 points of a lazy model section (10**4 combinations): the peak while
    streaming stays below what a tenth of them held in a list take (measured: 0.6 MB
    against 27 MB)."""
    spec = _spec(
        {
            "init_scale": {"logspace": [-3, 1, 100]},
            "width": {"range": [2, 102]},  # model section: 10**4 combinations, lazy
            "seed": {"range": [0, 10]},
        }
    )
    small = _spec({"seed": {"range": [0, 10**4]}, "width": [8]})
    n_small, bytes_small = _list_bytes(small)
    n, peak = _peak_while_iterating(spec)
    assert (n_small, n) == (10**4, 10**5)
    assert peak < bytes_small, (peak, bytes_small)


def _store_runs(store, sweep, run_ids, make_chunk):
    store.write_chunk(sweep, "c0", make_chunk(run_ids))


def test_plan_keeps_only_the_points_the_store_lacks(tmp_path, store_make_chunk):
    from phasesweep.pipeline.run._launch import plan_sweep
    from phasesweep.storage import Store

    raw = {"name": "g", "grid": {"width": [8, 16], "seed": {"range": [0, 10]}}}
    points = expand(validate_spec(raw))
    store = Store.open(str(tmp_path / "store"))
    _store_runs(store, "g", [p.run_id for p in points[:15]], store_make_chunk)
    plan = plan_sweep(raw, store)
    assert (plan.total, plan.skipped) == (20, 15)
    assert [p.run_id for p in plan.todo] == [p.run_id for p in points[15:]]
    assert [p.coords for p in plan.todo] == [p.coords for p in points[15:]]
    assert sum(len(c.points) for c in plan.chunks) == 5


def test_status_of_a_stored_huge_grid_counts_without_expanding(tmp_path, capsys, store_make_chunk):
    """A stored spec of 10**8 points: ``status`` answers from the axis sizes and the store,
    in a few MB of Python memory (one Point each would be tens of GB)."""
    from phasesweep.pipeline.run._launch import sweep_status
    from phasesweep.storage import Store

    from phasesweep._cli import main

    raw = {
        "name": "huge",
        "execution": {"max_points": 10**8},
        "grid": {"init_scale": {"logspace": [-3, 1, 100]}, "seed": {"range": [0, 10**6]}},
    }
    store = Store.open(str(tmp_path / "store"))
    store.write_spec("huge", yaml.safe_dump(raw))
    first = list(itertools.islice(iter_points(validate_spec(raw)), 7))
    _store_runs(store, "huge", [p.run_id for p in first], store_make_chunk)
    tracemalloc.start()
    try:
        status = sweep_status(store, "huge")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (status.total, status.done) == (10**8, 7)
    assert peak < 8 * 2**20, peak
    assert main(["status", "huge", "--store", store.uri]) == 0
    assert "7 of 100000000 points done, 99999993 remaining" in capsys.readouterr().out


#: The spec (its public module and the private ones it is built from) and the grid, by file.
SPEC_AND_GRID = [
    "pipeline/spec.py",
    "pipeline/_[!_]*.py",
    "pipeline/grid/*.py",
    "pipeline/data/*.py",
]


def _our_imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """The modules of ours that ``source`` (the module ``module``) imports anywhere: at the
    top, inside functions and under ``if TYPE_CHECKING:`` (``from a import b`` names
    ``a.b`` where b is a module)."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for a in node.names:
                name = f"{base}.{a.name}"
                found.add(name if _file_of(name) else base)
    return {m for m in found if m.startswith("phasesweep.")}


def _module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(["phasesweep", *(rel[:-1] if rel[-1] == "__init__" else rel)])


def _file_of(module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for path in (ROOT / rel.with_suffix(".py"), ROOT / rel / "__init__.py"):
        if path.exists():
            return path
    return None


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_spec_imports_nothing_of_the_grid_and_no_cycle_joins_them():
    """spec -> (axes, sections, the user's files) <- grid <- horizon: the grid expands the
    spec, the spec never reaches up into the grid (not even inside a function or for type
    checking), and the modules of both import each other in no cycle."""
    files = sorted({p for pattern in SPEC_AND_GRID for p in ROOT.glob(pattern)})
    graph = {
        _module_of(p): _our_imports(p.read_text(), _module_of(p), p.name == "__init__.py")
        for p in files
    }
    spec = "phasesweep.pipeline.spec"
    assert {spec, "phasesweep.pipeline._axes", "phasesweep.pipeline.grid._horizon"} <= set(graph)
    assert _cycle(graph) is None, _cycle(graph)
    below_grid = [m for m in graph if not m.startswith("phasesweep.pipeline.grid")]
    assert [(m, n) for m in below_grid for n in graph[m] if ".pipeline.grid" in n] == []
    # the check sees an import inside a function: this one (the former spec's) closes a cycle
    inside = "def f():\n    from phasesweep.pipeline.grid._horizon import check_at_time\n"
    assert _cycle({**graph, spec: graph[spec] | _our_imports(inside, spec)}) is not None


def test_the_pipelines_load_spec_is_its_former_name_of_load_spec_and_raw():
    """``phasesweep.pipeline.load_spec`` (kept for compatibility) returns the spec and its
    raw dict, as ``load_spec_and_raw`` says; ``phasesweep.load_spec`` returns the spec."""
    from phasesweep.pipeline import spec

    import phasesweep
    from phasesweep import pipeline

    assert pipeline.load_spec is spec.load_spec is spec.load_spec_and_raw
    sweep, raw = pipeline.load_spec(ROOT / "sweeps/quickstart.yaml", ["train.steps=7"])
    assert raw["train"]["steps"] == 7
    assert sweep == phasesweep.load_spec(ROOT / "sweeps/quickstart.yaml", ["train.steps=7"])
