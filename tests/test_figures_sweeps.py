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
from phasesweep.analysis import draw, report
from phasesweep.analysis._plotting import open_sweep, plots_for
from phasesweep.pipeline._grid import expand, make_chunks
from phasesweep.pipeline._trainer import train_chunk
from phasesweep.pipeline.spec import load_spec
from phasesweep.storage import Store, open_catalog

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
_SMALL_DATA = ["data.n_train=16", "data.n_test=16", "metrics.probe_size=8"]

#: case -> (sweep, overrides). Small enough to train in a few seconds on one core.
CASES = {
    # the issue's reproduction: one width, one seed, spectra at few steps
    "quickstart_issue": ("quickstart", ["train.steps=200", "grid.width=[16]", "grid.seed=[0]"]),
    "quickstart": (
        "quickstart",
        ["train.steps=200", "grid.width=[16, 32]", "grid.seed=[0, 1]", *_SMALL_DATA],
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
    spec, raw = load_spec(path, overrides)
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
        assert f'href="{name}.svg"' in text


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
