"""Figures as a registry, and figures that never abort and never mislead.

On the synthetic store (closed-form curves, tests/calibration.py): a figure
that fails is skipped with a warning and the rest is written; legends list only
what is drawn; wide-ranging values get log colour scales; spread on log axes stays
positive; ``draw`` fills a caller's ``Axes``; output never goes through a symlink.
"""

from __future__ import annotations

import logging
import os
import pkgutil

import numpy as np
import pandas as pd
import pytest
import yaml
from matplotlib import colors as mcolors
from matplotlib import pyplot as plt
from matplotlib.collections import LineCollection, QuadMesh
from phasesweep.analysis import analyze, draw, figures, plot, report
from phasesweep.analysis._output import OutputError
from phasesweep.analysis._plotting import check_plots
from phasesweep.analysis.figures import Unavailable
from phasesweep.pipeline.spec import SpecError, validate_spec
from phasesweep.storage import open_catalog

from phasesweep._cli import main

SWEEP = "reg"
GRID = {
    "init_scale": [1e-3, 1e-2, 1e-1, 1.0, 3.0],
    "width": [16, 256],
    "depth": [2, 3],
    "noise_sigma": [0.0, 0.1],
    "seed": [0, 1],
}


@pytest.fixture(scope="module")
def store(synthetic_store):
    st = synthetic_store(SWEEP, GRID, singular_values=(4.0, 1.0, 0.25))[0]
    analyze(st, SWEEP)
    return st


def _legend_texts(fig) -> list[str]:
    legends = list(fig.legends) + [a.get_legend() for a in fig.axes if a.get_legend()]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


# --------------------------------------------------------------------------- registry


def test_registry_has_one_kind_per_module():
    import phasesweep.analysis.figures as pkg

    modules = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name[0] != "_")
    assert sorted(figures.kinds()) == modules
    for name in figures.kinds():
        kind = figures.get(name)
        assert kind.kind == name and type(kind).__module__.endswith(f".{name}")
        assert kind.caption  # the report's caption lives with the kind
    with pytest.raises(KeyError, match="did you mean 'loss_curves'"):
        figures.get("loss_curve")


def test_unknown_kind_is_a_spec_error_naming_the_key():
    spec = validate_spec({"name": "s", "plots": [{"kind": "loss_curves"}, {"kind": "heatmap"}]})
    with pytest.raises(SpecError) as e:
        check_plots(spec.plots)
    assert e.value.key == "plots[1].kind" and "phase_diagram" in str(e.value)
    bad_field = validate_spec({"name": "s", "plots": [{"kind": "loss_curves", "value": "x"}]})
    with pytest.raises(SpecError) as e:
        check_plots(bad_field.plots)
    assert e.value.key == "plots[0].value"


# --------------------------------------------------------------------------- never abort


@pytest.mark.heavy
def test_a_failing_figure_is_skipped_with_a_warning(store, tmp_path, monkeypatch, caplog):
    kind = figures.get("transversal")

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(type(kind), "draw", broken)
    with caplog.at_level(logging.WARNING):
        paths = plot(store, SWEEP, tmp_path)
    names = {p.stem for p in paths}
    assert "transversal" not in names
    assert {"escape_time", "loss_curves", "singular_values"} <= names
    msgs = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert msgs == [
        f"figure transversal (transversal) of sweep {SWEEP} skipped: RuntimeError: boom"
    ]
    assert not list(tmp_path.glob("transversal*")) and not list(tmp_path.glob(".*"))
    page = report(store, SWEEP, tmp_path)
    assert page.exists() and "fig-transversal" not in page.read_text()


@pytest.mark.heavy
def test_a_figure_with_nothing_to_draw_is_skipped(store, tmp_path, caplog):
    spec = validate_spec(
        {
            "name": SWEEP,
            "grid": GRID,
            "plots": [
                {"kind": "loss_curves", "where": "width = 99999"},
                {"kind": "escape_time"},
            ],
        }
    )
    store.write_spec(SWEEP, yaml.safe_dump(spec.model_dump(exclude_defaults=True)))
    try:
        with caplog.at_level(logging.WARNING):
            paths = plot(store, SWEEP, tmp_path)
    finally:
        store.write_spec(SWEEP, yaml.safe_dump({"name": SWEEP, "grid": GRID}))
    assert {p.stem for p in paths} == {"escape_time"}
    (msg,) = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert msg.startswith("figure loss_curves (loss_curves)") and "width = 99999" in msg
    with pytest.raises(Unavailable, match="no runs match"):
        draw("loss_curves", store, SWEEP, where="width = 99999")


# --------------------------------------------------------------------------- never mislead


def _cells(values, diverged=None, regime=None):
    n = len(values)
    return pd.DataFrame(
        {
            "x": np.arange(n, dtype=float) + 1,
            "y": [16] * n,
            "value": values,
            "value_sd": [np.nan] * n,
            "n_runs": [2] * n,
            "n_completed": [2] * n,
            "n_diverged": diverged or [0] * n,
            "n_failed": [0] * n,
            "n_seeds": [2] * n,
            "regime": regime or ["rich"] * n,
        }
    )


def _mesh_norm(fig):
    (mesh,) = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)]  # not the bar's
    return mesh.norm


def test_phase_colours_are_log_where_values_span_decades():
    pdf = figures.get("phase_diagram")
    from phasesweep.analysis.figures.phase_diagram import phase_diagram_figure

    wide = phase_diagram_figure(
        _cells([1e-7, 1e-4, 0.4]), x="init_scale", y="width", value="kernel_distance"
    )
    norm = _mesh_norm(wide)
    assert isinstance(norm, mcolors.LogNorm) and (norm.vmin, norm.vmax) == (1e-7, 0.4)
    narrow = phase_diagram_figure(
        _cells([0.1, 0.2, 0.4]), x="init_scale", y="width", value="kernel_distance"
    )
    assert not isinstance(_mesh_norm(narrow), mcolors.LogNorm)
    assert pdf.caption
    plt.close("all")


def _grid_cells(nx: int, ny: int, value) -> pd.DataFrame:
    """Cells of an nx x ny phase diagram, ``value(i, j)`` at column i, row j."""
    rows = [
        {"x": 10.0 ** (i - 3), "y": 16 * 2**j, "value": value(i, j), "value_sd": np.nan,
         "n_runs": 2, "n_completed": 2, "n_diverged": 0, "n_failed": 0, "n_seeds": 2,
         "n_analyzed": 2, "regime": "lazy" if value(i, j) < 0.1 else "rich"}
        for i in range(nx) for j in range(ny)
    ]  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("nx", "ny", "value"),
    [
        (9, 4, lambda i, j: 0.01 * 3 ** ((i + j) / 2)),  # a diagonal line
        (9, 3, lambda i, j: 0.01 * 2**i),  # a vertical line
        (6, 6, lambda i, j: 0.01 * 3**j),  # a horizontal line
        (12, 8, lambda i, j: 0.01 * 3 ** ((i + j) / 2)),  # small cells
    ],
)
def test_the_threshold_label_covers_no_cell_text(nx, ny, value):
    """Issue 32: the contour's label overlapped a cell's value. In the rendered figure the
    label's box meets no other text's box, and it sits on the threshold line."""
    from matplotlib.contour import ContourSet
    from phasesweep.analysis.figures.phase_diagram import THRESHOLD_LABEL, phase_diagram_figure

    fig = phase_diagram_figure(
        _grid_cells(nx, ny, value), x="init_scale", y="width", value="kernel_distance",
        threshold=0.1,
    )  # fmt: skip
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (a,) = [a for a in fig.axes if a.get_label() != "<colorbar>"]
    labels = [t for t in a.texts if t.get_gid() == THRESHOLD_LABEL]
    others = [t for t in a.texts if t.get_gid() != THRESHOLD_LABEL and t.get_text().strip()]
    assert len(labels) == 1 and labels[0].get_text() == "0.1" and len(others) == nx * ny
    box = labels[0].get_bbox_patch().get_window_extent(renderer)
    for t in others:
        assert not box.overlaps(t.get_window_extent(renderer)), (t.get_text(), t.get_position())
    # on the line: its distance to the nearest segment of the contour is round-off
    (cs,) = [c for c in a.collections if isinstance(c, ContourSet)]
    p = np.asarray(labels[0].get_position(), dtype=float)
    distances = []
    for path in cs.get_paths():
        for poly in path.to_polygons(closed_only=False):
            poly = np.asarray(poly, dtype=float)
            for u, v in zip(poly[:-1], poly[1:]):
                s = np.clip(np.dot(p - u, v - u) / max(np.dot(v - u, v - u), 1e-300), 0, 1)
                distances.append(np.hypot(*(p - (u + s * (v - u)))))
    assert min(distances) < 1e-9
    plt.close(fig)


def test_legends_list_only_what_is_drawn():
    from phasesweep.analysis.figures.loss_curves import loss_curves_figure
    from phasesweep.analysis.figures.phase_diagram import phase_diagram_figure

    clean = phase_diagram_figure(
        _cells([0.01, 0.2]), x="init_scale", y="width", value="kernel_distance", threshold=0.1
    )
    assert _legend_texts(clean) == []  # 1 x 2 grid: no contour; nothing diverged
    mixed = _cells([0.01, 0.02, np.nan], diverged=[0, 1, 2], regime=["rich", "not_converged", "x"])
    texts = _legend_texts(
        phase_diagram_figure(mixed, x="init_scale", y="width", value="kernel_distance")
    )
    assert texts == ["all runs diverged", "most runs not converged"]

    traj = pd.DataFrame({"run_id": ["a"] * 3, "time": [0.0, 1.0, 2.0], "train_loss": [1, 0.5, 0.1]})
    runs = pd.DataFrame({"run_id": ["a"], "init_scale": [0.1], "status": ["completed"]})
    texts = _legend_texts(loss_curves_figure(traj, runs, None))
    assert texts == ["init scale α 0.1"]
    runs.loc[0, "status"] = "diverged"
    plateaus = pd.DataFrame({"run_id": ["a"], "start": [1.0], "end": [2.0], "level": [0.5]})
    texts = _legend_texts(loss_curves_figure(traj, runs, plateaus))
    assert texts == [
        "init scale α 0.1",
        "detected plateau",
        "diverged run (×: its last finite loss)",
    ]
    plt.close("all")


def test_a_diverged_run_is_drawn_as_its_legend_says_or_counted_as_not_drawn():
    """A run that diverged after one finite loss has a × there (a line of one point would
    be invisible); one without any finite loss at t > 0 is counted in the legend, with no
    line and no marker of its own."""
    from phasesweep.analysis.figures.loss_curves import loss_curves_figure

    nan = float("nan")
    traj = pd.DataFrame(
        {
            "run_id": ["ok"] * 3 + ["one"] * 3 + ["none"] * 2,
            "time": [0.0, 1.0, 2.0, 0.0, 1.0, 2.0, 0.0, 1.0],
            "train_loss": [1.0, 0.5, 0.1, 1.0, 40.0, nan, 1.0, nan],
        }
    )
    runs = pd.DataFrame(
        {
            "run_id": ["ok", "one", "none"],
            "init_scale": [0.1, 1.0, 3.0],
            "status": ["completed", "diverged", "diverged"],
        }
    )
    fig = loss_curves_figure(traj, runs, None)
    lines = {(len(ln.get_xdata()), ln.get_marker(), ln.get_linestyle()) for ln in fig.axes[0].lines}
    assert lines == {(2, "None", "-"), (1, "x", "--")}  # "none" drew nothing
    assert _legend_texts(fig) == [
        "init scale α 0.1",
        "init scale α 1",
        "diverged run (×: its last finite loss)",
        "1 diverged run not drawn: no finite loss",
    ]
    plt.close("all")


def test_a_run_without_a_current_summary_is_drawn_as_not_analyzed(synthetic_store):
    """Issue 32: a loss curve of a run that has no current summary (new points, a run trained
    again) was drawn like an analyzed one, as if no plateau had been found on it. It is
    dotted, without the plateaus of any older summary, and the legend says why."""
    import pyarrow as pa
    from calibration import synthetic_sweep
    from matplotlib.patches import Rectangle
    from phasesweep.analysis.figures.loss_curves import NOT_ANALYZED_STYLE, loss_curves_figure

    traj = pd.DataFrame(
        {
            "run_id": ["a"] * 3 + ["b"] * 3,
            "time": [0.0, 1.0, 2.0] * 2,
            "train_loss": [1, 0.5, 0.1] * 2,
        }
    )
    runs = pd.DataFrame(
        {"run_id": ["a", "b"], "init_scale": [0.1, 1.0], "status": ["completed"] * 2,
         "analyzed": [True, False]}
    )  # fmt: skip
    stale = pd.DataFrame(
        {"run_id": ["a", "b"], "start": [1.0] * 2, "end": [2.0] * 2, "level": [0.5] * 2}
    )
    fig = loss_curves_figure(traj, runs, stale)
    (a,) = fig.axes
    assert sorted(ln.get_linestyle() for ln in a.lines) == sorted(["-", NOT_ANALYZED_STYLE])
    assert len([p for p in a.patches if isinstance(p, Rectangle)]) == 1  # run a's plateau only
    assert "not analyzed (no plateaus detected yet): phasesweep analyze" in _legend_texts(fig)
    plt.close(fig)

    # from the store: a chunk added after analyze, drawn from a catalog (nothing analyzes it)
    store, _ = synthetic_store(
        "late", {"init_scale": [0.01, 1.0], "width": [16], "depth": [2], "seed": [0]}
    )
    analyze(store, "late", workers=0)
    added = synthetic_sweep(init_scales=(0.1,), widths=(16,), depths=(2,), seeds=(0,), steps=10**6)
    for name, table in added.items():
        ids = pa.array([f"new-{r}" for r in table["run_id"].to_pylist()])
        added[name] = table.set_column(table.schema.get_field_index("run_id"), "run_id", ids)
    store.write_chunk("late", "c1", added)
    with open_catalog(store) as con:
        fig = draw("loss_curves", con, "late", facet=None)
    styles = [ln.get_linestyle() for a in fig.axes for ln in a.lines]
    assert styles.count(NOT_ANALYZED_STYLE) == added["runs"].num_rows == 1
    assert styles.count("-") == 2
    assert "not analyzed (no plateaus detected yet): phasesweep analyze" in _legend_texts(fig)
    plt.close(fig)


def test_spread_on_log_axes_stays_positive():
    from phasesweep.analysis.figures.transversal import transversal_figure

    # mean - sd of (1e-3, 1e-3, 1) is negative: a mean ± sd bar would run to zero
    df = pd.DataFrame(
        {
            "noise_sigma": [0.1] * 3 + [1.0] * 3,
            "depth": [2] * 6,
            "seed": [0, 1, 2] * 2,
            "final_transversal_grad_sq": [1e-3, 1e-3, 1.0, 1e-4, 2e-4, 3e-4],
        }
    )
    fig = transversal_figure(df)
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_yscale() == "log"
    segs = [s for c in ax.collections if isinstance(c, LineCollection) for s in c.get_segments()]
    assert segs
    lows = np.array([min(s[:, 1]) for s in segs])
    highs = np.array([max(s[:, 1]) for s in segs])
    # bars are min-max over seeds around the median
    assert np.allclose(sorted(lows), [1e-4, 1e-3]) and np.allclose(sorted(highs), [3e-4, 1.0])
    plt.close(fig)


def test_escape_time_lines_cover_only_adjacent_fitted_init_scales():
    # issue 26: the fit line ran over the whole axis, across init scales left out of the fit
    from phasesweep.analysis.figures.escape_time import escape_time_figure, fitted_spans

    alphas = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    in_fit = [True, True, False, True, True]  # 1e-2 left out (e.g. no plateau)
    points = pd.DataFrame(
        {
            "depth": 3,
            "seed": 0,
            "init_scale": alphas,
            "escape_time": [1e4, 1e3, 1e2, 10.0, 1.0],
            "in_fit": in_fit,
        }
    )
    assert fitted_spans(points) == [(1e-4, 1e-3), (1e-1, 1.0)]
    fit = {"depth": 3, "x": "log_init_scale", "slope": -1.0, "intercept": 0.0}
    fit |= {"ci_low": -1.1, "ci_high": -0.9, "init_scale_min": 1e-4, "init_scale_max": 1.0}
    fig = escape_time_figure(points, pd.DataFrame([fit]))
    (ax,) = fig.axes
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() != "None"]  # not the markers
    assert len(lines) == 4  # a solid fit and a dotted guide over each of the two stretches
    for ln in lines:
        x = np.asarray(ln.get_xdata())
        assert not ((x > 1e-3 * (1 + 1e-9)) & (x < 1e-1 * (1 - 1e-9))).any()
    solid = [ln for ln in lines if ln.get_linestyle() == "-"]
    for ln in solid:  # the fitted law itself, t = α^-1
        x, y = np.asarray(ln.get_xdata()), np.asarray(ln.get_ydata())
        assert np.allclose(y, 1 / x, rtol=1e-12)
    # a fit whose fitted init scales are nowhere adjacent draws no line, and says so
    lone = points.assign(in_fit=[True, False, True, False, True])
    fig = escape_time_figure(lone, pd.DataFrame([fit]))
    assert not [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() != "None"]
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert any("fit slope -1.00 [-1.10, -0.90] (no line)" in t for t in texts)
    plt.close("all")


def test_escape_time_markers_of_one_init_scale_do_not_hide_each_other_and_every_line_is_named():
    """Two widths with the same escape times: their markers sit side by side (within a
    third of the gap to the next init scale), the fit lines at α itself; the legend names
    the dashed log fit, the solid power law and the setting side by side."""
    from matplotlib.collections import PathCollection
    from phasesweep.analysis.figures.escape_time import escape_time_figure

    alphas = [1e-3, 1e-2, 1e-1]
    points = pd.DataFrame(
        {
            "depth": 2,
            "seed": 0,
            "width": np.repeat([16, 256], 3),
            "init_scale": alphas * 2,
            "escape_time": [30.0, 20.0, 10.0] * 2,
            "in_fit": True,
        }
    )
    span = {"init_scale_min": 1e-3, "init_scale_max": 0.1, "ci_low": np.nan, "ci_high": np.nan}
    fits = pd.DataFrame(
        [
            {"depth": 2, "x": "log_inv_init_scale", "slope": 10 / np.log(10), "intercept": 0.0}
            | span,
            {"depth": 2, "x": "log_init_scale", "slope": -0.2, "intercept": 1.0} | span,
        ]
    )
    fig = escape_time_figure(points, fits, hue="width")
    (ax,) = fig.axes
    markers = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]  # not the bars' caps
    xs = sorted(x for ln in markers for x in ln.get_xdata())
    assert len(xs) == 6
    for k, alpha in enumerate(alphas):  # two markers per init scale, apart, near it
        lo, hi = xs[2 * k], xs[2 * k + 1]
        assert lo < alpha < hi and np.log10(hi / lo) == pytest.approx(1 / 3)
    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert sorted(x for c in dots for x, _ in c.get_offsets()) == pytest.approx(xs)
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert dashed and all(np.asarray(ln.get_xdata()).min() == 1e-3 for ln in dashed)
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "fitted t = a + b·log(1/α) (dashed)" in texts
    assert "fitted power law t ∝ α^slope (solid)" in texts
    assert any("side by side" in t for t in texts)
    one = escape_time_figure(points[points["width"] == 16], fits, hue="width")
    xs = sorted(
        x for ln in one.axes[0].get_lines() if ln.get_marker() == "o" for x in ln.get_xdata()
    )
    assert xs == pytest.approx(alphas)  # one colour: at its init scales, nothing said
    assert not any("side by side" in t.get_text() for leg in one.legends for t in leg.get_texts())
    plt.close("all")


def test_singular_values_title_names_each_fixed_value_once(store):
    """The title says the shown run's seed (and depth, width) once: "seed 0" is not said
    again where the condition in brackets already sets it, but is where it does not."""
    fig = draw("singular_values", store, SWEEP)
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "[seed = 0" in title and "seed 0" not in title, title
    fig = draw("singular_values", store, SWEEP, where="seed <= 0 AND depth = 3 AND width = 256")
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "seed 0" in title and "depth 3" not in title and "width 256" not in title, title
    plt.close("all")


# --------------------------------------------------------------------------- draw API


def test_draw_into_a_given_axes(store):
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    out = draw(
        "loss_curves",
        store,
        SWEEP,
        ax=left,
        facet=None,
        where="seed = 0 AND depth = 2 AND width = 16 AND noise_sigma = 0.0",
    )
    # the figure takes the place of `left`: a subfigure of the caller's figure
    assert out is fig and left not in fig.axes and right in fig.axes
    (sub,) = fig.subfigs
    (panel,) = sub.axes
    assert len(panel.get_lines()) == 5  # one curve per init scale
    assert panel.get_subplotspec().get_gridspec() is not right.get_subplotspec().get_gridspec()
    # a faceted figure fills the place of the given axes with its panels
    con = open_catalog(store)
    fig2, ax2 = plt.subplots(figsize=(10, 4))
    out2 = draw("transversal", con, SWEEP, ax=ax2, facet="width")
    assert out2 is fig2 and ax2 not in fig2.axes
    titles = sorted(a.get_title() for a in fig2.axes)
    assert titles == ["width = 16", "width = 256"]
    # a new figure when no axes is given
    fig3 = draw("phase_diagram", con, SWEEP, value="param_rel_change")
    assert fig3 is not fig2 and any(
        isinstance(c, QuadMesh) for a in fig3.axes for c in a.collections
    )
    with pytest.raises(SpecError) as e:
        draw("phase_diagram", con, SWEEP, value="nonsense")
    assert e.value.key == "plots[0].value"
    plt.close("all")


@pytest.mark.parametrize("layout", ["constrained", None])
def test_draw_into_a_callers_panels_keeps_each_figure_in_its_place(store, layout):
    # issue 26: the notebook's layout (a phase diagram beside faceted loss curves) put the
    # legend over the heatmap and the colour bar's label into the next panel
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), layout=layout)
    draw("phase_diagram", store, SWEEP, ax=left, where="noise_sigma = 0.0 AND depth = 2")
    draw("loss_curves", store, SWEEP, ax=right, where="seed = 0 AND noise_sigma = 0.0")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    phase, curves = fig.subfigs
    # everything a figure drew (title, labels, colour bar and its label, legend) stays in
    # its half
    a, b = (sf.get_tightbbox(renderer) for sf in (phase, curves))
    assert a.x1 <= b.x0 + 1e-6, (a, b)
    # the legends sit below the panels, over no panel
    for sf in (phase, curves):
        assert sf.legends
        for leg in sf.legends:
            box = leg.get_window_extent(renderer)
            for panel in sf.axes:
                assert not box.overlaps(panel.get_window_extent(renderer)), panel
    (bar,) = [p for p in phase.axes if p.get_label() == "<colorbar>"]
    assert bar.yaxis.label.get_window_extent(renderer).x1 <= b.x0 * fig.dpi
    plt.close(fig)


# --------------------------------------------------------------------------- output safety


def test_plot_refuses_a_symlinked_output_folder(store, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(OutputError, match="symbolic link"):
        plot(store, SWEEP, tmp_path / "out")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.heavy
def test_plot_refuses_a_symlink_at_a_figure_name(store, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "loss_curves.png").symlink_to(victim)
    with pytest.raises(OutputError) as e:
        plot(store, SWEEP, out)
    assert "loss_curves.png" in str(e.value) and "symbolic link" in str(e.value)
    assert victim.read_text() == "precious"
    assert os.path.islink(out / "loss_curves.png")
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp file left


def test_plot_out_file_is_a_one_line_error(store, tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("keep")
    with pytest.raises(OutputError, match="not a folder"):
        plot(store, SWEEP, target)
    code = main(["plot", SWEEP, "--store", str(store.root), "--out", str(target)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not a folder" in err
    assert "Traceback" not in err and target.read_text() == "keep"
