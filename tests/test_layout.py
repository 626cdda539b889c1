"""The layout stays navigable (issue 31's measures, kept): no module over 650 lines, no
folder of our packages with more than 14 modules, and the walkthroughs of
``docs/contributing.md`` cite files and names that exist. Import rules and cycles are
``tests/test_layering.py``'s; the store's file system stays inside ``storage/``
(``tests/test_store.py``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the folders of the layout whose modules make up the package (phasesweep/ links to the rest)
SOURCE_FOLDERS = ("phasesweep", "pipeline", "storage", "analysis")
MAX_MODULE_LINES = 650
MAX_FOLDER_MODULES = 14


def source_files() -> list[Path]:
    files = []
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[0] == "phasesweep" and rel.parts[1] in SOURCE_FOLDERS:
                continue  # a link to a layout folder, read under its own name
            files.append(path)
    return files


def test_no_module_is_over_the_line_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in source_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_folder_holds_more_modules_than_a_reader_scans():
    """Modules of a folder, its ``__init__`` not counted."""
    counts: dict[str, int] = {}
    for p in source_files():
        if p.name != "__init__.py":
            key = str(p.parent.relative_to(ROOT))
            counts[key] = counts.get(key, 0) + 1
    assert "pipeline/train" in counts
    assert {k: n for k, n in counts.items() if n > MAX_FOLDER_MODULES} == {}


CONTRIBUTING = ROOT / "docs" / "contributing.md"
#: `path/to/file.py` or `path/to/file.py:name` (a module-level name or Class.method)
CITATION = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|toml))(?::([\w.]+))?`")


def citations(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in CITATION.finditer(text)]


def defines(path: Path, dotted: str) -> bool:
    """Whether the module at ``path`` defines ``dotted`` (``name`` or ``Class.attr``) at its
    top level: a function, class, assignment or import."""
    body = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found = None
        for node in body:
            names: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [(a.asname or a.name).split(".")[0] for a in node.names]
            if part in names:
                found = node
                break
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def test_the_walkthroughs_cite_files_and_names_that_exist():
    text = CONTRIBUTING.read_text()
    cited = citations(text)
    for section in ("Add a metric", "Add an optimizer", "Add a CLI subcommand"):
        assert f"## {section}" in text
    assert len(cited) >= 9
    missing = [
        f"{path}:{name}" if name else path
        for path, name in cited
        if not (ROOT / path).exists()
        or (name is not None and path.endswith(".py") and not defines(ROOT / path, name))
    ]
    assert missing == []


@pytest.mark.parametrize(
    "text, dotted, expected",
    [
        ("def f():\n    pass\n", "f", True),
        ("class A:\n    def m(self):\n        pass\n", "A.m", True),
        ("class A:\n    x: int = 1\n", "A.x", True),
        ("X = 1\n", "Y", False),
        ("class A:\n    pass\n", "A.m", False),
    ],
)
def test_a_cited_name_is_found_only_where_it_is_defined(tmp_path, text, dotted, expected):
    path = tmp_path / "m.py"
    path.write_text(text)
    assert defines(path, dotted) is expected


def test_citations_are_read_with_and_without_a_name():
    assert citations("see `a/b.py:f`, `docs/x.md` and `c.py`") == [
        ("a/b.py", "f"),
        ("docs/x.md", None),
    ]
