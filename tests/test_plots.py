"""``plot``: every figure, as PNG and SVG, from a real store; defaults from the swept axes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from calibration import synthetic_sweep
from phasesweep.analysis import analyze, figures, phase_diagram_sql, plot
from phasesweep.analysis._plotting import context, default_plots, render_all, swept_axes
from phasesweep.analysis._style import fmt, save
from phasesweep.analysis.config import PlotSpec, StoredSweep
from phasesweep.analysis.figures import (
    escape_time_figure,
    loss_curves_figure,
    phase_diagram_figure,
    transversal_figure,
)
from phasesweep.storage import Store, open_catalog

from phasesweep._config import SpecError

SWEEP = "figs"
GRID = {
    "init_scale": [1e-3, 1e-2, 1e-1, 1.0, 3.0],
    "width": [16, 256],
    "depth": [2, 3],
    "noise_sigma": [0.0, 0.1],
    "seed": [0, 1],
}


@pytest.fixture(scope="module")
def store(synthetic_store):
    return synthetic_store(SWEEP, GRID, singular_values=(4.0, 1.0, 0.25))[0]


def _check_png(path):
    img = mpimg.imread(path)
    h, w = img.shape[:2]
    assert 300 < w < 4000 and 200 < h < 3000, (path, img.shape)
    gray = img[..., :3].mean(axis=2)
    # not blank: a good share of the pixels is drawn on, in more than one colour
    assert (gray < 0.95).mean() > 0.02
    assert len(np.unique(np.round(img[..., :3], 2).reshape(-1, 3), axis=0)) > 20


def _check_svg(path):
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    assert len(list(root.iter())) > 50


@pytest.mark.heavy
def test_plot_writes_every_default_figure(store, tmp_path):
    paths = plot(store, SWEEP, tmp_path)  # analyzes first: no summaries yet
    names = sorted({p.stem for p in paths})
    assert names == sorted(
        [
            "phase_kernel_distance_init_scale_width_by_depth",
            "escape_time",
            "loss_curves",
            "singular_values",
            "transversal",
        ]
    )
    for p in paths:
        assert p.parent == tmp_path
        (_check_png if p.suffix == ".png" else _check_svg)(p)
    assert {p.suffix for p in paths} == {".png", ".svg"}


@pytest.mark.heavy
def test_plots_section_of_the_spec(store, tmp_path):
    analyze(store, SWEEP)
    spec = StoredSweep.model_validate(
        {
            "name": SWEEP,
            "grid": GRID,
            "plots": [
                {
                    "kind": "phase_diagram",
                    "x": "init_scale",
                    "y": "depth",
                    "value": "param_rel_change",
                    "where": "width = 16",
                    "name": "pd_small",
                },
                {"kind": "loss_curves", "where": "seed = 1 AND noise_sigma = 0.1"},
                {"kind": "phase_diagram", "value": "escape_time"},
            ],
        }
    )
    con = open_catalog(store)
    done = render_all(context(con, SWEEP, spec), tmp_path)
    assert [r.name for r in done] == [
        "pd_small",
        "loss_curves",
        "phase_escape_time_init_scale_width_by_depth",
    ]
    first = done[0]
    assert first.spec.facet == "noise_sigma"  # the remaining swept axis
    # the heatmap draws exactly the documented single query
    assert first.sql == phase_diagram_sql(
        SWEEP, "init_scale", "depth", "param_rel_change", facet="noise_sigma", where="width = 16"
    )
    cells = con.execute(first.sql).df()
    assert len(cells) == 5 * 2 * 2 and (cells["n_runs"] == 2).all()
    for r in done:
        for p in r.paths:
            (_check_png if p.suffix == ".png" else _check_svg)(p)


def test_defaults_from_swept_axes(store, tmp_path):
    con = open_catalog(store)
    analyze(store, SWEEP)
    runs = con.execute("SELECT * FROM runs WHERE sweep = ?", [SWEEP]).df()
    spec = StoredSweep.model_validate({"name": SWEEP, "grid": GRID})
    axes = swept_axes(runs, spec)
    assert axes == ["init_scale", "width", "depth", "noise_sigma"]
    ctx = context(open_catalog(store), SWEEP, spec)
    kinds = [p.kind for p in default_plots(ctx)]
    assert kinds == [
        "phase_diagram",
        "escape_time",
        "loss_curves",
        "singular_values",
        "transversal",
    ]
    pd_ = figures.get("phase_diagram").resolve(PlotSpec(kind="phase_diagram"), ctx)
    assert (pd_.x, pd_.y, pd_.facet, pd_.value) == (
        "init_scale",
        "width",
        "depth",
        "kernel_distance",
    )
    assert pd_.where == "noise_sigma = 0.0"  # the other swept axis is fixed
    lc = figures.get("loss_curves").resolve(PlotSpec(kind="loss_curves"), ctx)
    assert (lc.hue, lc.facet) == ("init_scale", "depth")
    assert lc.where == "seed = 0 AND width = 256 AND noise_sigma = 0.0"
    # only one swept axis: no phase diagram, no transversal figure; no spectra: no singular
    # values
    tables = synthetic_sweep(init_scales=[1e-2, 1e-1], widths=[16], depths=[2], seeds=[0])
    one = Store.open(str(tmp_path / "one"))
    one.write_chunk("one", "c0", {k: tables[k] for k in ("runs", "trajectories")})
    assert [p.kind for p in default_plots(context(open_catalog(one), "one", None))] == [
        "escape_time",
        "loss_curves",
    ]


@pytest.mark.parametrize(
    "plot,key",
    [
        ({"kind": "phase_diagram", "x": "nonsense"}, "plots[0].x"),
        ({"kind": "phase_diagram", "value": "nonsense"}, "plots[0].value"),
        ({"kind": "loss_curves", "where": "no_such_column = 1"}, "plots[0].where"),
        ({"kind": "escape_time", "x": "width"}, "plots[0].x"),
    ],
)
def test_bad_plot_specs_name_the_key(store, tmp_path, plot, key):
    analyze(store, SWEEP)
    spec = StoredSweep.model_validate({"name": SWEEP, "grid": GRID, "plots": [plot]})
    with pytest.raises(SpecError) as e:
        render_all(context(open_catalog(store), SWEEP, spec), tmp_path)
    assert e.value.key == key
    assert not list(tmp_path.iterdir())


def test_figures_from_frames_handle_edge_cases(tmp_path):
    # a 1 x 1 grid, all diverged; NaN values; no threshold crossing
    cells = pd.DataFrame(
        {
            "x": [1.0],
            "y": [16],
            "value": [np.nan],
            "value_sd": [np.nan],
            "n_runs": [3],
            "n_completed": [0],
            "n_diverged": [3],
            "n_failed": [0],
            "n_seeds": [3],
            "regime": ["diverged"],
        }
    )
    fig = phase_diagram_figure(
        cells, x="init_scale", y="width", value="kernel_distance", threshold=0.1
    )
    _check_png(save(fig, tmp_path, "one")[0])
    # escape times without fits; transversal with sigma = 0 only
    pts = pd.DataFrame(
        {"depth": [2, 2], "init_scale": [0.01, 0.1], "seed": [0, 0], "escape_time": [5.0, np.nan]}
    )
    save(escape_time_figure(pts), tmp_path, "esc")
    tv = pd.DataFrame(
        {
            "noise_sigma": [0.0, 0.0],
            "depth": [2, 3],
            "seed": [0, 0],
            "final_transversal_grad_sq": [0.0, 0.0],
        }
    )
    save(transversal_figure(tv), tmp_path, "tv")
    traj = pd.DataFrame(
        {"run_id": ["a"] * 3, "time": [0.0, 1.0, 2.0], "train_loss": [1.0, 0.5, 0.1]}
    )
    runs = pd.DataFrame({"run_id": ["a"], "init_scale": [0.1], "status": ["completed"]})
    save(loss_curves_figure(traj, runs, None), tmp_path, "lc")
    assert len(list(tmp_path.glob("*.png"))) == 4


def test_tick_labels():
    assert [fmt(v) for v in (1e-3, 0.0316, 1.0, 256, 3.5e-5, 1e5, "relu")] == [
        "1e-3",
        "0.032",
        "1",
        "256",
        "3.5e-5",
        "1e5",
        "relu",
    ]


@pytest.mark.parametrize("tight", [False, True])
def test_save_draws_what_savefig_draws(tmp_path, tight):
    """``save`` lays a figure out once for both formats: the PNG is ``savefig``'s own,
    pixel for pixel, cropped as ``savefig.bbox`` says (the theme's tight box, or none); the
    SVG has the same size as ``savefig``'s."""
    import re

    import matplotlib.pyplot as plt
    from phasesweep.analysis._style import theme

    def figure():
        fig, axes = plt.subplots(1, 2, figsize=(6, 3), layout="constrained")
        for i, ax in enumerate(axes):
            ax.loglog(np.logspace(-3, 2, 50), np.logspace(0, 4, 50) ** (i + 1), label=f"L={i}")
            ax.set(xlabel="init scale g", ylabel="escape time", title=f"depth {i + 2}")
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle("a title")
        return fig

    def size(svg: str) -> tuple[float, ...]:
        found = re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', svg)
        return tuple(float(v) for v in found.groups())

    with theme() if tight else plt.rc_context():
        png, svg = save(figure(), tmp_path, "ours")
        theirs = figure()
        theirs.savefig(tmp_path / "theirs.png")
        theirs.savefig(tmp_path / "theirs.svg")
        plt.close(theirs)
    assert np.array_equal(mpimg.imread(png), mpimg.imread(tmp_path / "theirs.png"))
    ours, want = size(svg.read_text()), size((tmp_path / "theirs.svg").read_text())
    assert np.allclose(ours, want, atol=1.0 if tight else 0.0), (ours, want)
