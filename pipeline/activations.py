"""The activations of the hidden layers: one record each, in one registry.

Everything that depends on the activation reads its :class:`Activation` record: the
spec's allowed names (``model.activation``), the forward and the hand-written
backward (:mod:`pipeline.train._models`), the NTK's sensitivities (:mod:`pipeline.train.metrics._ntk`) and
the activation-pattern and balance metrics (:mod:`pipeline.train.metrics._metrics`). Adding an
activation is adding a record here (a test checks φ' against autograd for every
registered one); :func:`register` adds one for the current process only (tests), since
Ray workers import this module afresh.

Functions take the members' parameter ``a`` (:data:`Slope`, ``model.leaky_slope``) as
their last argument; activations without a parameter ignore it. Tensors are
(E, n, width): ensemble, rows, units.

The spec reads the names, and the CLI must start without torch (its import takes
seconds), so this module imports torch only in the few kernels that need its
namespace (one-pass ATen kernels); the rest use tensor methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from torch import Tensor

#: The members' ``model.leaky_slope``: an (E, 1, 1) tensor (broadcast over rows and
#: units) or one float for every member.
Slope: TypeAlias = "Tensor | float"


@dataclass(frozen=True)
class Activation:
    """One activation φ and everything the pipeline switches on for it.

    ``phi(z, a)``: φ(z) as a new tensor. ``dphi(z, h, a)``: φ'(z) as a new tensor of z's
    shape, given z and h = φ(z); None for the identity (its Jacobian is skipped, and
    linear nets get their own balance metric, see :attr:`identity`).

    ``degree``: k where φ is positively homogeneous, φ(cz) = cᵏφ(z) for c > 0, else None.
    Then z φ'(z) = k φ(z), so gradient flow conserves k‖w_out‖² − ‖w_in‖² − b² per hidden
    unit (the ``balance_defect`` metric).

    ``dead(a)``: whether a unit whose pre-activation is ≤ 0 on every input has φ' = 0
    there (is dead), one bool or a bool tensor (E, 1, 1) per member; None where units
    never die (``dead_frac`` is then NaN). ``act_flip_frac`` counts sign changes of z for
    every activation but the identity.

    Fast paths, all optional (defaults from ``phi`` and ``dphi``):

    - ``grad(back, z, h, a)``: back ⊙ φ'(z) as a new tensor; ``back`` (E, n | 1, width)
      may broadcast over rows (the NTK's first sensitivity). Used by the reference
      backward and the NTK.
    - ``phi_(z, a)``: φ(z) in place on z where it can (the blocked training step).
    - ``grad_(back, z, h, a)``: back ⊙ φ'(z), written over h where it can. When ``phi_``
      works in place, z *is* h, so an activation with its own ``phi_`` must give a
      ``grad_`` that reads φ' off h alone.
    """

    name: str
    phi: Callable[[Tensor, Slope], Tensor]
    dphi: Callable[[Tensor, Tensor, Slope], Tensor] | None
    degree: float | None = None
    dead: Callable[[Slope], bool | Tensor] | None = None
    grad: Callable[[Tensor, Tensor, Tensor, Slope], Tensor] | None = None
    phi_: Callable[[Tensor, Slope], Tensor] | None = None
    grad_: Callable[[Tensor, Tensor, Tensor, Slope], Tensor] | None = None

    def __post_init__(self) -> None:
        if self.phi_ is not None and self.grad_ is None:
            raise ValueError(f"activation {self.name}: an in-place phi_ needs a grad_ from h")
        dphi = self.dphi
        if self.grad is None:
            if dphi is None:
                raise ValueError(f"activation {self.name}: the identity (dphi None) needs a grad")
            object.__setattr__(self, "grad", lambda back, z, h, a: dphi(z, h, a).mul_(back))
        if self.phi_ is None:
            object.__setattr__(self, "phi_", self.phi)
        if self.grad_ is None:
            object.__setattr__(self, "grad_", self.grad)

    @property
    def identity(self) -> bool:
        """Whether φ is the identity: no activation pattern, and linear nets conserve the
        whole matrix W_{l+1}ᵀW_{l+1} − W_l W_lᵀ − b bᵀ, not only its trace."""
        return self.dphi is None


def _torch():
    """torch, for the kernels that need its namespace (see the module docstring)."""
    import torch

    return torch


def _is_zero(a: Slope) -> bool:
    return isinstance(a, float | int) and a == 0


def piecewise_linear(name: str, negative_slope: float | None = None) -> Activation:
    """φ(z) = z for z > 0 and s·z otherwise, s ≥ 0: ``negative_slope``, or the member's
    ``a`` (``model.leaky_slope``) where None. ReLU is s = 0, leaky ReLU s = a (neural
    tangents' ``ABRelu(s, 1)``).

    Homogeneous of degree 1; a unit is dead where s = 0. s ≥ 0 keeps the sign of h = φ(z)
    that of z, so φ' is read off h after φ overwrote z; s = 0 takes ReLU's one-pass
    kernels (``threshold_backward``, no mask tensor).
    """
    if negative_slope is not None and negative_slope < 0:
        raise ValueError(f"activation {name}: negative_slope {negative_slope} < 0")

    def s(a: Slope) -> Slope:
        return a if negative_slope is None else negative_slope

    def phi(z: Tensor, a: Slope) -> Tensor:
        k = s(a)
        return z.relu() if _is_zero(k) else z.where(z > 0, z * k)

    def dphi(z: Tensor, h: Tensor, a: Slope) -> Tensor:
        k = s(a)
        mask = z > 0
        return mask.to(z.dtype) if _is_zero(k) else z.new_ones(()).where(mask, k)

    def grad(back: Tensor, z: Tensor, h: Tensor, a: Slope) -> Tensor:
        k = s(a)
        if _is_zero(k):
            return _torch().ops.aten.threshold_backward(back, h, 0.0)
        return back.where(h > 0, back * k)

    def phi_(z: Tensor, a: Slope) -> Tensor:
        k = s(a)
        if _is_zero(k):
            return z.relu_()
        if isinstance(k, float | int):
            return _torch().nn.functional.leaky_relu_(z, k)
        return z.where(z > 0, z * k)  # one slope per member: no in-place kernel

    def grad_(back: Tensor, z: Tensor, h: Tensor, a: Slope) -> Tensor:
        k = s(a)
        if _is_zero(k):
            return _torch().ops.aten.threshold_backward.grad_input(back, h, 0.0, grad_input=h)
        return back.where(h > 0, back * k)

    return Activation(
        name,
        phi,
        dphi,
        degree=1.0,
        dead=lambda a: s(a) == 0,
        grad=grad,
        phi_=phi_,
        grad_=grad_,
    )


def _identity_grad(back: Tensor, z: Tensor, h: Tensor, a: Slope) -> Tensor:
    return back.expand_as(z)


LINEAR = Activation(
    "linear",
    lambda z, a: z,
    None,
    degree=1.0,
    grad=_identity_grad,
    phi_=lambda z, a: z,
    # δ is the scratch ``back`` itself: the blocked step gives linear nets a second one
    grad_=lambda back, z, h, a: back,
)

TANH = Activation(
    "tanh",
    lambda z, a: z.tanh(),
    lambda z, h, a: 1.0 - h * h,
    phi_=lambda z, a: z.tanh_(),
    grad_=lambda back, z, h, a: _torch().addcmul(back, back, h.square_(), value=-1.0, out=h),
)

_REGISTRY: dict[str, Activation] = {
    act.name: act
    for act in (LINEAR, piecewise_linear("relu", 0.0), piecewise_linear("leaky_relu"), TANH)
}


def names() -> tuple[str, ...]:
    """The registered names, in registration order (the spec's allowed values)."""
    return tuple(_REGISTRY)


def get(name: str) -> Activation:
    """The record of ``name`` (a validated spec holds only registered names)."""
    return _REGISTRY[name]


def register(activation: Activation) -> Activation:
    """Add ``activation`` to this process's registry; a name may be registered once.

    For tests: sweeps run in Ray workers, which see only the records of this module.
    """
    if activation.name in _REGISTRY:
        raise ValueError(f"activation {activation.name} is registered already")
    _REGISTRY[activation.name] = activation
    return activation


def unregister(name: str) -> None:
    """Remove ``name`` from this process's registry (undoes :func:`register` in tests)."""
    del _REGISTRY[name]
