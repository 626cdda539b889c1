"""Level-set search along one axis: where does a metric cross a level, line by line.

A *line* is one value of every grid axis but the searched one (and the seeds). Along
a line, the searched axis is a coordinate ``u`` (``log10`` of the axis value for a
log-spaced axis, the value itself otherwise) and every known point has the seed-mean
of the metric. The search is bisection of the *bracket*: the first pair of adjacent
known points (lowest ``u`` first) on which ``metric - level`` changes sign. Bisection
needs no model of the metric and no monotonicity: a sign change always holds a
crossing of a continuous metric, and every new point halves a gap that contains one.

:class:`LevelSetSampler` is the search as an Optuna sampler: its state is the study's
trials (complete ones with their value, pending ones, pruned ones that trained but gave
no value), so any process that opens the study continues the same search, and pending
trials of other processes are never proposed again.

Rules that hold by construction (and are tested): a proposal is strictly inside a gap
wider than ``tol``, so it is never a point already known, pending or pruned; a line
without a bracket is never proposed and never converged (the stopping rule cannot fire
before both sides of the level are seen); a line converges when its bracket is at most
``tol`` wide.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

#: The two parameters of a trial: which line, and the axis value on it.
LINE, X = "line", "x"

#: Relative slack of the comparison of a width with ``tol``: the grid's spacing, the
#: default ``tol`` derived from it and the bisected coordinates are floats (log10 of
#: 10**u on a log axis), so a bracket halved exactly to ``tol`` can come out a few ulps
#: wider (0.015625 against 0.25 / 16 = 0.015624999999999998 on ``{logspace: [-0.5, 0.5,
#: 5]}``); without the slack that costs a fifth halving of every line.
TOL_RTOL = 1e-9


def within(width: float, tol: float) -> bool:
    """Whether a gap of ``width`` is at most ``tol`` wide, up to :data:`TOL_RTOL`."""
    return width <= tol * (1 + TOL_RTOL)


@dataclass
class LineState:
    """What is known on one line, in the search coordinate ``u``.

    ``known``: (u, seed-mean metric) with a finite value, any order. ``pending``: u of
    points being trained. ``void``: u of points trained without a usable value (every
    seed diverged or failed): they split gaps but say nothing about the sign.
    """

    known: list[tuple[float, float]] = field(default_factory=list)
    pending: list[float] = field(default_factory=list)
    void: list[float] = field(default_factory=list)

    def bracket(self, level: float) -> tuple[float, float] | None:
        """(low, high) u of the first sign change of ``value - level``; None if none.

        A point exactly at the level is a bracket of width 0.
        """
        pts = sorted(self.known)
        for u, v in pts:
            if v == level:
                return (u, u)
        for (u0, v0), (u1, v1) in zip(pts, pts[1:]):
            if (v0 - level) * (v1 - level) < 0:
                return (u0, u1)
        return None

    def side(self, level: float) -> str | None:
        """Without a bracket: 'above' or 'below' (where every known value lies), else None."""
        if self.bracket(level) is not None or not self.known:
            return None
        return "above" if self.known[0][1] > level else "below"

    def converged(self, level: float, tol: float) -> bool:
        """Bracketed, and the bracket is at most ``tol`` wide (:func:`within`)."""
        b = self.bracket(level)
        return b is not None and within(b[1] - b[0], tol)

    def proposal(self, level: float, tol: float, per_line: int) -> tuple[float, float] | None:
        """(u of the next point, width of the gap it halves), or None.

        The next point halves the widest gap of the bracket between its ends and the
        pending and void points inside it, if that gap is wider than ``tol`` (:func:`within`)
        and fewer than ``per_line`` points of the bracket are pending.
        """
        b = self.bracket(level)
        if b is None:
            return None
        lo, hi = b
        inside = [u for u in self.pending if lo < u < hi]
        if len(inside) >= per_line:
            return None
        cuts = sorted({lo, hi, *inside, *(u for u in self.void if lo < u < hi)})
        if len(cuts) < 2:
            return None
        width, left = max((b - a, -a) for a, b in zip(cuts, cuts[1:]))  # ties: the lowest
        if within(width, tol):
            return None
        return -left + width / 2, width


def coord(x: float, log: bool) -> float:
    """The search coordinate ``u`` of an axis value: log10 on a log axis, else the value."""
    return math.log10(x) if log else float(x)


def crossing(u0: float, v0: float, u1: float, v1: float, level: float) -> float:
    """Where the straight line through (u0, v0), (u1, v1) reaches ``level``."""
    if v1 == v0:
        return (u0 + u1) / 2
    return u0 + (level - v0) * (u1 - u0) / (v1 - v0)


class LevelSetSampler(optuna.samplers.BaseSampler):
    """Bisection of every line's bracket as an Optuna sampler (see the module docstring).

    Args:
        lines: the line keys (strings), in a fixed order: ties go to the earlier line.
        seeded: per line, (u, seed-mean value) of points known before the study (the
            parent sweep's grid).
        level: the level of the metric.
        tol: a line is done when its bracket is at most this wide (in u).
        per_line: most pending points per line (1: plain bisection; k: the bracket
            splits into up to k+1 parts per batch).
        low, high: the axis range (axis values, not u); ``log``: u = log10(value).

    Trials have the parameters ``line`` (categorical) and ``x`` (the axis value; float,
    log-scaled when ``log``). Ask them with ``study.ask(sampler.search_space)`` after
    :meth:`next_params` said there is a point to propose: when there is none,
    :meth:`sample_independent` raises instead of inventing one.
    """

    def __init__(
        self,
        lines: Sequence[str],
        seeded: Mapping[str, Sequence[tuple[float, float]]],
        level: float,
        tol: float,
        *,
        low: float,
        high: float,
        log: bool,
        per_line: int = 1,
    ) -> None:
        if tol <= 0 or per_line < 1:
            raise ValueError(f"tol must be > 0 and per_line >= 1, got {tol}, {per_line}")
        self.lines = list(lines)
        self.seeded = {k: list(v) for k, v in seeded.items()}
        self.level, self.tol, self.per_line, self.log = level, tol, per_line, log
        self.search_space: dict[str, BaseDistribution] = {
            LINE: CategoricalDistribution(self.lines),
            X: FloatDistribution(low, high, log=log),
        }

    def u(self, x: float) -> float:
        """The search coordinate of an axis value."""
        return coord(x, self.log)

    def x(self, u: float) -> float:
        """The axis value of a search coordinate."""
        return 10.0**u if self.log else float(u)

    def states(self, trials: Sequence[FrozenTrial], exclude: int | None = None) -> dict:
        """Every line's :class:`LineState` from the seeded points and ``trials``
        (the trial numbered ``exclude``, the one being sampled, is left out)."""
        out = {k: LineState(known=list(self.seeded.get(k, []))) for k in self.lines}
        for t in trials:
            if t.number == exclude or LINE not in t.params or t.params[LINE] not in out:
                continue
            s, u = out[t.params[LINE]], self.u(t.params[X])
            if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value):
                s.known.append((u, t.value))
            elif t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                s.void.append(u)
            elif t.state in (TrialState.RUNNING, TrialState.WAITING):
                s.pending.append(u)
        return out

    def next_params(self, study: optuna.Study, exclude: int | None = None) -> dict | None:
        """{line, x} of the next point: the widest open gap over all lines; None if none."""
        best = None
        states = self.states(study.get_trials(deepcopy=False), exclude)
        for k in self.lines:
            p = states[k].proposal(self.level, self.tol, self.per_line)
            if p is not None and (best is None or p[1] > best[1][1]):
                best = (k, p)
        if best is None:
            return None
        x = self.x(best[1][0])
        dist = self.search_space[X]
        return {LINE: best[0], X: min(max(x, dist.low), dist.high)}

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return dict(self.search_space)

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        return self.next_params(study, exclude=trial.number) or {}

    def sample_independent(self, study, trial, param_name, param_distribution) -> Any:
        raise RuntimeError(
            "LevelSetSampler has no point to propose: ask only after next_params() "
            "returned one, with sampler.search_space as the distributions"
        )
