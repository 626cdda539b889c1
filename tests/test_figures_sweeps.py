"""Every figure of every ready sweep (``sweeps/*.yaml``), drawn from a small real run.

Each sweep is scaled down with ``--set``-style overrides, trained in-process (the
trainer, no Ray) into a store with its spec stored as ``phasesweep run`` stores it,
and plotted: every figure the spec asks for (or the defaults) must be written,
non-blank, with no figure skipped. The quickstart and saddle-escape cases are the
ones that crashed ``plot`` and ``report`` before (``layers.top_sv`` NULL at the
steps the spectra budget skips).
"""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
import yaml
from matplotlib import pyplot as plt
from matplotlib.contour import ContourSet
from phasesweep.analysis import draw, report
from phasesweep.analysis._plotting import open_sweep, plots_for
from phasesweep.pipeline.grid import expand, make_chunks
from phasesweep.pipeline.spec import load_spec_and_raw
from phasesweep.pipeline.train._trainer import train_chunk
from phasesweep.storage import Store, open_catalog

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
_SMALL_DATA = ["data.n_train=16", "data.n_test=16", "metrics.probe_size=8"]

#: case -> (sweep, overrides). Small enough to train in a few seconds on one core.
CASES = {
    # the issue's reproduction: one width, one seed, spectra at few steps
    "quickstart_issue": ("quickstart", ["train.steps=200", "grid.width=[16]", "grid.seed=[0]"]),
    # issue 26: the quickstart's analysis.at_time 1500 past the runs' end (t = 100), as a
    # store made before launches refused it holds it
    "quickstart_past_at_time": (
        "quickstart",
        ["train.steps=200", "grid.width=[16, 64]", "grid.seed=[0]", *_SMALL_DATA],
    ),
    "quickstart": (
        "quickstart",
        [
            "train.steps=200",
            "analysis.at_time=100",  # lr 0.5 x 200 steps: every run's end
            "grid.width=[16, 32]",
            "grid.seed=[0, 1]",
            *_SMALL_DATA,
        ],
    ),
    "saddle_escape": (
        "saddle_escape",
        [
            "grid.depth=[2, 3]",
            "grid.init_scale=[1e-4, 1e-2]",
            "grid.seed=[0]",
            "train.steps=300",
            "train.log_points=30",
            "model.width=8",
            *_SMALL_DATA,
        ],
    ),
    "lazy_rich": (
        "lazy_rich",
        [
            "train.steps=200",
            "grid.width=[32, 128]",
            "grid.seed=[0]",
            "grid.init_scale=[0.1, 1.0, 10.0]",
            *_SMALL_DATA,
        ],
    ),
    "lowdim_noise": (
        "lowdim_noise",
        [
            "train.steps=200",
            "grid.depth=[2, 3]",
            "grid.seed=[0, 1]",
            "grid.noise_sigma=[0.0, 0.1, 1.0]",
            "model.width=8",
            *_SMALL_DATA,
        ],
    ),
    "balancedness": (
        "balancedness",
        [
            "train.steps=200",
            "train.log_points=30",
            "grid.lr={logspace: [-2.5, -1.5, 2]}",
            "grid.seed=[0]",
            "model.width=8",
            *_SMALL_DATA,
        ],
    ),
    "biasfree_linear": (
        "biasfree_linear",
        [
            "train.steps=300",
            "train.log_points=30",
            "grid.seed=[0]",
            "model.width=16",
            "model.init_scale=0.01",
        ],
    ),
    "width_laziness": (
        "width_laziness",
        ["train.steps=100", "grid.width=[16, 64]", "grid.seed=[0]", *_SMALL_DATA],
    ),
}


def train_into_store(root: Path, sweep: str, overrides: list[str]) -> tuple[Store, str]:
    """Train ``sweeps/SWEEP.yaml`` with ``overrides`` into a new store at ``root``; the spec
    is stored as ``phasesweep run`` stores it (the resolved YAML), under the file's own
    leading comment block."""
    path = SWEEPS / f"{sweep}.yaml"
    spec, raw = load_spec_and_raw(path, overrides)
    store = Store.open(str(root))
    for chunk in make_chunks(expand(spec), spec):
        store.write_chunk(spec.name, chunk.chunk_id, train_chunk(chunk))
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    store.write_spec(spec.name, "\n".join(header) + "\n" + yaml.safe_dump(raw, sort_keys=False))
    return store, spec.name


_STORES: dict[str, tuple[Store, str]] = {}


@pytest.fixture
def small_sweep(tmp_path_factory):
    """Factory: the trained store of a case of :data:`CASES` (trained once per session)."""

    def get(case: str) -> tuple[Store, str]:
        if case not in _STORES:
            sweep, overrides = CASES[case]
            root = tmp_path_factory.mktemp(case)
            _STORES[case] = train_into_store(root / "store", sweep, overrides)
        return _STORES[case]

    return get


def check_png(path: Path) -> None:
    """Drawn on (not blank), in colour, and without a large blank band at the bottom or
    right (a layout that leaves empty panels)."""
    img = mpimg.imread(path)[..., :3]
    h, w = img.shape[:2]
    assert 300 < w < 5000 and 200 < h < 4000, (path, img.shape)
    ink = img.mean(axis=2) < 0.95
    assert ink.mean() > 0.02, path
    assert len(np.unique(np.round(img, 2).reshape(-1, 3), axis=0)) > 20, path
    rows, cols = ink.any(axis=1), ink.any(axis=0)
    # the last drawn row/column is near the edge: no empty third of the image
    assert np.flatnonzero(rows)[-1] > 0.9 * h and np.flatnonzero(cols)[-1] > 0.9 * w, path


def test_every_ready_sweep_has_a_case():
    assert {p.stem for p in SWEEPS.glob("*.yaml")} == {s for s, _ in CASES.values()}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.heavy
def test_every_figure_of_every_ready_sweep(case, small_sweep, tmp_path, caplog):
    store, sweep = small_sweep(case)
    with open_sweep(store, sweep) as ctx:
        from phasesweep.analysis import figures

        expected = {figures.get(p.kind).name(p) for p in plots_for(ctx)}
    assert expected
    with caplog.at_level(logging.WARNING):
        page = report(store, sweep, tmp_path / "figs")  # draws every figure, as plot does
    assert [r.message for r in caplog.records if "skipped" in r.message] == []
    paths = sorted(p for p in page.parent.iterdir() if p.suffix in (".png", ".svg"))
    assert {p.stem for p in paths} == expected
    assert len(paths) == 2 * len(expected)
    for p in paths:
        if p.suffix == ".png":
            check_png(p)
        else:
            assert p.read_text().lstrip().startswith("<?xml")
    text = page.read_text()
    for name in expected:
        assert f'download="{name}.svg" href="data:image/svg+xml;base64,' in text


def test_issue_reproduction_has_null_spectra_and_still_draws(small_sweep):
    # the precondition of the crash: top_sv NULL at the steps the spectra budget skipped
    store, sweep = small_sweep("quickstart_issue")
    con = open_catalog(store)
    n, n_sv = con.execute("SELECT count(*), count(top_sv) FROM layers").fetchone()
    assert 0 < n_sv < n
    fig = draw("singular_values", store, sweep)
    lines = [ln for a in fig.axes for ln in a.get_lines() if len(ln.get_xdata())]
    assert lines  # something drawn from the non-NULL steps
    plt.close(fig)


def test_facets_are_honoured(small_sweep):
    # transversal: one panel per activation (the ReLU runs do not vanish)
    store, sweep = small_sweep("lowdim_noise")
    fig = draw("transversal", store, sweep, facet="activation")
    titles = sorted(a.get_title() for a in fig.axes if a.get_visible() and a.get_title())
    assert titles == ["activation = linear", "activation = relu"]
    plt.close(fig)
    # singular values (saddle escape's spec facets by depth): a row of layers per depth
    store, sweep = small_sweep("saddle_escape")
    fig = draw("singular_values", store, sweep, facet="depth", where="seed = 0")
    titles = sorted(a.get_title().split(" (")[0] for a in fig.axes if a.get_visible())
    assert titles == [
        "depth 2 · layer 1",
        "depth 2 · layer 2",
        "depth 3 · layer 1",
        "depth 3 · layer 2",
        "depth 3 · layer 3",
    ]
    plt.close(fig)
    # escape time of the quickstart: width is a swept axis, drawn as the hue, not fixed
    store, sweep = small_sweep("quickstart")
    fig = draw("escape_time", store, sweep)
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert any(t.startswith("width 16") for t in labels)
    assert any(t.startswith("width 32") for t in labels)
    assert "width =" not in fig._suptitle.get_text()
    plt.close(fig)


def test_at_time_past_every_run_draws_no_boundary_and_the_report_says_why(
    small_sweep, tmp_path, caplog
):
    # issue 26: regimes all NULL ("(none) 20"), yet a lazy/rich contour was drawn
    store, sweep = small_sweep("quickstart_past_at_time")
    with caplog.at_level(logging.WARNING):
        page = report(store, sweep, tmp_path / "figs")
    con = open_catalog(store)
    assert con.execute("SELECT count(regime), count(*) FROM summaries").fetchone() == (0, 10)
    fig = draw("phase_diagram", store, sweep)
    panels = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    assert not [c for a in panels for c in a.collections if isinstance(c, ContourSet)]
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "no cell has a lazy or rich regime: no threshold line" in texts
    plt.close(fig)
    text = page.read_text(encoding="utf-8")
    note = text[text.index('id="regime-counts-note"') :].split("</p>")[0]
    assert "(none): 10 runs have no regime" in note
    assert "analysis.at_time = 1500 lies beyond the last gradient-flow time of 10 of 10" in note
    assert "--set analysis.at_time=100 " in note


def test_phase_diagram_contour_only_through_cells_with_a_regime(small_sweep):
    # the same cells with regimes: the contour is drawn (at_time within the runs)
    store, sweep = small_sweep("quickstart")
    fig = draw("phase_diagram", store, sweep, value="kernel_distance", facet=None)
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "no cell has a lazy or rich regime: no threshold line" not in texts
    plt.close(fig)


def test_singular_values_one_row_per_run_sharing_time(small_sweep):
    store, sweep = small_sweep("quickstart")
    fig = draw("singular_values", store, sweep)
    panels = [a for a in fig.axes if a.get_visible()]
    rows = {}
    for a in panels:
        rows.setdefault(a.get_subplotspec().rowspan.start, []).append(a)
    # a row per width, a column per layer; titles name both (and the run's init scale)
    titles = [sorted(a.get_title() for a in r) for _, r in sorted(rows.items())]
    assert all(" (α " in t for row in titles for t in row)
    assert [[t.split(" (α ")[0] for t in row] for row in titles] == [
        ["width 16 · layer 1", "width 16 · layer 2"],
        ["width 32 · layer 1", "width 32 · layer 2"],
    ]
    # every run ends at t = 100: one time axis for all panels
    assert len({a.get_xlim() for a in panels}) == 1
    # one y label for all panels, said once
    assert fig._supylabel is not None and fig._supylabel.get_text() == "singular value σ_k"
    assert "one run per width, the smallest init scale" in " ".join(
        fig._suptitle.get_text().split()
    )
    plt.close(fig)
