"""The README's SQL runs as written against a (scaled-down) quickstart store."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from phasesweep.storage import run_query

from phasesweep._cli import main

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


def _block(heading: str, language: str) -> str:
    """The first ``language`` code block of the README section ``heading``."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{language}\n(.*?)```", section, flags=re.S).group(1)


@pytest.fixture
def quickstart_left(tmp_path):
    """A folder as ``bash scripts/quickstart`` leaves it: ``sweeps/`` and ``results/``
    holding sweeps/quickstart.yaml as launched (its spec, every point a completed run).
    The runs' curves are closed forms (:func:`calibration.synthetic_sweep`, tests/calibration.py)
    filed under the quickstart's own run ids, so nothing trains."""
    import numpy as np
    import pyarrow as pa
    from calibration import synthetic_sweep
    from phasesweep.pipeline.grid import expand
    from phasesweep.pipeline.spec import load_spec_and_raw
    from phasesweep.storage import Store

    (tmp_path / "sweeps").symlink_to(README.parent / "sweeps")
    path = tmp_path / "sweeps" / "quickstart.yaml"
    spec, _ = load_spec_and_raw(path)
    points = expand(spec)
    axes = {a: sorted({p.coords[a] for p in points}) for a in ("init_scale", "width", "seed")}
    tables = synthetic_sweep(
        init_scales=axes["init_scale"], widths=axes["width"], depths=[2], seeds=axes["seed"],
        lr=spec.train.lr, steps=spec.train.steps, log_points=spec.train.log_points,
    )  # fmt: skip
    runs = tables["runs"].to_pylist()
    real = {(p.coords["init_scale"], p.coords["width"], p.coords["seed"]): p.run_id for p in points}
    ids = {r["run_id"]: real[r["init_scale"], r["width"], r["seed"]] for r in runs}
    store = Store.open(str(tmp_path / "results"))
    store.write_spec("quickstart", path.read_text())
    for name, table in tables.items():
        new = pa.array(np.vectorize(ids.get)(table.column("run_id").to_numpy(False)))
        tables[name] = table.set_column(table.column_names.index("run_id"), "run_id", new)
    store.write_chunk("quickstart", "c0", tables)
    assert store.done_run_ids("quickstart") == set(real.values())
    return tmp_path


@pytest.mark.ray
@pytest.mark.process
@pytest.mark.heavy
def test_every_documented_command_works_as_written_after_the_quickstart(quickstart_left):
    """README "Using it", then "From Python", in that order, in a folder the quickstart
    left (the cluster line aside): each exits 0; the relaunch of a part of the grid
    trains nothing and leaves the stored grid whole."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("PHASESWEEP_STORE", None)
    lines = [
        line.split("  #")[0]
        for line in _block("Using it", "bash").splitlines()
        if line.startswith("phasesweep ") and "--address" not in line
    ]
    assert len(lines) == 5 and "--set 'grid.width=[64,256]'" in lines[1]
    for line in lines:
        done = subprocess.run(
            line, shell=True, cwd=quickstart_left, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, (line, done.stderr[-2000:])
        if "grid.width" in line:
            assert "50 points; skipping 50 already stored; training 0" in done.stderr
        if line.startswith("phasesweep status"):
            assert "100 of 100 points done, 0 remaining" in done.stdout
    python = _block("From Python", "python")
    done = subprocess.run(
        [sys.executable, "-c", python], cwd=quickstart_left, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    names, rows = run_query(
        quickstart_left / "results", "SELECT sweep, count(*) FROM runs GROUP BY ALL ORDER BY 1"
    )
    assert rows == [("quickstart", 100), ("quickstart_short", 100)]


def test_the_run_help_examples_are_accepted_after_the_quickstart(
    quickstart_left, capsys, monkeypatch
):
    """``phasesweep run --help``'s examples (planned only: --dry-run) after the quickstart."""
    import shlex

    assert main(["run", "--help"]) == 0
    help_text = capsys.readouterr().out.split("examples:", 1)[1]
    examples = [
        shlex.split(line.split("  #")[0])[1:]
        for line in help_text.splitlines()
        if line.strip().startswith("phasesweep run") and "--address" not in line
    ]
    assert len(examples) == 4
    monkeypatch.chdir(quickstart_left)
    monkeypatch.delenv("PHASESWEEP_STORE", raising=False)
    for args in examples:
        assert main([*args, "--dry-run"]) == 0, (args, capsys.readouterr().err)
    out = capsys.readouterr().out.splitlines()
    plans = [line.split(" in ")[0] for line in out if line.startswith("sweep ")]
    assert plans == [
        "sweep quickstart: 100 points, 100 already stored, 0 to train",
        "sweep quickstart: 50 points, 50 already stored, 0 to train",
        "sweep quickstart: 40 points, 0 already stored, 40 to train",
        "sweep quickstart_short: 100 points, 0 already stored, 100 to train",
    ]
