"""The layering of the three packages, checked on the source (every import statement,
those inside functions included) and on what an import really loads.

- ``storage`` imports no other package of ours (only the shared ``phasesweep._config`` and
  ``phasesweep._lazy``, its lazy ``__init__``);
- ``analysis`` reads the store, the shared config and ``phasesweep._lazy`` (its lazy
  ``__init__``), never the training package (nor
  the top-level ``phasesweep._api``, which imports it);
- ``pipeline`` imports from ``analysis`` only its declarative ``analysis.config``;
- ``phasesweep._config`` and ``analysis.config`` are leaves (pydantic and PyYAML only),
  so the spec, which composes ``analysis.config``, stays cheap to import in every worker.
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
ALLOWED: dict[str, tuple[str, ...]] = {
    "phasesweep.storage": ("phasesweep.storage", "phasesweep._config", "phasesweep._lazy"),
    "phasesweep.analysis": (
        "phasesweep.analysis",
        "phasesweep.storage",
        "phasesweep._config",
        "phasesweep._lazy",
    ),
    "phasesweep.analysis.config": ("phasesweep._config",),
    "phasesweep._config": (),
    "phasesweep._lazy": (),
}
#: ... and those it must not import (checked after ``ALLOWED``).
FORBIDDEN: dict[str, tuple[str, ...]] = {"phasesweep.pipeline": ("phasesweep.analysis",)}
#: exceptions to ``FORBIDDEN``: the spec composes the analysis' own sections.
EXCEPT: dict[str, tuple[str, ...]] = {"phasesweep.pipeline": ("phasesweep.analysis.config",)}


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
    mods = [
        (ROOT / "phasesweep" / f"{m}.py", f"phasesweep.{m}", False) for m in ("_config", "_lazy")
    ]
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
