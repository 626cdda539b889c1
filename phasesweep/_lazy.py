"""Lazy re-exports for a package's ``__init__`` (PEP 562 module ``__getattr__``).

Why: ``import phasesweep`` and the spec (which composes ``phasesweep.analysis.config``)
must stay cheap, while the names they re-export live in modules that load torch, Ray,
DuckDB or matplotlib. Cost: the first access of each name imports its module; later
accesses are plain globals (the value is cached in the package's namespace).

The names are written once, as imports in the package's ``if TYPE_CHECKING:`` block:
static tools (pyright, an editor) follow them like any import, and :func:`lazy_exports`
reads the same block from the package's source at import time (as ``lazy_loader``'s
``attach_stub`` reads a stub; parsing a short ``__init__`` costs well under a
millisecond). The ``__getattr__`` goes in the block's ``else:``, where static tools do
not see it: a module ``__getattr__`` would make them accept any name.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any


def type_checking_imports(source: str) -> dict[str, str]:
    """Name -> module of every ``from MODULE import NAME`` in the ``if TYPE_CHECKING:``
    blocks of ``source`` (a module's text)."""
    exports: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                if not isinstance(stmt, ast.ImportFrom) or stmt.module is None or stmt.level:
                    raise ValueError(f"only absolute 'from … import' here: {ast.unparse(stmt)}")
                exports.update({a.asname or a.name: stmt.module for a in stmt.names})
    return exports


def lazy_exports(
    namespace: dict[str, Any],
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``namespace``,
    exporting what its ``if TYPE_CHECKING:`` block imports."""
    exports = type_checking_imports(Path(namespace["__file__"]).read_text())

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
