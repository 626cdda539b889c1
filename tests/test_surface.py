"""The public surface is a mechanism: private modules and names start with ``_``, each
package re-exports its public names through ``__init__`` (``__all__``), and nothing reaches
into another module's ``_`` names — neither the sources, nor the tests, nor the benchmarks.

The tests and benchmarks may import a private module's public (un-underscored) names: those
are the documented testing hooks (see each package's docstring), white-box entry points that
may change without notice.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["phasesweep", "pipeline", "storage", "analysis"]
CLIENTS = ["tests", "benchmarks"]
PACKAGES = ["phasesweep", "phasesweep.pipeline", "phasesweep.storage", "phasesweep.analysis"]


def _files(folders: list[str]) -> list[Path]:
    return [p for f in folders for p in sorted((ROOT / f).rglob("*.py"))]


def _is_private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and name != "_" and not dunder


def _private_names_defined() -> set[str]:
    """Every ``_name`` our sources define: functions, classes, module globals, attributes."""
    names: set[str] = set()
    for path in _files(SOURCES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if _is_private(n)}


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:  # the parent is a module, not a package
        return False


def reach_ins(source: str, private: set[str]) -> list[tuple[int, str]]:
    """(line, what) of every ``from phasesweep... import _name`` of a non-module name and
    every attribute access ``x._name`` of a private name our sources define."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("phasesweep"):
            for a in node.names:
                if _is_private(a.name) and not _is_module(f"{node.module}.{a.name}"):
                    bad.append((node.lineno, f"from {node.module} import {a.name}"))
        elif isinstance(node, ast.Attribute) and node.attr in private:
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                bad.append((node.lineno, f"._{node.attr.lstrip('_')}"))
    return bad


def test_reach_in_detector_sees_what_it_must():
    private = {"_stepper", "_lease"}
    src = (
        "from phasesweep.pipeline.train._trainer import _member_blocks\n"
        "x = trainer._stepper\n"
        "claims._lease('a')\n"
        "self._stepper = 1\n"
        "from phasesweep.analysis import _series\n"
        "fig._suptitle\n"
    )
    assert [line for line, _ in reach_ins(src, private)] == [1, 2, 3]


@pytest.mark.parametrize("folder", SOURCES + CLIENTS)
def test_no_module_reaches_into_another_modules_private_names(folder):
    """Sources may touch private attributes of their own objects (``other._x`` inside the
    class), so for them only imports of another module's ``_`` names count; tests and
    benchmarks may touch none."""
    private = _private_names_defined()
    assert {"_perm", "_stepper", "_Block"} <= private
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _files([folder])
        for line, what in reach_ins(path.read_text(), private)
        if folder in CLIENTS or what.startswith("from ")
    ]
    assert bad == []


#: the pipeline's subpackages by role (docs/design.md, "Layout"): folders of private modules.
ROOMS = {"grid", "data", "train", "run", "refine"}


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_exports_its_public_names_and_hides_its_modules(package):
    mod = importlib.import_module(package)
    assert mod.__all__, package
    for name in mod.__all__:
        assert not _is_private(name)
        assert getattr(mod, name) is not None, f"{package}.{name}"
    folder = ROOT / (package.split(".")[1] if "." in package else "phasesweep")
    public_modules = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")} | {
        p.name
        for p in folder.iterdir()
        if p.is_dir() and (p / "__init__.py").exists() and not p.name.startswith("_")
    }
    # the modules a user may import by name: the contract's declarative ones and registries
    # (and phasesweep's three packages, the links to the layout's folders)
    packages = {"pipeline", "storage", "analysis"}
    assert (
        public_modules <= {"spec", "activations", "schema", "config", "figures"} | packages | ROOMS
    )
    # a room of the pipeline groups modules by role: every module in it is private
    for room in public_modules & ROOMS:
        for path in (folder / room).rglob("*.py"):
            assert path.stem.startswith("_"), path.relative_to(ROOT)
