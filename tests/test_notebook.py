"""examples/quickstart.ipynb runs top to bottom (in a temporary directory with a store of
its own), trains its sweep through the API, and draws its figures; it is committed with
its outputs (figures visible where it is browsed), and its store is kept out of git.

Refresh the committed outputs with
``cd examples && ../.venv/bin/jupyter-execute --inplace quickstart.ipynb && rm -rf quickstart-store``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from phasesweep.storage import run_query

from phasesweep import analysis

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@pytest.mark.skipif(not hasattr(analysis, "draw"), reason="the figures branch adds draw")
@pytest.mark.process
@pytest.mark.ray
def test_quickstart_notebook_runs_top_to_bottom(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")

    work = tmp_path / "examples"
    work.mkdir()
    shutil.copy(NOTEBOOK, work / NOTEBOOK.name)
    nb = nbformat.read(work / NOTEBOOK.name, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    )
    client.execute()  # raises CellExecutionError naming the cell that failed

    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("outputs") is not None for c in code)
    runs = [c for c in code if "phasesweep.run(" in c.source]
    assert "trained 8, skipped 0" in _text(runs[0]) and "failed 0" in _text(runs[0])
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2  # the draw() figure and the hand-made loss curves
    store = work / "quickstart-store"
    assert run_query(store, "SELECT count(*) FROM runs WHERE sweep = 'nb_quickstart'")[1] == [(8,)]
    assert run_query(store, "SELECT count(*) FROM summaries")[1] == [(8,)]


def test_committed_notebook_shows_its_outputs_and_keeps_its_store_out_of_git():
    nbformat = pytest.importorskip("nbformat")

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    # executed top to bottom, once, without errors
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    # the multi-panel draw() figure is there, as an image a browser shows
    (drawn,) = [c for c in code if "phasesweep.draw(" in c.source]
    assert "plt.subplots(1, 2" in drawn.source
    assert [o for o in drawn.outputs if "image/png" in o.get("data", {})]
    assert "trained 8, skipped 0" in _text(next(c for c in code if "phasesweep.run(" in c.source))
    # where the notebook puts its store (next to it, as it runs in examples/) is ignored
    store = NOTEBOOK.parent / "quickstart-store"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(store / "runs" / "x.parquet")], cwd=NOTEBOOK.parent
    )
    assert ignored.returncode == 0
