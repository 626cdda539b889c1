"""The command line: bad input, dry run, run/resume/status/query, crash and retry behaviour."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from phasesweep.storage import Store, run_query

from phasesweep._cli import main

BAD_SPECS = [
    ("model.foo", 3, "model.foo", "unknown key"),
    ("model.width", "abc", "model.width", "'abc'"),
    ("model.width", -3, "model.width", "-3"),
    ("model.activation", "swish", "model.activation", "'swish'"),
    ("grid.width", [], "grid.width", "empty grid axis"),
    ("grid.width", [16, -4], "grid.width", "-4"),
    ("grid.nonsense", [1, 2], "grid.nonsense", "unknown axis"),
    ("name", "Bad Name", "name", "'Bad Name'"),
    ("train.lr", "fast", "train.lr", "'fast'"),
    ("data.kind", "imagenet", "data.kind", "'imagenet'"),
    ("grid.init_scale", {"logspace": [-3, 1]}, "grid.init_scale", "logspace"),
]


@pytest.mark.parametrize("key,value,named,shown", BAD_SPECS)
def test_bad_spec_exits_2_names_key_and_value_writes_nothing(
    tmp_path, capsys, tiny_spec, key, value, named, shown
):
    store = tmp_path / "store"
    spec = tiny_spec({key: value})
    assert main(["run", str(spec), "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert named in err and shown in err, err
    assert not store.exists()


def test_malformed_yaml_and_bad_override(tmp_path, capsys, tiny_spec):
    store = tmp_path / "store"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {depth: [1,\n")
    assert main(["run", str(bad), "--store", str(store)]) == 2
    assert "malformed YAML" in capsys.readouterr().err
    spec = tiny_spec()
    assert main(["run", str(spec), "--store", str(store), "--set", "train.steps"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["run", str(spec), "--store", str(store), "--set", "train.steps=-1"]) == 2
    err = capsys.readouterr().err
    assert "train.steps" in err and "-1" in err
    assert main(["run", str(spec), "--store", str(store), "--cpus-per-trial", "0"]) == 2
    assert main(["run", str(spec), "--store", "ftp://host/x"]) == 2
    assert "--store = 'ftp://host/x'" in capsys.readouterr().err
    assert not store.exists()


def test_dry_run_reports_points_chunks_memory_and_work(tmp_path, capsys, tiny_spec):
    store = tmp_path / "store"
    spec = tiny_spec()
    assert (
        main(["run", str(spec), "--store", str(store), "--dry-run", "--set", "grid.seed=[0,1,2,3]"])
        == 0
    )
    out = capsys.readouterr().out
    assert "8 points" in out and "in 3 chunks" in out
    assert "MiB" in out and "TFLOP" in out
    assert not store.exists()


def test_set_parses_exponent_floats_and_dotted_grid_axes(tmp_path, capsys, tiny_spec):
    spec = tiny_spec()
    args = ["run", str(spec), "--store", str(tmp_path / "s"), "--dry-run"]
    assert (
        main([*args, "--set", "model.init_scale=1e-3", "--set", "grid.init_scale=[1e-3, 2.5E+1]"])
        == 0
    )
    assert main([*args, "--set", "grid.data.noise_sigma=[0, 1e-2]"]) == 0
    assert "12 points" in capsys.readouterr().out  # 2 init scales x 3 seeds x 2 sigmas


def test_relaunch_with_a_changed_spec_is_refused_with_a_diff_unless_it_extends(
    tmp_path, capsys, tiny_spec
):
    store = tmp_path / "store"
    spec = tiny_spec()
    Store.open(str(store)).write_spec("tiny", spec.read_text())  # as a first launch stores it
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    base = ["run", str(spec), "--store", str(store), "--dry-run"]
    assert main(base) == 0  # the same spec: a relaunch
    assert main([*base, "--set", "execution.max_chunk_size=2"]) == 0  # how, not what, it runs
    assert "6 points" in capsys.readouterr().out
    # a part of the stored grid, with or without --extend: an axis dropped counts as its
    # base value (train.seed 0, model.width 8)
    for args in (["--set", "grid.seed=[0,1]"], ["--set", "grid.seed=[2]", "--extend"]):
        assert main([*base, *args]) == 0
    assert main([*base, "--set", "grid={init_scale: [1.0]}"]) == 0
    assert main([*base, "--set", "grid.width=[8]"]) == 0
    refused = [
        (["--set", "train.steps=40"], "train.steps: 20 → 40", "--set name=tiny_2"),
        (["--set", "train.steps=40", "--extend"], "train.steps: 20 → 40", "--set name=tiny_2"),
        (["--set", "grid.seed=[0,1,2,3]"], "grid.seed: [0, 1, 2] → [0, 1, 2, 3]", "--extend"),
        (["--set", "grid.seed=[0,7]"], "grid.seed: [0, 1, 2] → [0, 7]", "--extend"),
        (["--set", "grid.width=[8,16]"], "grid.width: (absent) → [8, 16]", "--extend"),
    ]
    for args, diff, hint in refused:
        assert main([*base, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and diff in err and hint in err, err
        # the advice is a command that works
        advice = ["--extend"] if hint == "--extend" else ["--set", "name=tiny_2"]
        assert main([*base, *args, *advice]) == 0, capsys.readouterr().err
    # grid values may be added (spelled any way) with --extend
    assert main([*base, "--set", "grid.seed={range: [0, 5]}", "--extend"]) == 0
    assert "10 points, 0 already stored" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before


def test_the_stored_grid_covers_every_stored_point_after_a_relaunch(tmp_path, tiny_spec):
    """What ``status`` counts against: the stored spec's grid, after a relaunch of a part
    of it (unchanged), after an extension that holds it (the new grid) and after one that
    adds to some axes only (each axis takes the values of both)."""
    from phasesweep.pipeline.grid import expand
    from phasesweep.pipeline.run._launch import plan_sweep
    from phasesweep.pipeline.spec import parse_yaml, validate_spec

    store = Store.open(str(tmp_path / "store"))
    spec = tiny_spec({"grid": {"init_scale": {"logspace": [-1, 0, 2]}, "seed": [0, 1, 2]}})
    store.write_spec("tiny", spec.read_text())

    def stored_after(*overrides: str, extend: bool = False) -> dict:
        return plan_sweep(spec, store, overrides=overrides, extend=extend).raw["grid"]

    def ids(grid: dict) -> set[str]:
        return {
            p.run_id for p in expand(validate_spec({**parse_yaml(spec.read_text()), "grid": grid}))
        }

    whole = parse_yaml(spec.read_text())["grid"]
    assert stored_after("grid.seed=[1]") == whole  # a part: the stored grid stays whole
    assert stored_after("grid.init_scale=[1.0]", "grid.seed=[2, 0]", extend=True) == whole
    assert stored_after("grid.seed=[0, 1, 2, 3]", extend=True)["seed"] == [0, 1, 2, 3]
    mixed = stored_after("grid.seed=[5]", "grid.width=[16]", extend=True)
    assert mixed == {**whole, "seed": [0, 1, 2, 5], "width": [8, 16]}  # forms kept
    # it holds every point of the stored grid and of the launch, and nothing else
    launched = {"init_scale": whole["init_scale"], "seed": [5], "width": [16]}
    assert ids(mixed) >= ids(whole) | ids(launched)
    assert len(ids(mixed)) == 2 * 4 * 2


@pytest.fixture(scope="module")
def ray_local():
    import ray

    yield
    ray.shutdown()


def _count(store, sql):
    return run_query(store, sql)[1][0][0]


@pytest.mark.ray
def test_run_resume_status_query(tmp_path, capsys, ray_local, tiny_spec):
    store = tmp_path / "store"
    spec = tiny_spec()
    assert main(["run", str(spec), "--store", str(store), "--no-progress"]) == 0
    assert "skipping 0" in capsys.readouterr().err
    assert _count(store, "SELECT count(*) FROM runs WHERE status = 'completed'") == 6
    assert _count(store, "SELECT count(DISTINCT step) FROM trajectories") == 5
    # relaunch: everything skipped; a grown grid trains only the new points
    assert main(["run", str(spec), "--store", str(store), "--no-progress"]) == 0
    assert "skipping 6 already stored; training 0" in capsys.readouterr().err
    grown = [
        "run",
        str(spec),
        "--store",
        str(store),
        "--no-progress",
        "--set",
        "grid.seed=[0,1,2,3]",
    ]
    assert main(grown) == 2  # a changed grid needs --extend
    assert "grid.seed: [0, 1, 2] → [0, 1, 2, 3]" in capsys.readouterr().err
    assert main([*grown, "--extend"]) == 0
    assert "skipping 6 already stored; training 2" in capsys.readouterr().err
    assert main([*grown[:-1], "grid.seed=[3]"]) == 0  # a part of the stored grid
    assert "2 points; skipping 2 already stored; training 0" in capsys.readouterr().err
    assert _count(store, "SELECT count(*) FROM runs") == 8
    assert _count(store, "SELECT count(DISTINCT run_id) FROM runs") == 8
    assert _count(store, "SELECT count(*) - count(DISTINCT (run_id, step)) FROM trajectories") == 0
    # status and query
    assert main(["status", "tiny", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "completed" in out and "8 of 8 points done" in out
    assert (
        main(["query", "SELECT count(*) AS n FROM runs", "--store", str(store), "--format", "json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == [{"n": 8}]
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    assert main(["query", "DELETE FROM runs", "--store", str(store)]) == 2
    assert main(["query", f"COPY runs TO '{store}/runs/x.parquet'", "--store", str(store)]) == 2
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before


@pytest.mark.ray
def test_the_command_leaves_ray_before_the_interpreter_exits(
    tmp_path, monkeypatch, capsys, ray_local, tiny_spec
):
    """``phasesweep`` (the console entry) disconnects from the Ray its launch used before it
    exits, not in Ray's exit hook (which first sleeps half a second); a command that never
    imported Ray does not import it to check."""
    import sys

    import ray

    from phasesweep._cli import console

    store = tmp_path / "store"
    argv = ["phasesweep", "run", str(tiny_spec()), "--store", str(store), "--no-progress"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        console()
    assert e.value.code == 0 and not ray.is_initialized()
    assert _count(store, "SELECT count(*) FROM runs WHERE status = 'completed'") == 6
    capsys.readouterr()


@pytest.mark.ray
def test_crash_midway_loses_and_duplicates_nothing(tmp_path, tiny_spec, phasesweep_cli, short_tmp):
    """SIGKILL the launcher (and its Ray) after some chunks committed; relaunch finishes the rest."""
    store = tmp_path / "store"
    spec = tiny_spec({"execution.max_chunk_size": 1, "train.steps": 3000})
    proc = phasesweep_cli(
        ["run", str(spec), "--store", str(store), "--no-progress"],
        env_extra={"TMPDIR": str(short_tmp)},
        start_new_session=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and len(list((store / "runs").rglob("*.parquet"))) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    committed = len(Store.open(str(store)).done_run_ids("tiny"))
    assert 2 <= committed < 6
    done = phasesweep_cli(["run", str(spec), "--store", str(store), "--no-progress"])
    _, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    # Ray workers orphaned by the kill may still commit a chunk they were finishing
    skipped = int(re.search(r"skipping (\d+) already stored", err).group(1))
    assert committed <= skipped < 6
    assert _count(store, "SELECT count(*) FROM runs") == 6
    assert _count(store, "SELECT count(DISTINCT run_id) FROM runs") == 6
    assert _count(store, "SELECT count(*) - count(DISTINCT (run_id, step)) FROM trajectories") == 0
    assert _count(store, "SELECT count(DISTINCT run_id) FROM trajectories") == 6
    assert not list(store.rglob("*.tmp")) or all(
        p.name.startswith(".") for p in store.rglob("*.tmp")
    )


@pytest.mark.ray
def test_failed_points_exit_1_then_relaunch_completes(
    tmp_path, tiny_spec, phasesweep_cli, short_tmp
):
    store = tmp_path / "store"
    spec = tiny_spec()
    import trial_faults
    from phasesweep.pipeline.grid import expand
    from phasesweep.pipeline.spec import load_spec_and_raw

    victim = expand(load_spec_and_raw(spec)[0])[0].run_id
    proc = phasesweep_cli(
        [
            "run",
            str(spec),
            "--store",
            str(store),
            "--no-progress",
            "--max-retries",
            "1",
            "--cpus-per-trial",
            "2",
        ],
        env_extra={**trial_faults.env(PHASESWEEP_INJECT_FAILURE=victim), "TMPDIR": str(short_tmp)},
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "failed 3" in err and "injected a failure" in err
    names, rows = run_query(
        store, "SELECT status, count(*) FROM runs GROUP BY status ORDER BY status"
    )
    assert rows == [("completed", 3), ("failed", 3)]
    assert (
        _count(
            store,
            f"SELECT count(*) FROM runs WHERE run_id = '{victim}' AND error LIKE '%injected%'",
        )
        == 1
    )
    # Tune's experiment directory does not outlive the run
    assert not [p for p in short_tmp.iterdir() if p.name.startswith("phasesweep-tune-")]
    # threads per trial = CPUs Ray gave it
    assert _count(store, "SELECT min(torch_threads) FROM runs WHERE status = 'completed'") == 2

    again = phasesweep_cli(["run", str(spec), "--store", str(store), "--no-progress"])
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert "skipping 3 already stored; training 3" in err
    names, rows = run_query(store, "SELECT status, count(*) FROM runs GROUP BY status")
    assert rows == [("completed", 6)]
    assert _count(store, "SELECT min(torch_threads) FROM runs") == 1


_SUFFIX = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


def _per_second(rate: str) -> float:
    """A tqdm rate such as ``"52.3k"`` in member-steps per second."""
    return float(rate[:-1]) * _SUFFIX[rate[-1]] if rate[-1] in _SUFFIX else float(rate)


@pytest.mark.ray
def test_progress_piped_to_a_file_is_plain_lines_with_points_rate_and_eta(
    tmp_path, tiny_spec, phasesweep_cli
):
    """Off a terminal: a line now and then ($PHASESWEEP_PROGRESS_EVERY seconds), never a
    carriage return; lines during the chunks show member-steps moving, the rate and the
    ETA ("?" before a rate is measured); the last says what was done in what time.

    A rate shows once reports have come for RATE_AFTER seconds, so the chunk must train
    for longer than that; how many steps that takes depends on the machine. The work is
    sized from the rate each run measures: a run that ended before a rate showed is run
    again with enough steps to last, at its measured rate, twice the time a rate needs."""
    from phasesweep.pipeline.run._progress import RATE_AFTER
    from phasesweep.pipeline.run._trial import PROGRESS_EVERY
    from tqdm import tqdm

    needed = 2 * (RATE_AFTER + 2 * PROGRESS_EVERY + 1)  # seconds of training to ask for
    steps = ran = 20000
    for attempt in range(4):
        spec = tiny_spec({"train.steps": steps})
        proc = phasesweep_cli(
            ["run", str(spec), "--store", str(tmp_path / f"store{attempt}")],
            env_extra={"PHASESWEEP_PROGRESS_EVERY": "1"},
        )
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        assert "\r" not in err
        assert (
            "Configuration for experiment" not in err and "Trial status" not in err
        )  # Tune's tables stay off
        total = tqdm.format_sizeof(6 * steps)
        line = re.compile(
            rf"tiny: (\d)/6 points +\d+% (\S+)/{re.escape(total)} member-steps "
            r"\[\d\d:\d\d<(\?|\d\d:\d\d), (\?|[0-9.]+[kMG]?) member-steps/s\]"
        )
        during = [m.groups() for m in map(line.fullmatch, err.splitlines()) if m]
        assert during, err
        assert all((eta == "?") == (rate == "?") for *_, eta, rate in during)  # no ETA, no rate
        last = re.search(
            rf"^tiny: 6/6 points 100% {re.escape(total)}/{re.escape(total)} member-steps "
            r"in \d\d:\d\d(?:, ([0-9.]+[kMG]?) member-steps/s)?$",
            err,
            re.M,
        )
        assert last, err
        if any(rate != "?" for *_, rate in during):
            assert any(n != "0" and done != "6" for done, n, _, _ in during), err
            assert last.group(1), err  # a rate measured during the run is shown at its end
            return
        # too short for a rate: no second report (< PROGRESS_EVERY s), or a rate at the end
        lasted = 6 * steps / _per_second(last.group(1)) if last.group(1) else PROGRESS_EVERY / 4
        ran, steps = steps, int(steps * max(2.0, needed / lasted))
    pytest.fail(f"no rate shown during a run of {ran} steps per point:\n{err}")


def test_a_folder_that_holds_no_store_is_refused_an_empty_one_is_a_store(
    tmp_path, capsys, tiny_spec
):
    """A mistyped ``--store`` that exists (a folder of specs and notes, as ``sweeps/``) is
    refused by every command with exit 2, naming what it holds, and nothing is written;
    an empty folder is an empty store, and ``run`` may create a store in it."""
    spec = tiny_spec()  # tmp_path holds spec.yaml and nothing else
    (tmp_path / "notes.txt").write_text("not a store\n")
    before = sorted(tmp_path.rglob("*"))
    commands = [
        ["query", "SELECT count(*) FROM runs"],
        ["status"],
        ["analyze", "tiny"],
        ["plot", "tiny"],
        ["report", "tiny"],
        ["verify"],
        ["compact"],
        ["refine", "tiny", "--metric", "param_rel_change", "--level", "0.1"],
        ["run", str(spec)],
        ["run", str(spec), "--dry-run"],
    ]
    for args in commands:
        assert main([*args, "--store", str(tmp_path)]) == 2, args
        err = capsys.readouterr().err
        assert "not a phasesweep store" in err and "notes.txt, spec.yaml" in err, (args, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert sorted(tmp_path.rglob("*")) == before

    empty = tmp_path / "empty"
    empty.mkdir()
    at = ["--store", str(empty)]
    assert main(["query", "SELECT count(*) AS n FROM runs", "--format", "csv", *at]) == 0
    assert capsys.readouterr().out == "n\n0\n"
    assert main(["status", *at]) == 0 and "no runs stored" in capsys.readouterr().out
    assert main(["run", str(spec), "--dry-run", *at]) == 0
    assert list(empty.iterdir()) == []  # a dry run writes nothing
