"""The figure kinds of ``phasesweep plot``, one module each, found by name.

Every public module of this package defines one :class:`FigureKind` subclass (its
``kind`` is what a ``plots:`` entry names): the defaults, the resolution of unset
fields, the query, the drawing and the caption live together. Adding a figure is
adding a module here (and its tests); nothing else lists the kinds.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil

from phasesweep.analysis.figures._kind import Context, FigureKind, Unavailable

__all__ = ["Context", "FigureKind", "Unavailable", "get", "kinds"]

_REGISTRY: dict[str, FigureKind] = {}


def _load() -> dict[str, FigureKind]:
    if not _REGISTRY:
        found = []
        for info in pkgutil.iter_modules(__path__):
            if info.name.startswith("_"):
                continue
            module = importlib.import_module(f"{__name__}.{info.name}")
            for obj in vars(module).values():
                if (
                    isinstance(obj, type)
                    and issubclass(obj, FigureKind)
                    and obj is not FigureKind
                    and obj.__module__ == module.__name__
                ):
                    found.append(obj())
        for k in sorted(found, key=lambda k: (k.order, k.kind)):
            if k.kind in _REGISTRY:
                raise RuntimeError(f"figure kind {k.kind!r} is defined twice")
            _REGISTRY[k.kind] = k
    return _REGISTRY


def kinds() -> list[str]:
    """The registered kinds, in the order of the default figures."""
    return list(_load())


def get(kind: str) -> FigureKind:
    """The figure kind named ``kind``; ``KeyError`` with the known ones (and a near match)."""
    reg = _load()
    if kind not in reg:
        near = difflib.get_close_matches(kind, reg, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise KeyError(f"unknown figure kind {kind!r}; known: {', '.join(reg)}{hint}")
    return reg[kind]


def __getattr__(name: str):
    # the pure drawing functions (``phase_diagram_figure`` ...) of the kind modules
    if name.endswith("_figure"):
        module = importlib.import_module(f"{__name__}.{name[: -len('_figure')]}")
        return getattr(module, name)
    raise AttributeError(name)
