"""Counting host reads of tensor values on any device, CPU included: the operations that
synchronise with a GPU (``item``, ``bool``, ``int``, ``float``, ``tolist``, ``numpy``,
``cpu`` and ``.to("cpu")``, and the operators whose output size or value the host must
know: ``nonzero``, ``masked_select``, ``equal``, boolean indexing).

A GPU counts these with ``torch.cuda.set_sync_debug_mode``; this counts them where the
tests run, on CPU tensors, so that "no host synchronisation in a non-logged step" is
checked on every machine. Each read is recorded with the project's function that asked
for it (the innermost frame of a ``phasesweep.pipeline`` or ``phasesweep.storage``
module), e.g. ``("_trainer", "add")``.
"""

from __future__ import annotations

import sys

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_OURS = ("phasesweep.pipeline.", "phasesweep.storage.")

#: Tensor methods that hand a value to the host.
_METHODS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "numpy", "cpu"}
#: Operators whose result the host must see (output size or a Python value).
_OPERATORS = {"_local_scalar_dense", "nonzero", "masked_select", "equal", "is_nonzero"}


def _caller() -> tuple[str, str]:
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(_OURS):
            return module.rpartition(".")[2], frame.f_code.co_name
        frame = frame.f_back
    return ("elsewhere", "")


def _to_host(args: tuple, kwargs: dict) -> bool:
    targets = list(args[1:]) + [kwargs.get("device")]
    return any(
        str(t) == "cpu" or (isinstance(t, torch.device) and t.type == "cpu") for t in targets
    )


class HostReads:
    """``with HostReads() as reads: ...``; ``reads.calls`` lists (module, function, what)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self._inside = 0
        outer = self

        class _Methods(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                counted = name in _METHODS or (name == "to" and _to_host(args, kwargs))
                if counted and not outer._inside:
                    outer.calls.append((*_caller(), name))
                outer._inside += counted
                try:
                    return func(*args, **kwargs)
                finally:
                    outer._inside -= counted

        class _Operators(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                kwargs = kwargs or {}
                name = func.overloadpacket.__name__
                boolean_index = name.startswith("index") and any(
                    isinstance(i, torch.Tensor) and i.dtype == torch.bool
                    for a in args
                    if isinstance(a, list | tuple)
                    for i in a
                )
                if (name in _OPERATORS or boolean_index) and not outer._inside:
                    outer.calls.append((*_caller(), name))
                return func(*args, **kwargs)

        self._modes = (_Methods(), _Operators())

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
