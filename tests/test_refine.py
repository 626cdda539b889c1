"""``phasesweep refine``: the level-set sampler, bracketing, the store, resume after a
kill, two refines at once, bad input, and a small real refinement with its overlay.

The synthetic sweep (:mod:`refine_synthetic`) has a closed-form metric whose seed mean
crosses the level at a known init scale per width; its trainer is replaced, so those
tests train nothing. The real refinement trains a tiny net in this process.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import matplotlib
import numpy as np
import optuna
import pytest
import refine_synthetic as syn
import yaml
from optuna.trial import TrialState
from phasesweep.pipeline.refine._levelset import LINE, LevelSetSampler, X, coord
from phasesweep.pipeline.refine._refine import child_name, refine
from phasesweep.storage import Store, run_query
from test_store_s3 import s3_server, s3_store  # noqa: F401 (fixtures)

from phasesweep._cli import main

matplotlib.use("Agg")

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------ the sampler alone


def _sampler(per_line: int = 1, tol: float = 0.07, lines=("a", "b", "c")):
    """Lines a, b: the metric 1 - u crosses 0 at u = 0.3 (a) and -0.45 (b); line c is
    above the level everywhere. Seeded at u = -2 ... 1."""
    cross = {"a": 0.3, "b": -0.45, "c": 5.0}
    seeded = {k: [(u, cross[k] - u) for u in (-2.0, -1.0, 0.0, 1.0)] for k in lines}
    s = LevelSetSampler(lines, seeded, 0.0, tol, low=0.01, high=10.0, log=True, per_line=per_line)
    return s, cross


def _tell_all(study, sampler, cross, trials):
    for t in trials:
        u = math.log10(t.params[X])
        study.tell(t, cross[t.params[LINE]] - u)


def test_bisection_brackets_the_known_crossing_in_the_closed_form_number_of_points():
    sampler, cross = _sampler()
    study = optuna.create_study(sampler=sampler)
    asked = []
    while (params := sampler.next_params(study)) is not None:
        t = study.ask(sampler.search_space)
        assert t.params == params
        asked.append(t)
        _tell_all(study, sampler, cross, [t])
    states = sampler.states(study.get_trials())
    # one decade halves to <= 0.07 in ceil(log2(1 / 0.07)) = 4 points, per bracketed line
    n = Counter(t.params[LINE] for t in asked)
    assert n == {"a": 4, "b": 4}
    for k in ("a", "b"):
        lo, hi = states[k].bracket(0.0)
        assert lo <= cross[k] <= hi and hi - lo <= 0.07
        assert states[k].converged(0.0, 0.07)
    # never the same point twice, and each strictly inside the bracket it was asked in
    keys = [(t.params[LINE], t.params[X]) for t in asked]
    assert len(set(keys)) == len(keys)


def test_a_line_without_a_sign_change_is_never_proposed_nor_converged():
    sampler, _ = _sampler(lines=("c",))
    study = optuna.create_study(sampler=sampler)
    assert sampler.next_params(study) is None
    state = sampler.states(study.get_trials())["c"]
    assert state.bracket(0.0) is None and not state.converged(0.0, 1e9)
    assert state.side(0.0) == "above"
    with pytest.raises(RuntimeError, match="no point to propose"):
        study.ask(sampler.search_space)


def test_pending_and_void_points_are_never_proposed_again(tmp_path):
    """Two studies on one journal file stand for two processes: the second one sees the
    first one's pending trials and proposes other points (per_line 3: quarters)."""
    path = str(tmp_path / "journal.log")

    def open_one():
        s, cross = _sampler(per_line=3, lines=("a",))
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(path))
        return optuna.create_study(study_name="s", storage=storage, sampler=s, load_if_exists=True)

    one, two = open_one(), open_one()
    first = one.ask(one.sampler.search_space)  # the midpoint of [0, 1]: u = 0.5
    assert math.isclose(math.log10(first.params[X]), 0.5)
    second = [two.ask(two.sampler.search_space) for _ in range(2)]
    us = sorted(math.log10(t.params[X]) for t in [first, *second])
    assert np.allclose(us, [0.25, 0.5, 0.75])
    assert two.sampler.next_params(two) is None  # 3 pending: the line is busy
    # a point that trained without a value (pruned) splits its gap but is not repeated
    one.tell(first, state=TrialState.PRUNED)
    nxt = math.log10(one.sampler.next_params(one)[X])
    assert np.isclose([0.125, 0.375, 0.625, 0.875], nxt).any()


# ------------------------------------------------------------ the synthetic sweep


@pytest.fixture
def synth_store(tmp_path) -> Store:
    store = Store.open(str(tmp_path / "store"))
    syn.make_parent(store)
    return store


def _check_boundaries(store: Store) -> None:
    """The stored table against the closed form."""
    names, rows = run_query(store, "SELECT * FROM boundaries ORDER BY width")
    got = [dict(zip(names, r)) for r in rows]
    assert [r["width"] for r in got] == [16, 256, 4096]
    for r in got:
        assert r["sweep"] == child_name("synth", "final_train_loss") and r["parent"] == "synth"
        u_star = syn.U_STAR[r["width"]]
        if r["width"] == 4096:  # the crossing lies beyond the grid: flagged, not estimated
            assert not r["bracketed"] and r["side"] == "above" and not r["converged"]
            assert r["boundary"] is None and r["n_refine_runs"] == 0
            continue
        lo, hi = math.log10(r["bracket_low"]), math.log10(r["bracket_high"])
        assert r["bracketed"] and r["converged"] and lo <= u_star <= hi and hi - lo <= syn.TOL
        assert lo <= math.log10(r["boundary"]) <= hi
        assert abs(math.log10(r["boundary"]) - u_star) <= hi - lo
        # 4 bisections x 2 seeds refined, on top of the parent's 4 x 2
        assert (r["n_refine_runs"], r["n_runs"]) == (8, 16)
        truth = sorted(syn.seed_crossing(r["width"], s) for s in syn.OFFSET)
        got_seeds = sorted(math.log10(v) for v in r["seed_boundaries"])
        assert np.allclose(got_seeds, truth, atol=0.1)  # the seeds' own brackets are wider
        assert math.isclose(r["seed_spread"], np.std(got_seeds, ddof=1), rel_tol=1e-9)


def test_synthetic_refinement_store_table_and_child_sweep(synth_store, tmp_path):
    log = str(tmp_path / "trained.log")
    out = syn.run(synth_store.uri, log)
    child = child_name("synth", "final_train_loss")
    assert out.child == child and out.trained == 16 and out.failed == 0
    assert out.batches == 4  # both bracketed lines bisect together, one point each per batch
    trained = syn.trained(log)
    assert len(trained) == len(set(trained)) == 16
    _check_boundaries(synth_store)
    # the runs are a sweep of their own, queryable like any other, its spec names the parent
    _, rows = run_query(synth_store, f"SELECT count(*) FROM runs WHERE sweep = '{child}'")
    assert rows == [(16,)]
    assert synth_store.done_run_ids(child) == set(trained)
    from phasesweep.pipeline.spec import parse_yaml, validate_spec

    spec = validate_spec(parse_yaml(synth_store.read_spec(child)))
    assert spec.parent == "synth" and spec.name == child
    from phasesweep.pipeline.grid import expand

    assert set(trained) <= {p.run_id for p in expand(spec)}  # every refined point is a grid point
    # a second refine finds nothing to do and trains nothing
    again = syn.run(synth_store.uri, log)
    assert again.trained == 0 and len(syn.trained(log)) == 16


def test_default_tol_is_four_halvings_on_a_log_spaced_grid(tmp_path, monkeypatch):
    """Issue 26: on ``{logspace: [-0.5, 0.5, 5]}`` the finest spacing is 0.25 up to
    round-off, the default tol (spacing / 16) 0.015624999999999998, and a bracket halved
    four times (0.015625) was judged too wide: a fifth halving, 30 runs instead of 24 on
    three lines of two seeds."""
    import phasesweep.pipeline.train._trainer as trainer
    from phasesweep.pipeline.grid import expand, make_chunks
    from phasesweep.pipeline.spec import validate_spec

    crossings = {16: -0.43, 32: 0.13, 64: 0.31}  # inside the range, off bisection points
    for width, u in crossings.items():
        monkeypatch.setitem(syn.U_STAR, width, u)
    grid = {"init_scale": {"logspace": [-0.5, 0.5, 5]}, "width": sorted(crossings), "seed": [0, 1]}
    parent = {**syn.PARENT, "grid": grid}
    store = Store.open(str(tmp_path / "store"))
    spec = validate_spec(parent)
    store.write_spec(spec.name, yaml.safe_dump(parent))
    for c in make_chunks(expand(spec), spec):
        store.write_chunk(
            spec.name, c.chunk_id, {"runs": syn.runs_rows(c.points, c.chunk_id, None)}
        )
    us = [coord(x, True) for x in np.logspace(-0.5, 0.5, 5).tolist()]  # as refine's plan
    assert min(np.diff(us)) / 16 < 0.25 / 16  # the round-off the slack absorbs
    real = syn.install(str(tmp_path / "trained.log"))
    try:
        out = refine(
            store.uri,
            "synth",
            "final_train_loss",
            syn.LEVEL,
            use_ray=False,
            poll_seconds=0.2,
            log=lambda msg: None,
        )
    finally:
        trainer.train_chunk = real
    assert out.trained == 3 * 4 * 2  # lines x halvings x seeds
    names, rows = run_query(store, "SELECT * FROM boundaries ORDER BY width")
    for r in (dict(zip(names, row)) for row in rows):
        lo, hi = math.log10(r["bracket_low"]), math.log10(r["bracket_high"])
        assert r["converged"] and lo <= crossings[r["width"]] <= hi
        assert math.isclose(hi - lo, 0.25 / 16, rel_tol=1e-12)  # four halvings, not five


def test_a_bracket_at_tol_up_to_round_off_is_converged_and_a_wider_one_is_not():
    from phasesweep.pipeline.refine._levelset import LineState

    tol = 0.25 / 16 * (1 - 2**-52)  # the default tol as the grid's floats give it
    for width, done in ((0.015625, True), (tol, True), (0.015625 * (1 + 1e-6), False)):
        state = LineState(known=[(0.0, 1.0), (width, -1.0)])
        assert state.converged(0.0, tol) is done
        assert (state.proposal(0.0, tol, 1) is None) is done


def test_the_journal_reads_with_the_commands_its_docs_give(synth_store, tmp_path, capsys):
    # issue 26: the journal was not documented; docs/refine.md and `refine --help` name it
    import re

    syn.run(synth_store.uri, str(tmp_path / "trained.log"))
    child = child_name("synth", "final_train_loss")
    journal = Path(synth_store.root) / "refine" / f"sweep={child}" / "journal.log"
    assert journal.is_file()
    study = f"final_train_loss|{syn.LEVEL!r}|model.init_scale"
    doc = (HERE.parent / "docs" / "refine.md").read_text()
    (shell,) = re.findall(r"```bash\n(.*?)```", doc, flags=re.S)
    (python,) = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    shell = shell.replace("kernel_distance|0.01|model.init_scale", study)
    shell = re.sub(r"^J=.*$", f"J={journal}", shell, flags=re.M)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    out = subprocess.run(["bash", "-ec", shell], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert study in out.stdout and out.stdout.count("COMPLETE") == 8  # 16 runs / 2 seeds
    scope = {"J": str(journal)}
    exec(python.replace("kernel_distance|0.01|model.init_scale", study), scope)
    assert len(scope["trials"]) == 8 and set(scope["trials"]["state"]) == {"COMPLETE"}
    # --help points to it
    assert main(["refine", "--help"]) == 0
    assert "optuna trials --storage-class JournalFileBackend" in capsys.readouterr().out


def test_budget_stops_the_refinement_and_a_resume_goes_on(synth_store, tmp_path):
    log = str(tmp_path / "trained.log")
    out = syn.run(synth_store.uri, log, budget=6)  # 3 points x 2 seeds
    assert out.trained == 6
    names, rows = run_query(synth_store, "SELECT width, converged FROM boundaries ORDER BY 1")
    assert not any(c for w, c in rows if w != 4096)
    syn.run(synth_store.uri, log)
    _check_boundaries(synth_store)
    trained = syn.trained(log)
    assert len(trained) == len(set(trained)) == 16


def test_a_training_failure_fails_the_batch_and_the_next_refine_retries_it(synth_store, tmp_path):
    """Batch 2 trains two chunks; the second raises. The first chunk's runs stay done,
    the batch's trials fail, and the next refine asks the same points again, training
    only the chunk the store lacks."""
    log = str(tmp_path / "trained.log")
    with pytest.raises(RuntimeError, match="synthetic training failure"):
        syn.run(synth_store.uri, log, fail_at=4)
    child = child_name("synth", "final_train_loss")
    assert len(synth_store.done_run_ids(child)) == 6
    assert syn.run(synth_store.uri, log).trained == 10
    trained = syn.trained(log)
    assert len(trained) == len(set(trained)) == 16
    _check_boundaries(synth_store)
    from phasesweep.pipeline.refine._refine import plan_refinement

    p = plan_refinement(synth_store, "synth", "final_train_loss", syn.LEVEL)
    with p.study() as (study, *_):
        trials = study.get_trials()
    states = Counter(t.state for t in trials)
    assert states == {TrialState.COMPLETE: 8, TrialState.FAIL: 2}
    failed = {(t.params[LINE], t.params[X]) for t in trials if t.state == TrialState.FAIL}
    assert failed <= {(t.params[LINE], t.params[X]) for t in trials if t.state != TrialState.FAIL}


def _start(store: Store, log: str, tmp: Path, block_at: int = 0, delay: float = 0.0):
    """A refine in a process of its own, whose temporary files (DuckDB's spill folder) go
    to ``tmp``: a killed one cleans nothing up."""
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "refine_synthetic.py"),
            store.uri,
            log,
            str(block_at),
            str(delay),
        ],
        env=dict(os.environ, TMPDIR=str(tmp)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.process
def test_killed_refine_resumes_where_it_stopped(synth_store, tmp_path):
    """The second batch has two chunks (widths 16, 256); the refine is killed inside the
    second one, after the first committed. The resume adopts the dead process's trials,
    trains only the chunk the store lacks, and ends where an uninterrupted run ends."""
    log = str(tmp_path / "trained.log")
    proc = _start(synth_store, log, tmp_path, block_at=4)
    deadline = time.monotonic() + 300
    while not os.path.exists(log + ".blocked"):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    child = child_name("synth", "final_train_loss")
    assert len(synth_store.done_run_ids(child)) == 6  # batch 1 (4 runs) + one chunk of batch 2
    out = syn.run(synth_store.uri, log)
    assert out.trained == 10
    trained = syn.trained(log)
    assert len(trained) == len(set(trained)) == 16
    _check_boundaries(synth_store)
    # the dead process's trials were finished, not asked again: 8 trials, all complete
    from phasesweep.pipeline.refine._refine import plan_refinement

    p = plan_refinement(synth_store, "synth", "final_train_loss", syn.LEVEL)
    with p.study() as (study, *_):
        states = Counter(t.state for t in study.get_trials())
    assert states == {TrialState.COMPLETE: 8}


@pytest.mark.process
def test_two_refines_of_one_sweep_never_train_a_point_twice(synth_store, tmp_path):
    """The second refine starts while the first is in the middle of its first batch
    (its points pending in the journal): it must not train them, and the two together
    end where one refine ends."""
    log = str(tmp_path / "trained.log")
    first = _start(synth_store, log, tmp_path, delay=1.0)
    deadline = time.monotonic() + 300
    while not syn.trained(log):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = _start(synth_store, log, tmp_path, delay=1.0)
    outs = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    trained = syn.trained(log)
    assert len(trained) == len(set(trained)) == 16
    assert sum(int(o.strip()) for o, _ in outs) == 16
    _check_boundaries(synth_store)


BAD_ARGS = [
    (["--metric", "no_such"], "--metric", "no_such"),
    (["--level", "7"], "--level", "7"),
    (["--level", "-9"], "--level", "-9"),
    (["--axis", "depth"], "--axis", "depth"),
    (["--axis", "seed"], "--axis", "seed"),
    (["--axis", "width"], "--axis", "width"),
    (["--budget", "0"], "--budget", "0"),
]


@pytest.mark.parametrize("args,named,shown", BAD_ARGS)
def test_bad_input_exits_2_names_the_argument_writes_nothing(
    synth_store, capsys, args, named, shown
):
    def listing():
        return sorted(
            (p, os.path.getmtime(os.path.join(d, p)))
            for d, _, fs in os.walk(synth_store.root)
            for p in fs
        )

    before = listing()
    given = {"--metric": "final_train_loss", "--level": "0.5", **dict(zip(args[::2], args[1::2]))}
    argv = ["refine", "synth", "--store", synth_store.uri, "--in-process"]
    argv += [x for kv in given.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert named in err and shown in err, err
    assert len(err.strip().splitlines()) == 1
    assert listing() == before


# ------------------------------------------------------------- a real refinement


#: a tiny two-layer net (antisymmetric init, 20 GD steps): param_rel_change falls with
#: the init scale.
TINY_REAL = {
    "name": "tinyref",
    "model": {"depth": 2, "width": 8, "init": "antisymmetric"},
    "data": {"n_train": 8, "n_test": 8, "input_dim": 3, "seed": 0},
    "train": {"steps": 20, "log_points": 5, "lr": 0.5},
    "metrics": {"probe_size": 4, "spectra": False},
}


@pytest.mark.heavy
def test_real_refinement_store_table_and_overlay(tmp_path):
    """Refine where param_rel_change of :data:`TINY_REAL` crosses 0.25, in this process."""
    from matplotlib import pyplot as plt
    from phasesweep.analysis._boundaries import BOUNDARY_COLOR, boundaries_frame, draw_boundaries
    from phasesweep.analysis.figures import phase_diagram_figure
    from phasesweep.pipeline.grid import expand, make_chunks
    from phasesweep.pipeline.run._trial import train_and_store
    from phasesweep.pipeline.spec import validate_spec

    raw = dict(TINY_REAL, grid={"width": [8, 32], "init_scale": [0.1, 0.3, 1.0], "seed": [0, 1]})
    spec = validate_spec(raw)
    store = Store.open(str(tmp_path / "store"))
    store.write_spec("tinyref", yaml.safe_dump(raw))
    for c in make_chunks(expand(spec), spec):
        train_and_store(store.uri, "tinyref", c, "cpu")
    out = refine(
        store, "tinyref", "param_rel_change", 0.25, tol=0.03, use_ray=False, log=lambda m: None
    )
    child = out.child
    assert out.trained > 0 and out.failed == 0
    # the new runs are real trainings with trajectories, same schema as the parent's
    _, rows = run_query(
        store,
        f"SELECT r.init_scale, r.width, r.seed, t.param_rel_change FROM runs r "
        f"JOIN trajectories t USING (sweep, run_id) WHERE r.sweep = '{child}' AND t.step = 20",
    )
    assert len(rows) == out.trained
    frame = boundaries_frame(store, "tinyref")
    assert list(frame["width"]) == [8, 32] and frame["bracketed"].all() and frame["converged"].all()
    for r in frame.itertuples():
        # an independent check of the bracket: the seed means at its two ends, from SQL
        _, means = run_query(
            store,
            "SELECT r.init_scale, avg(t.param_rel_change) FROM runs r JOIN trajectories t "
            "USING (sweep, run_id) WHERE r.sweep IN ('tinyref', "
            f"'{child}') AND r.width = {r.width} AND t.step = 20 GROUP BY 1 ORDER BY 1",
        )
        m = dict(means)
        assert (m[r.bracket_low] - 0.25) * (m[r.bracket_high] - 0.25) < 0
        inside = [x for x in m if r.bracket_low < x < r.bracket_high]
        assert not inside  # the bracket is between adjacent measured points
        assert math.log10(r.bracket_high / r.bracket_low) <= 0.03
    # the overlay on the phase diagram's cells lands where the values interpolate
    import pandas as pd

    cells = pd.DataFrame(
        [
            dict(x=x, y=w, value=0.1, n_runs=2, n_diverged=0, n_seeds=2)
            for x in (0.1, 0.3, 1.0)
            for w in (8, 32)
        ]
    )
    fig = phase_diagram_figure(cells, x="init_scale", y="width", value="param_rel_change")
    ax = fig.axes[0]
    before = len(ax.lines)
    assert draw_boundaries(ax, frame, y="width", x_cells=[0.1, 0.3, 1.0], y_cells=[8, 32]) == 2
    xs = np.log10([0.1, 0.3, 1.0])
    want = np.interp(np.log10(frame["boundary"]), xs, [0.5, 1.5, 2.5])
    line = ax.lines[before]
    assert np.allclose(line.get_xdata(), want) and np.allclose(line.get_ydata(), [0.85, 1.85])
    plt.close(fig)
    # the parent's own phase diagram carries the overlay, and its report the table
    from phasesweep.analysis import draw, report

    fig = draw("phase_diagram", store, "tinyref", value="param_rel_change")
    ax = fig.axes[0]
    refined = [ln for ln in ax.lines if ln.get_color() == BOUNDARY_COLOR and len(ln.get_xdata())]
    assert refined and np.allclose(refined[0].get_xdata(), want)
    assert any("refined boundary" in t.get_text() for t in fig.legends[0].get_texts())
    plt.close(fig)
    page = report(store, "tinyref", tmp_path / "report").read_text()
    assert 'id="boundaries-table"' in page and "param_rel_change" in page


@pytest.mark.heavy
def test_refine_on_s3_keeps_the_journal_in_the_store(s3_store, tmp_path):  # noqa: F811
    """On an object store the journal lives in the store (a copy per batch): a second
    refine, starting from a fresh local copy, goes on from the first one's trials."""
    from phasesweep.pipeline.refine._refine import plan_refinement

    syn.make_parent(s3_store)
    log = str(tmp_path / "trained.log")
    assert syn.run(s3_store.uri, log, budget=6).trained == 6
    child = child_name("synth", "final_train_loss")
    assert s3_store.fs.exists(f"{s3_store.root}/refine/sweep={child}/journal.log")
    p = plan_refinement(s3_store, "synth", "final_train_loss", syn.LEVEL)
    with p.study() as (study, *_):
        assert Counter(t.state for t in study.get_trials()) == {TrialState.COMPLETE: 3}
    assert syn.run(s3_store.uri, log).trained == 10
    trained = syn.trained(log)
    assert len(trained) == len(set(trained)) == 16
    _check_boundaries(s3_store)


def test_cli_refine_trains_its_batches_on_ray(tmp_path, phasesweep_cli, shared_ray):
    """The command's default path: every batch is a Ray Tune run of ensemble chunks."""
    from phasesweep.pipeline.grid import expand, make_chunks
    from phasesweep.pipeline.run._trial import train_and_store
    from phasesweep.pipeline.spec import validate_spec

    raw = dict(TINY_REAL, grid={"width": [8], "init_scale": [0.1, 1.0], "seed": [0, 1]})
    store = Store.open(str(tmp_path / "store"))
    store.write_spec("tinyref", yaml.safe_dump(raw))
    spec = validate_spec(raw)
    for c in make_chunks(expand(spec), spec):
        train_and_store(store.uri, "tinyref", c, "cpu")
    args = ["refine", "tinyref", "--metric", "param_rel_change", "--level", "0.3"]
    proc = phasesweep_cli([*args, "--tol", "0.3", "--store", store.uri, "--address", shared_ray])
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert '{"width": 8}' in out and "True" in out
    child = child_name("tinyref", "param_rel_change")
    _, rows = run_query(store, f"SELECT count(*), count(node_id) FROM runs WHERE sweep = '{child}'")
    n, on_ray = rows[0]
    assert n == 4 and on_ray == n  # two bisections of one decade to <= 0.3, two seeds; on Ray


def test_benchmark_design_meets_its_run_target_and_fits_a_known_exponent(monkeypatch):
    """The full benchmark's grids (no training): refine's runs when every line bisects
    its coarse decade down to the dense spacing are <= 10 % of the dense grid's; the
    exponent fit recovers a known power law."""
    from phasesweep.pipeline.grid import expand
    from phasesweep.pipeline.spec import validate_spec

    monkeypatch.syspath_prepend(str(HERE.parent))
    from benchmarks import refine_bench as rb

    s = rb.MODES["full"]
    dense = len(expand(validate_spec(rb.spec("dense", s, s.dense))))
    coarse = len(expand(validate_spec(rb.spec("coarse", s, s.coarse))))
    delta = (s.high - s.low) / (s.dense - 1)
    decade = (s.high - s.low) / (s.coarse - 1)
    bisections = math.ceil(math.log2(decade / delta))
    lines = len(s.widths) * s.seeds
    assert dense == s.dense * lines and coarse + bisections * lines <= 0.10 * dense
    w = [64, 128, 256, 512, 1024]
    e = rb.exponent(w, [0.3 * (x / 64) ** -0.25 * (1 + 0.01 * (-1) ** i) for i, x in enumerate(w)])
    assert e["ci_low"] < -0.25 < e["ci_high"] and abs(e["slope"] + 0.25) < 0.02
