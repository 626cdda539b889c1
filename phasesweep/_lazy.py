"""Lazy re-exports for a package's ``__init__`` (PEP 562 module ``__getattr__``).

Why: ``import phasesweep`` and the spec (which composes ``phasesweep.analysis.config``)
must stay cheap, while the names they re-export live in modules that load torch, Ray,
DuckDB or matplotlib. Cost: the first access of each name imports its module; later
accesses are plain globals (the value is cached in the package's namespace).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(
    namespace: dict[str, Any], exports: dict[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``namespace``:
    ``exports`` maps each public name to the module that defines it."""

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
