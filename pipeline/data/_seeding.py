"""Deterministic seeds and a vectorized counter-based hash for per-member randomness.

A member's random numbers must depend on its own seed only, never on which
other points share its chunk: that is what makes an ensemble train exactly like
each of its points alone. ``docs/seeding.md`` lists the streams (purpose strings),
their seeds and the order of the draws, enough to reproduce a run's data and initial
weights outside phasesweep (``tests/test_seeding_doc.py`` does).
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF


def derive_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for one purpose (``"init"``, ``"data"``, ...) derived from ``seed``."""
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def generator(seed: int, purpose: str) -> torch.Generator:
    """A CPU generator seeded by :func:`derive_seed`."""
    return torch.Generator().manual_seed(derive_seed(seed, purpose))


def hash32(x: Tensor) -> Tensor:
    """An avalanche hash of int64 tensors holding values in [0, 2³²); elementwise.

    Multipliers are below 2²⁷ so every product fits in int64 without overflow.
    """
    x = x & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _MASK32
    return (x >> 16) ^ x


def permutations(member_seeds: Tensor, epoch: int, n: int) -> Tensor:
    """One pseudo-random permutation of range(n) per member: (E,) int64 seeds → (E, n).

    Vectorized over members (no Python loop); member e's permutation depends only
    on ``member_seeds[e]``, ``epoch`` and ``n``.
    """
    base = hash32(hash32(member_seeds & _MASK32) ^ hash32(member_seeds >> 32) ^ (epoch & _MASK32))
    idx = torch.arange(n, device=member_seeds.device)
    keys = hash32(base.unsqueeze(1) * 0x9E3 + idx)  # ties broken by index in a stable sort
    return torch.sort(keys * n + idx, dim=1, stable=True).indices
