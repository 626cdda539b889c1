"""The analysis follows the store (issue 32): a summary is shown only while it matches its
run's stored rows, ``plot``/``report`` analyze just the runs without one, and damage is
never analyzed into the tables. Every incremental result is checked against a fresh
``analyze`` of the same store (the independent answer)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pytest
from calibration import synthetic_sweep
from phasesweep.analysis import analyze
from phasesweep.analysis._analyze import DamagedRunsError
from phasesweep.analysis._plotting import open_sweep
from phasesweep.storage import DamagedFileWarning, Store, open_catalog, verify
from phasesweep.storage._catalog import UNANALYZED, UNANALYZED_SQL

from phasesweep._cli import main

SWEEP = "follow"
SCALES = (1e-3, 1e-2, 1e-1, 1.0)


def _chunk(store: Store, chunk: str, widths=(16,), seeds=(0, 1), sweep: str = SWEEP) -> list[str]:
    """Commit one chunk of the synthetic sweep; its run ids."""
    tables = synthetic_sweep(
        init_scales=SCALES, widths=widths, depths=(2,), seeds=seeds, steps=2000
    )
    # the synthetic ids count from 0: name each point by its widths and seeds, as a grid would
    tag = f"w{'_'.join(map(str, widths))}s{'_'.join(map(str, seeds))}-"
    for name, table in tables.items():
        i = table.schema.get_field_index("run_id")
        ids = pc.binary_join_element_wise(tag, table["run_id"], "")
        tables[name] = table.set_column(i, "run_id", ids)
    store.write_chunk(sweep, chunk, tables)
    return tables["runs"]["run_id"].to_pylist()


def _unanalyzed(store: Store, sweep: str = SWEEP) -> set[str]:
    """The runs :data:`UNANALYZED_SQL` lists (an anti join), which the :data:`UNANALYZED`
    condition on each run (``status`` and the loss curves use it) must select too."""
    with open_catalog(store) as con:
        listed, selected = (
            {r for (r,) in con.execute(sql, {"sweep": sweep}).fetchall()}
            for sql in (
                f"SELECT run_id FROM ({UNANALYZED_SQL})",
                f"SELECT run_id FROM runs AS r WHERE r.sweep = $sweep AND {UNANALYZED}",
            )
        )
    assert listed == selected
    return listed


def _tables(store: Store) -> dict[str, pd.DataFrame]:
    """The sweep's analysis tables as the catalog shows them, in a fixed order."""
    with open_catalog(store) as con:
        out = {
            "summaries": con.execute(
                "SELECT * FROM summaries WHERE sweep = ? ORDER BY run_id", [SWEEP]
            ).df(),
            "plateaus": con.execute(
                "SELECT * FROM plateaus WHERE sweep = ? ORDER BY run_id, plateau_index", [SWEEP]
            ).df(),
            "scaling_fits": con.execute(
                "SELECT * FROM scaling_fits WHERE sweep = ? ORDER BY ALL", [SWEEP]
            ).df(),
        }
    return {k: v.reset_index(drop=True) for k, v in out.items()}


def _same_as_fresh(store: Store) -> None:
    """The tables equal those of a fresh analysis of the same store."""
    incremental = _tables(store)
    analyze(store, SWEEP, workers=0)
    fresh = _tables(store)
    for name in fresh:
        pd.testing.assert_frame_equal(incremental[name], fresh[name], check_dtype=False)


@pytest.mark.parametrize("grow", ["extend_width", "new_seed"])
def test_new_points_are_unanalyzed_until_analyzed_incrementally(tmp_path, grow):
    store = Store.open(str(tmp_path / "store"))
    first = _chunk(store, "c0")
    analyze(store, SWEEP, workers=0)
    assert _unanalyzed(store) == set()
    if grow == "extend_width":
        added = _chunk(store, "c1", widths=(64,))
    else:
        added = _chunk(store, "c1", seeds=(2,))
    assert _unanalyzed(store) == set(added)
    # the summaries view shows the first runs only; the new ones have none yet
    assert set(_tables(store)["summaries"]["run_id"]) == set(first)
    counts = analyze(store, SWEEP, workers=0, unanalyzed=True)
    assert counts["summaries"] == len(first) + len(added)
    assert _unanalyzed(store) == set()
    _same_as_fresh(store)


def test_a_summary_counts_for_its_own_sweep_only(tmp_path):
    store = Store.open(str(tmp_path / "store"))
    runs = _chunk(store, "c0")
    assert _chunk(store, "c0", sweep="twin") == runs  # the same run ids in another sweep
    analyze(store, SWEEP, workers=0)
    assert _unanalyzed(store) == set()
    assert _unanalyzed(store, "twin") == set(runs)
    analyze(store, "twin", workers=0)
    assert _unanalyzed(store, "twin") == set()


def test_plot_context_analyzes_only_the_unanalyzed_runs(tmp_path, monkeypatch):
    from phasesweep.analysis import _analyze

    store = Store.open(str(tmp_path / "store"))
    _chunk(store, "c0")
    analyze(store, SWEEP, workers=0)
    added = _chunk(store, "c1", widths=(64,))
    calls = []
    real = _analyze.analyze

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(_analyze, "analyze", spy)
    with open_sweep(store, SWEEP):
        pass
    assert calls == [{"unanalyzed": True}]
    assert _unanalyzed(store) == set()
    with open_sweep(store, SWEEP):  # nothing left: no analysis
        pass
    assert len(calls) == 1
    assert added and _same_as_fresh(store) is None


def _truncate_trajectories(store: Store, chunk: str) -> str:
    (path,) = [p for p in store.files("trajectories", SWEEP) if f"-{chunk}-" in p]
    with open(path, "r+b") as f:
        f.truncate(100)
    return store.relative(path)


def test_damaged_trajectories_are_never_analyzed_and_repair_relaunch_follows(tmp_path):
    store = Store.open(str(tmp_path / "store"))
    kept = _chunk(store, "c0")
    damaged_runs = _chunk(store, "c1", widths=(64,))
    name = _truncate_trajectories(store, "c1")
    # each read of the catalog names the file it skipped
    skipped = re.escape(f"{name}: no Parquet footer")
    with pytest.warns(DamagedFileWarning, match=skipped), pytest.raises(DamagedRunsError) as e:
        analyze(store, SWEEP, workers=0)
    assert name in str(e.value) and e.value.runs == len(damaged_runs)
    assert "verify follow --repair" in str(e.value)
    # no summary of a run it could not read completely; the others are there
    with pytest.warns(DamagedFileWarning, match=skipped):
        assert set(_tables(store)["summaries"]["run_id"]) == set(kept)
    with pytest.warns(DamagedFileWarning, match=skipped):
        assert _unanalyzed(store) == set(damaged_runs)

    assert verify(store, SWEEP, repair=True, min_age_s=0).problems
    _chunk(store, "c1", widths=(64,))  # the relaunch trains them again: a new commit
    assert _unanalyzed(store) == set(damaged_runs)
    analyze(store, SWEEP, workers=0, unanalyzed=True)
    assert _unanalyzed(store) == set()
    _same_as_fresh(store)


def test_summaries_of_retrained_runs_are_not_current(tmp_path):
    """A run committed anew (a relaunch after a repair) hides its old summary at once."""
    store = Store.open(str(tmp_path / "store"))
    runs = _chunk(store, "c0")
    analyze(store, SWEEP, workers=0)
    # quarantine the commit as a repair would, then commit the same runs again
    for path in store.files("runs", SWEEP):
        store.fs.rm_file(path)
    assert _tables(store)["summaries"].empty  # runs no longer stored: no summary shown
    _chunk(store, "c0")
    assert _unanalyzed(store) == set(runs)
    assert _tables(store)["summaries"].empty


def test_analyze_cli_exits_1_naming_the_damaged_file(tmp_path, capsys):
    store = Store.open(str(tmp_path / "store"))
    _chunk(store, "c0")
    _chunk(store, "c1", widths=(64,))
    name = _truncate_trajectories(store, "c1")
    assert main(["analyze", SWEEP, "--store", store.uri]) == 1
    err = capsys.readouterr().err
    assert name in err and "--repair" in err


def test_status_counts_the_runs_without_a_current_summary(tmp_path, capsys):
    from phasesweep import status

    store = Store.open(str(tmp_path / "store"))
    first = _chunk(store, "c0")
    assert status(SWEEP, store).unanalyzed == {SWEEP: len(first)}  # never analyzed
    analyze(store, SWEEP, workers=0)
    assert status(store=store).unanalyzed == {}
    assert main(["status", SWEEP, "--store", store.uri]) == 0
    assert "no current summary" not in capsys.readouterr().out
    added = _chunk(store, "c1", widths=(64,))  # an extended grid
    assert status(store=store).unanalyzed == {SWEEP: len(added)}
    assert main(["status", SWEEP, "--store", store.uri]) == 0
    out = capsys.readouterr().out
    assert f"{len(added)} run(s) have no current summary" in out
    assert f"phasesweep analyze {SWEEP}" in out


def test_a_phase_diagram_cell_without_a_current_summary_is_not_analyzed(tmp_path):
    import matplotlib.pyplot as plt
    from phasesweep.analysis._phase import phase_diagram_sql
    from phasesweep.analysis.figures.phase_diagram import phase_diagram_figure

    store = Store.open(str(tmp_path / "store"))
    _chunk(store, "c0")
    analyze(store, SWEEP, workers=0)
    added = _chunk(store, "c1", widths=(64,))  # extended, not analyzed
    sql = phase_diagram_sql(SWEEP, value="param_rel_change")
    with open_catalog(store) as con:
        cells = con.execute(sql).df()
        # the analyzed cells: the mean over the completed seeds of the current summaries
        want = con.execute(
            "SELECT r.init_scale, avg(s.final_param_rel_change) FROM runs r JOIN summaries s "
            "USING (sweep, run_id) WHERE r.width = 16 AND r.status = 'completed' GROUP BY 1"
        ).fetchall()
    new = cells[cells["y"] == 64]
    assert new["n_runs"].sum() == len(added) and (new["n_analyzed"] == 0).all()
    assert new["value"].isna().all()  # never a value
    old = cells[cells["y"] == 16].set_index("x")["value"]
    assert {x: old[x] for x, _ in want} == pytest.approx(dict(want))
    fig = phase_diagram_figure(cells, x="init_scale", y="width", value="param_rel_change")
    ax = fig.axes[0]
    (mesh,) = ax.collections[:1]
    coloured = ~np.ma.getmaskarray(mesh.get_array()).reshape(2, len(SCALES))
    assert coloured.tolist() == [[True] * len(SCALES), [False] * len(SCALES)]  # rows: y 16, 64
    marked = [t for t in ax.texts if t.get_text() == "not\nanalyzed"]
    assert len(marked) == len(SCALES) and all(t.get_position()[1] == 1.5 for t in marked)
    legend = [t.get_text() for leg in fig.legends + [ax.get_legend()] if leg for t in leg.texts]
    assert any(t.startswith("not analyzed") for t in legend)
    plt.close(fig)
    # once analyzed, no cell is marked
    analyze(store, SWEEP, workers=0, unanalyzed=True)
    with open_catalog(store) as con:
        cells = con.execute(sql).df()
    assert (cells["n_analyzed"] == cells["n_runs"]).all() and cells["value"].notna().all()


def test_a_refined_boundary_is_drawn_on_its_own_metric_only(tmp_path):
    """Item 4: boundaries of two metrics; each phase diagram draws its own, labelled with
    its metric and level, above the cell's value text (hollow markers)."""
    import matplotlib.pyplot as plt
    from phasesweep.analysis._boundaries import BOUNDARY_COLOR
    from phasesweep.analysis._style import short_label
    from phasesweep.analysis.figures.phase_diagram import phase_diagram_figure

    xs, ws = [0.01, 0.1, 1.0], [16, 64]
    cells = pd.DataFrame(
        [
            dict(x=x, y=w, value=0.1 * (i + 1), n_runs=2, n_diverged=0, n_seeds=2)
            for i, x in enumerate(xs)
            for w in ws
        ]
    )
    line = dict(
        bracketed=True,
        axis_scale="log",
        bracket_low=0.05,
        bracket_high=0.2,
        seed_boundaries=[0.08, 0.12],
    )
    boundaries = pd.DataFrame(
        [dict(line, metric="kernel_distance", level=0.1, width=w, boundary=0.1) for w in ws]
        + [
            dict(
                line,
                metric="param_rel_change",
                level=0.25,
                width=16,
                boundary=0.3,
                bracket_high=0.5,
            )
        ]
    )
    for value, level, n in (("kernel_distance", "0.1", 2), ("param_rel_change", "0.25", 1)):
        fig = phase_diagram_figure(
            cells, x="init_scale", y="width", value=value, boundaries=boundaries
        )
        ax = fig.axes[0]
        drawn = [
            ln for ln in ax.lines if ln.get_color() == BOUNDARY_COLOR and ln.get_marker() == "D"
        ]
        assert len(drawn) == 1 and len(drawn[0].get_ydata()) == n  # its own lines only
        assert drawn[0].get_markerfacecolor() == "none"
        # above the centre of its row, where the value text is
        texts = {t.get_position()[1] for t in ax.texts if t.get_text()}
        assert texts == {0.5, 1.5} and not set(drawn[0].get_ydata()) & texts
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert [t for t in legend if t.startswith("refined boundary")] == [
            f"refined boundary of {short_label(value)} at level {level} (bar: bracket, ticks: seeds)"
        ]
        plt.close(fig)
