"""The layering of our packages, checked on the source (every import statement, those
inside functions and under ``if TYPE_CHECKING:`` included) and on what an import really
loads. docs/design.md ("Code layout") draws the same arrows.

- ``phasesweep._config`` and ``analysis.config`` are leaves (pydantic and PyYAML only), so
  the spec, which composes ``analysis.config``, stays cheap to import in every worker;
- ``storage`` imports no other package of ours (only ``_config`` and ``_lazy``);
- ``analysis`` reads the store and the shared config, never the pipeline (nor the top-level
  ``phasesweep._api``, which imports it);
- the pipeline's rooms, bottom up: ``spec`` and ``activations`` (the declarative modules;
  the spec composes ``analysis.config``); ``data`` (datasets); ``grid`` (axes, run ids,
  chunks: no torch, no Ray; its reach check reads ``analysis.config``); ``train`` (the
  ensemble trainer: no Ray, no fsspec; it builds its tables with ``storage.schema``);
  ``run`` (launch, driver, Ray: the store); ``refine`` (on top of ``run``);
- ``phasesweep._gallery`` (the seeds' results) launches, analyzes and reads sweeps, never
  the API that calls it nor the CLI;
- ``phasesweep._api`` may use everything; the CLI (``phasesweep._cli``) only the API,
  the shared config and its own output formats: every command is one call of the API.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: folder of the layout -> the package it is installed as (phasesweep/FOLDER links to it).
PACKAGES = {
    "storage": "phasesweep.storage",
    "analysis": "phasesweep.analysis",
    "pipeline": "phasesweep.pipeline",
}

#: module or package of ours -> the modules of ours it may import (prefixes: a package
#: allows its submodules). The most specific entry applies.
_LEAVES = ("phasesweep._config", "phasesweep._lazy", "phasesweep._version")
#: the spec's layer: the public models and the private modules they are built from (the
#: axes' names, the run config's sections, the data section, the YAML file), and the reader
#: of a researcher's weight and array files that its validators call (numpy only)
_SPEC = (
    "phasesweep.pipeline.spec",
    "phasesweep.pipeline.activations",
    "phasesweep.pipeline._axes",
    "phasesweep.pipeline._run_config",
    "phasesweep.pipeline._data_config",
    "phasesweep.pipeline._spec_file",
    "phasesweep.pipeline.data._user_data",
    *_LEAVES,
)
_DATA = ("phasesweep.pipeline.data", *_SPEC)
#: the grid asks the optimizer for its rows per step and member fields (``train._optim``
#: imports torch only inside its tensor methods)
_GRID = ("phasesweep.pipeline.grid", "phasesweep.pipeline.train._optim", *_SPEC)
_TRAIN = ("phasesweep.pipeline.train", _DATA[0], _GRID[0], "phasesweep.storage.schema", *_SPEC)
_RUN = ("phasesweep.pipeline.run", *_TRAIN, "phasesweep.storage")
ALLOWED: dict[str, tuple[str, ...]] = {
    "phasesweep._config": (),
    "phasesweep._lazy": (),
    "phasesweep.storage": ("phasesweep.storage", *_LEAVES),
    "phasesweep.analysis": ("phasesweep.analysis", "phasesweep.storage", *_LEAVES),
    "phasesweep.analysis.config": ("phasesweep._config",),
    "phasesweep.pipeline.activations": _LEAVES,
    "phasesweep.pipeline._axes": _SPEC,
    "phasesweep.pipeline._run_config": _SPEC,
    "phasesweep.pipeline._data_config": _SPEC,
    "phasesweep.pipeline._spec_file": _SPEC,
    "phasesweep.pipeline.data._user_data": _LEAVES,
    "phasesweep.pipeline.spec": (*_SPEC, "phasesweep.analysis.config"),
    "phasesweep.pipeline.data": _DATA,
    "phasesweep.pipeline.grid": _GRID,
    "phasesweep.pipeline.grid._horizon": (*_GRID, "phasesweep.analysis.config"),
    "phasesweep.pipeline.train": _TRAIN,
    "phasesweep.pipeline.run": _RUN,
    "phasesweep.pipeline.refine": ("phasesweep.pipeline.refine", *_RUN),
    "phasesweep._cli": (
        "phasesweep._cli",
        "phasesweep._api",
        "phasesweep._format",
        "phasesweep.pipeline.spec",
        *_LEAVES,
    ),
    "phasesweep._version": (),
    # the seeds' gallery sits beside the API: it launches sweeps (pipeline.run), analyzes
    # and draws them (analysis), reads the store and rebuilds a run's inputs (spec, data)
    # and initial weights (train's init and model) for a closed form; only the API
    # imports it
    "phasesweep._gallery": (
        "phasesweep._gallery",
        "phasesweep.pipeline.data",
        "phasesweep.pipeline.train._init",
        "phasesweep.pipeline.train._models",
        "phasesweep.pipeline.spec",
        "phasesweep.pipeline.grid",
        "phasesweep.pipeline.run",
        "phasesweep.analysis",
        "phasesweep.storage",
        *_LEAVES,
    ),
}
#: ... and those it must not import (checked after ``ALLOWED``).
FORBIDDEN: dict[str, tuple[str, ...]] = {"phasesweep.pipeline": ("phasesweep.analysis",)}
#: exceptions to ``FORBIDDEN``: the spec composes the analysis' own sections, and the
#: grid's reach check uses its definition of a reached time.
EXCEPT: dict[str, tuple[str, ...]] = {
    "phasesweep.pipeline.spec": ("phasesweep.analysis.config",),
    "phasesweep.pipeline.grid._horizon": ("phasesweep.analysis.config",),
}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _rule(module: str, table: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    keys = [k for k in table if _within(module, k)]
    return table[max(keys, key=len)] if keys else None


def imported(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every module of ours that ``source`` (the module ``module``)
    imports; ``from phasesweep.x import y`` names ``phasesweep.x.y`` (y may be a module)."""
    base = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = node.module or ""
            if node.level:
                parts = base.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                parent = f"{anchor}.{parent}" if parent else anchor
            found += [(node.lineno, f"{parent}.{a.name}") for a in node.names]
    return [(line, name) for line, name in found if _within(name, "phasesweep")]


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``source`` that break the layering, as ``module:line: target``."""
    allowed, forbidden = _rule(module, ALLOWED), _rule(module, FORBIDDEN) or ()
    excepted = _rule(module, EXCEPT) or ()
    bad = []
    for line, name in imported(source, module, is_package):
        # the top-level package itself (its version, its file) imports nothing eagerly
        ok = name == "phasesweep" or allowed is None or any(_within(name, a) for a in allowed)
        if any(_within(name, f) for f in forbidden) and not any(_within(name, e) for e in excepted):
            ok = False
        if not ok:
            bad.append(f"{module}:{line}: imports {name}")
    return bad


def _modules() -> list[tuple[Path, str, bool]]:
    mods = []
    for path in sorted((ROOT / "phasesweep").rglob("*.py")):
        rel = path.relative_to(ROOT / "phasesweep").with_suffix("").parts
        if rel[0] in PACKAGES:  # the links to the layout's folders, read below
            continue
        is_package = rel[-1] == "__init__"
        mods.append(
            (path, ".".join(["phasesweep", *rel[: -1 if is_package else None]]), is_package)
        )
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            is_package = rel[-1] == "__init__"
            mods.append((path, ".".join([package, *rel[: -1 if is_package else None]]), is_package))
    return mods


def test_every_module_keeps_to_its_layer():
    mods = _modules()
    assert {m for _, m, _ in mods} >= {
        "phasesweep.storage._store",
        "phasesweep.analysis._plotting",
        "phasesweep.analysis.figures._kind",
        "phasesweep.pipeline.spec",
    }
    bad = [v for path, m, pkg in mods for v in violations(path.read_text(), m, pkg)]
    assert bad == []


@pytest.mark.parametrize(
    "module, source, target",
    [
        ("phasesweep.storage._store", "from phasesweep.pipeline.spec import SpecError", "pipeline"),
        (
            "phasesweep.storage._catalog",
            "def f():\n    import phasesweep.analysis._phase",
            "analysis",
        ),
        ("phasesweep.analysis._plotting", "from phasesweep.pipeline import spec", "pipeline"),
        ("phasesweep.analysis.figures._kind", "from ...pipeline.grid import expand", "pipeline"),
        ("phasesweep.analysis._report", "from phasesweep import _api", "_api"),
        ("phasesweep.analysis.config", "from phasesweep.storage import schema", "storage"),
        (
            "phasesweep.pipeline.run._launch",
            "from phasesweep.analysis._plotting import x",
            "analysis",
        ),
        ("phasesweep.pipeline.train._trainer", "from phasesweep import analysis", "analysis"),
        ("phasesweep._config", "from phasesweep.pipeline.spec import SweepSpec", "pipeline"),
        (
            "phasesweep.pipeline.spec",
            "def f():\n    from phasesweep.pipeline.grid import x",
            "pipeline.grid",
        ),
        (
            "phasesweep.pipeline.grid._grid",
            "from phasesweep.pipeline.train import _models",
            "pipeline.train",
        ),
        ("phasesweep.pipeline.grid._grid", "from phasesweep.analysis.config import X", "analysis"),
        (
            "phasesweep.pipeline.train._trainer",
            "from phasesweep.pipeline.run import _ray",
            "pipeline.run",
        ),
        ("phasesweep.pipeline.train._trainer", "from phasesweep.storage import Store", "storage"),
        (
            "phasesweep.pipeline.run._driver",
            "from phasesweep.pipeline.refine import x",
            "pipeline.refine",
        ),
        ("phasesweep._cli", "from phasesweep.storage import verify", "storage"),
        ("phasesweep._cli._run", "from phasesweep.pipeline.run import _launch", "pipeline.run"),
        ("phasesweep._gallery._gallery", "from phasesweep import _api", "_api"),
        ("phasesweep._gallery.results.lazy_training", "from phasesweep._cli import main", "_cli"),
    ],
)
def test_a_forbidden_import_is_found(module, source, target):
    """The checker itself: each of these imports, added to that module, fails the test above."""
    (bad,) = violations(source, module)
    assert bad.startswith(f"{module}:{source.count(chr(10)) + 1}: imports phasesweep.{target}")


@pytest.mark.parametrize(
    "module, source",
    [
        ("phasesweep.pipeline.spec", "from phasesweep.analysis.config import PlotSpec"),
        ("phasesweep.analysis._plotting", "from phasesweep.storage import open_catalog"),
        ("phasesweep.analysis.figures._kind", "from .. import style"),
        ("phasesweep.storage._store", "from phasesweep._config import SpecError"),
        (
            "phasesweep.pipeline.grid._horizon",
            "from phasesweep.analysis.config import reached_time",
        ),
        ("phasesweep.pipeline.train._trainer", "from phasesweep.storage.schema import to_table"),
        ("phasesweep.pipeline.run._driver", "from phasesweep.pipeline.train import _trainer"),
        ("phasesweep._cli", "from phasesweep import _api"),
    ],
)
def test_an_allowed_import_passes(module, source):
    assert imported(source, module) and violations(source, module) == []


@pytest.mark.process
def test_config_modules_load_neither_pandas_nor_matplotlib():
    heavy = ["numpy", "pandas", "pyarrow", "duckdb", "matplotlib", "torch", "ray"]
    code = (
        "import sys, json\n"
        "import phasesweep.analysis.config\n"
        f"heavy = {heavy!r}\n"
        "config = [m for m in heavy if m in sys.modules]\n"
        "import phasesweep.pipeline.spec\n"
        "print(json.dumps([config, [m for m in heavy if m in sys.modules]]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    config, spec = json.loads(out.stdout)
    assert config == []
    # the pipeline package itself needs numpy (grid points); nothing of the analysis' own
    assert not {"pandas", "pyarrow", "duckdb", "matplotlib", "torch", "ray"} & set(spec)


@pytest.mark.process
@pytest.mark.parametrize(
    "module, absent",
    [
        ("phasesweep.pipeline.grid._grid", ["torch", "ray", "fsspec", "duckdb"]),
        ("phasesweep.pipeline.train._trainer", ["ray", "fsspec", "duckdb"]),
    ],
)
def test_a_room_loads_none_of_the_layers_above_it(module, absent):
    """The grid plans without torch (a dry run of 10⁷ points must not wait for it) and the
    trainer runs without Ray or fsspec (``scripts/gpu-check`` has neither)."""
    code = f"import sys, json, {module}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert not set(absent) & set(json.loads(out.stdout))


def import_graph() -> dict[str, set[str]]:
    """module of ours -> the modules of ours it imports (every statement, as above); an import
    of a name that is not a module (``from m import f``) is an import of ``m``."""
    mods = _modules()
    names = {m for _, m, _ in mods}
    graph: dict[str, set[str]] = {}
    for path, module, is_package in mods:
        targets = set()
        for _, name in imported(path.read_text(), module, is_package):
            while name not in names and "." in name:
                name = name.rpartition(".")[0]
            if name in names and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others():
    """No import cycle among our modules, counting imports inside functions (the cycle
    spec -> grid -> horizon -> spec hid in a validator's body)."""
    graph = import_graph()
    assert {"phasesweep.pipeline.spec", "phasesweep._cli", "phasesweep._api"} <= set(graph)
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_body():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.process
def test_the_lazy_analysis_package_resolves_its_public_functions():
    """The package's public functions come from its private modules on first access, also
    once those modules are loaded (``phasesweep.analysis.__init__`` stays light)."""
    code = (
        "import phasesweep.analysis._analyze, phasesweep.analysis._report\n"
        "import phasesweep.analysis as a\n"
        "print(*[f'{f.__module__}.{f.__name__}' for f in (a.analyze, a.report, a.draw, a.plot)])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert out.stdout.split() == [
        "phasesweep.analysis._analyze.analyze",
        "phasesweep.analysis._report.report",
        "phasesweep.analysis._plotting.draw",
        "phasesweep.analysis._plotting.plot",
    ]


@pytest.mark.parametrize("package", ["phasesweep", "pipeline", "storage", "analysis"])
def test_every_public_name_resolves_and_static_tools_see_the_lazy_ones(package):
    """Each name of ``__all__`` is a module attribute; the lazy ones are exactly what the
    ``if TYPE_CHECKING:`` block imports (what pyright reads), each the object its module
    defines; an unknown name is an AttributeError, not a lazy import."""
    import importlib

    from phasesweep._lazy import type_checking_imports

    name = "phasesweep" if package == "phasesweep" else f"phasesweep.{package}"
    module = importlib.import_module(name)
    lazy = type_checking_imports(Path(module.__file__).read_text())
    assert lazy and set(lazy) <= set(module.__all__)
    for attr in module.__all__:
        value = getattr(module, attr)
        if attr in lazy:
            assert value is getattr(importlib.import_module(lazy[attr]), attr)
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no_such_name"):
        module.no_such_name  # noqa: B018


def test_type_checking_imports_read_only_absolute_from_imports():
    from phasesweep._lazy import type_checking_imports

    text = "if TYPE_CHECKING:\n    from a.b import c, d as e\nelse:\n    from x import y\n"
    assert type_checking_imports(text) == {"c": "a.b", "e": "a.b"}
    with pytest.raises(ValueError, match="import os"):
        type_checking_imports("if TYPE_CHECKING:\n    import os\n")
