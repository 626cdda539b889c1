"""A metric column has one home: its declaration in ``storage.schema``.

Analysis derives its lists of metric columns (the trajectories it reads, the phase-diagram
values, the plot labels) from ``storage.schema.COLUMNS``; a tuple, list, set or dict of
three or more metric column names written out in analysis/ is a new hand-kept list that
the next metric column would have to be added to by hand.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest
from phasesweep.analysis import _analyze, _phase, _style
from phasesweep.analysis.config import OrderParameter
from phasesweep.storage.schema import COLUMNS, LAYERS, SUMMARIES, TRAJECTORIES

ROOT = Path(__file__).resolve().parents[1]

#: What every row has: not a metric.
KEYS = {"run_id", "attempt", "step", "time", "layer"}
METRICS = (set(TRAJECTORIES.names) | set(LAYERS.names)) - KEYS

#: The one list of metric columns analysis keeps: the order parameters the spec offers
#: (``analysis.config.OrderParameter``, a ``Literal``), each read by its own code in
#: ``analysis._regimes.classify``.
ALLOWED = {frozenset(get_args(OrderParameter))}


def hand_lists(source: str) -> list[tuple[int, list[str]]]:
    """(line, names) of every tuple, list, set or dict (its keys) in ``source`` that
    writes out three or more metric column names as string literals."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        names = [
            e.value
            for e in items
            if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in METRICS
        ]
        if len(names) >= 3 and frozenset(names) not in ALLOWED:
            found.append((node.lineno, names))
    return found


def test_the_detector_sees_a_hand_kept_list():
    src = (
        'A = ["train_loss", "kernel_distance", "act_flip_frac"]\n'
        'B = {"test_loss": 1, "fro_norm": 2, "stable_rank": 3}\n'
        'C = ("run_id", "step", "time", "train_loss", "test_loss")\n'
        'D = Literal["kernel_distance", "param_rel_change", "lin_distance"]\n'
    )
    assert [line for line, _ in hand_lists(src)] == [1, 2]


@pytest.mark.parametrize(
    "path", sorted((ROOT / "analysis").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_analysis_keeps_no_list_of_metric_columns(path):
    assert hand_lists(path.read_text()) == [], (
        f"{path.relative_to(ROOT)}: a list of metric columns written by hand; derive it from "
        "storage.schema.COLUMNS (a field of Column) instead"
    )


def test_the_lists_analysis_derives():
    summaries = {c.name: c for c in COLUMNS["summaries"]}
    assert set(_analyze.FINAL_COLUMNS) <= set(SUMMARIES.names)
    assert set(_analyze.TRAJECTORY_COLUMNS) == set(_analyze.FINAL_COLUMNS.values())
    assert set(_analyze.TRAJECTORY_COLUMNS) <= set(TRAJECTORIES.names)
    assert set(get_args(OrderParameter)) <= set(_analyze.TRAJECTORY_COLUMNS)
    for value, column in _phase.VALUES.items():
        assert summaries[column].phase and value in (column, summaries[column].final_of)
    assert set(_phase.VALUES) >= _phase.FROM_ZERO
    for value in _phase.VALUES:  # every phase-diagram value has its label
        assert value in _style.LABELS, value
