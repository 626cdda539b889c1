"""The README names its two commands, and ``run --help``'s examples plan as they say after
the quickstart. The README's shell, Python and SQL examples run in tests/test_examples.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasesweep._cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_names_the_two_commands_and_quickstart():
    text = README.read_text()
    assert "bash scripts/quickstart" in text and "bash scripts/test" in text
    assert "sweeps/quickstart.yaml" in text
    assert (
        "bash scripts/test" in (README.parent / ".ci" / "run").read_text()
    )  # CI runs the README's command


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
