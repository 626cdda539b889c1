"""What a GPU would wait for, or a CUDA-graph capture forbids, seen on any device, CPU
included.

:class:`HostReads` counts host reads of tensor values: the operations that synchronise
with a GPU (``item``, ``bool``, ``int``, ``float``, ``tolist``, ``numpy``, ``cpu`` and
``.to("cpu")``, and the operators whose output size or value the host must know:
``nonzero``, ``masked_select``, ``equal``, boolean indexing). A GPU counts these with
``torch.cuda.set_sync_debug_mode``; this counts them where the tests run, on CPU tensors,
so that "no host synchronisation in a non-logged step" is checked on every machine. Each
read is recorded with the project's function that asked for it (the innermost frame of a
``phasesweep.pipeline`` or ``phasesweep.storage`` module), e.g. ``("_trainer", "add")``.

:class:`CaptureGuard` is stricter: it raises :class:`CaptureFault` at the first thing a
capture cannot hold (a host read, a tensor made from host data, an output shape that
depends on values, a copy between devices), and records, per step, every operator with
the Python values it was given, since a capture freezes those: a step whose Python values
change from one step to the next would replay its first step's values for ever.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_OURS = ("phasesweep.pipeline.", "phasesweep.storage.")

#: Tensor methods that hand a value to the host.
_METHODS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "numpy", "cpu"}
#: Operators whose result the host must see (output size or a Python value).
_OPERATORS = {"_local_scalar_dense", "nonzero", "masked_select", "equal", "is_nonzero"}
#: Operators whose output shape depends on the values of their input (the host must read
#: it back to allocate the output), besides those of :data:`_OPERATORS`.
_DATA_SHAPED = {
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "bincount",
    "argwhere",
}
#: Operators that make a tensor of host data (``torch.tensor``, ``as_tensor``,
#: ``new_tensor``, ``from_numpy`` wrapped): a host → device copy, frozen under capture.
_HOST_DATA = {"lift_fresh", "lift_fresh_copy"}


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


def _boolean_index(name: str, args: tuple) -> bool:
    return name.startswith("index") and any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool
        for a in args
        if isinstance(a, list | tuple)
        for i in a
    )


def _device_copy(name: str, args: tuple, kwargs: dict) -> bool:
    """``_to_copy`` or ``copy_`` whose source and destination are on different devices."""
    if name == "_to_copy":
        target = kwargs.get("device")
        return target is not None and torch.device(target) != args[0].device
    if name == "copy_":
        dst, src = args[0], args[1]
        return isinstance(src, torch.Tensor) and src.device != dst.device
    return False


def _what(name: str, args: tuple, kwargs: dict) -> str | None:
    """What a capture cannot hold in dispatched operator ``name``, or None."""
    if name in _OPERATORS or _boolean_index(name, args):
        return "host read"
    if name in _DATA_SHAPED:
        return "data-dependent shape"
    if name in _HOST_DATA:
        return "tensor made from host data"
    if _device_copy(name, args, kwargs):
        return "copy between devices"
    return None


def _python_values(args: tuple, kwargs: dict) -> tuple:
    """The arguments of an operator that are not tensors (numbers, shapes, flags, devices):
    what a capture freezes."""
    return tuple(leaf for leaf in tree_leaves((args, kwargs)) if not isinstance(leaf, torch.Tensor))


class _Watch:
    """A function mode (tensor methods that read the host) and a dispatch mode (operators),
    calling :meth:`method` and :meth:`operator`; entered and left together."""

    def __init__(self) -> None:
        self._inside = 0  # within a counted method: its own operators are not counted again
        outer = self

        class _Methods(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                kwargs = kwargs or {}
                name = getattr(func, "__name__", "")
                counted = name in _METHODS or (name == "to" and _to_host(args, kwargs))
                if counted and not outer._inside:
                    outer.method(name)
                outer._inside += counted
                try:
                    return func(*args, **kwargs)
                finally:
                    outer._inside -= counted

        class _Operators(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                kwargs = kwargs or {}
                outer.operator(func.overloadpacket.__name__, str(func), args, kwargs)
                return func(*args, **kwargs)

        self._modes = (_Methods(), _Operators())

    def method(self, name: str) -> None:
        """A tensor method that reads the host was called (outside another)."""

    def operator(self, name: str, overload: str, args: tuple, kwargs: dict) -> None:
        """An operator was dispatched: ``name`` its packet, ``overload`` its full name."""

    def __enter__(self):  # noqa: ANN204 (the subclass)
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class HostReads(_Watch):
    """``with HostReads() as reads: ...``; ``reads.calls`` lists (module, function, what)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, str]] = []

    def method(self, name: str) -> None:
        self.calls.append((*_caller(), name))

    def operator(self, name: str, overload: str, args: tuple, kwargs: dict) -> None:
        if _what(name, args, kwargs) == "host read" and not self._inside:
            self.calls.append((*_caller(), name))


class CaptureFault(AssertionError):
    """Something a CUDA-graph capture forbids, or a GPU would wait for, inside a step."""


class CaptureGuard(_Watch):
    """``guard = CaptureGuard()``, then ``with guard.step(): ...`` around each step:
    raises :class:`CaptureFault` at the first host read, tensor of host data,
    data-dependent shape or copy between devices, naming the project's function that did
    it; ``guard.steps`` holds each step's operators with their Python values (see
    :meth:`assert_values_frozen`)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[list[tuple[str, tuple]]] = []

    @contextmanager
    def step(self) -> Iterator[None]:
        """One step, watched: its operators are recorded as a step of their own."""
        self.steps.append([])
        with self:
            yield

    def _fault(self, what: str, name: str) -> None:
        module, function = _caller()
        raise CaptureFault(f"{what} in a captured step: {name} (from {module}.{function})")

    def method(self, name: str) -> None:
        self._fault("host read", name)

    def operator(self, name: str, overload: str, args: tuple, kwargs: dict) -> None:
        what = _what(name, args, kwargs)
        if what is not None:
            self._fault(what, overload)
        if self.steps:
            self.steps[-1].append((overload, _python_values(args, kwargs)))

    def assert_values_frozen(self) -> None:
        """Every step ran the operators of the first with the same Python values: what a
        graph captured at any one of them would replay at the others."""
        first = self.steps[0]
        for k, ops in enumerate(self.steps[1:], 1):
            for i, (a, b) in enumerate(zip(first, ops)):
                if a != b:
                    raise CaptureFault(
                        f"step {k} differs from step 0 at operator {i}: {b} against {a} "
                        "(a capture would freeze the first)"
                    )
            if len(ops) != len(first):
                raise CaptureFault(f"step {k} runs {len(ops)} operators, step 0 {len(first)}")


class Launches(TorchDispatchMode):
    """``with Launches() as launches: ...``; ``launches.count``: the operators dispatched
    that are not views. Each launches at least one kernel on a GPU (a view only changes
    metadata; a solver may launch several), so equal counts on any device mean a sequence
    of launches fixed in advance: the same for any ensemble size and any values."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))
