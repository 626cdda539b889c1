"""The README's SQL runs as written against a (scaled-down) quickstart store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from phasesweep.pipeline._cli import main
from phasesweep.storage import run_query

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def quickstart_store(tmp_path_factory):
    import ray

    store = tmp_path_factory.mktemp("readme") / "store"
    small = [
        "--set",
        "grid.width=[16,64]",
        "--set",
        "grid.init_scale={logspace: [-1, 0.5, 3]}",
        "--set",
        "grid.seed=[0,1]",
        "--set",
        "train.steps=300",
        "--set",
        "analysis.at_time=150",  # lr 0.5 x 300 steps: every run's end
    ]
    assert (
        main(["run", "sweeps/quickstart.yaml", "--store", str(store), "--no-progress", *small]) == 0
    )
    ray.shutdown()
    assert main(["analyze", "quickstart", "--store", str(store)]) == 0
    return store


def test_readme_names_the_two_commands_and_quickstart():
    text = README.read_text()
    assert "bash scripts/quickstart" in text and "bash scripts/test" in text
    assert "sweeps/quickstart.yaml" in text
    assert (
        "bash scripts/test" in (README.parent / ".ci" / "run").read_text()
    )  # CI runs the README's command


@pytest.mark.ray
def test_every_readme_query_runs_and_returns_rows(quickstart_store):
    queries = re.findall(r"```sql\n(.*?)```", README.read_text(), flags=re.S)
    assert len(queries) >= 4
    for sql in queries:
        names, rows = run_query(quickstart_store, sql.strip().rstrip(";"))
        assert rows, sql
        assert all(r[-1] is not None for r in rows[:1]), sql
