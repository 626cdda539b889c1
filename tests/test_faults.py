"""Faults done for real: another Ray on the machine, unreachable clusters, concurrent
launches, SIGKILL and SIGINT mid-chunk. After each, every grid point is stored exactly
once with complete trajectories, counted in the raw Parquet files (not the views)."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import torch
import trial_faults
from phasesweep.pipeline.grid import expand, group_tag
from phasesweep.pipeline.run._progress import LINE_EVERY_ENV
from phasesweep.pipeline.run._standing import running_from
from phasesweep.pipeline.spec import load_spec_and_raw
from phasesweep.storage.schema import log_steps, to_table
from trial_faults import HOLD_ENV

#: Subprocess timeouts: Ray starts slowly on a loaded machine.
TIMEOUT = 600

pytestmark = pytest.mark.ray


def _raw(store: Path, table: str, sweep: str):
    """Every row of ``table``'s files for ``sweep``, duplicates kept (no views); the table's
    columns with no rows while its folder has no file yet (a commit creates the folder
    before it renames the file in)."""
    files = sorted((store / table / f"sweep={sweep}").glob("*.parquet"))
    if not files:
        return to_table(table, {}, 0).to_pandas()
    return ds.dataset([str(f) for f in files], format="parquet").to_table().to_pandas()


def assert_each_point_once(store: Path, spec: Path, overrides=()) -> None:
    """Raw ``runs``: one completed row per grid point, no other rows; raw trajectories and
    layers: every logged step (and layer) of every point exactly once."""
    sweep, _ = load_spec_and_raw(spec, list(overrides))
    points = expand(sweep)
    runs = _raw(store, "runs", sweep.name)
    assert Counter(runs.run_id) == {p.run_id: 1 for p in points}
    assert set(runs.status) == {"completed"}
    n_log = len(log_steps(sweep.train.steps, sweep.train.log_points))
    traj = _raw(store, "trajectories", sweep.name)
    assert Counter(traj.run_id) == {p.run_id: n_log for p in points}
    assert not traj.duplicated(["run_id", "step"]).any()
    layers = _raw(store, "layers", sweep.name)
    assert Counter(layers.run_id) == {p.run_id: n_log * sweep.model.depth for p in points}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_bin() -> str:
    return str(Path(sys.executable).with_name("ray"))


@pytest.mark.process
def test_embedded_run_never_joins_a_cluster_started_on_the_machine(
    tmp_path, tiny_spec, phasesweep_cli, short_tmp
):
    env = dict(os.environ, TMPDIR=str(short_tmp), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    port = _free_port()
    head = subprocess.Popen(
        [_ray_bin(), "start", "--head", "--block", f"--port={port}"]
        + ["--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=false"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # `ray start` leaves its address where ray.init(address=None) looks for one
        current = short_tmp / "ray" / "ray_current_cluster"
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and not current.exists():
            time.sleep(0.5)
        assert current.exists() and str(port) in current.read_text()
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import ray; ray.init(address='auto', log_to_driver=False); "
                "print(*[n['NodeID'] for n in ray.nodes()])",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        head_nodes = set(probe.stdout.split())
        assert len(head_nodes) == 1, probe.stderr

        store = tmp_path / "store"
        spec = tiny_spec({"grid.seed": [0]})
        proc = phasesweep_cli(
            ["run", str(spec), "--store", str(store), "--no-progress"],
            env_extra={"TMPDIR": str(short_tmp)},
        )
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err
        assert_each_point_once(store, spec)
        nodes = set(_raw(store, "runs", "tiny").node_id)
        assert nodes and not nodes & head_nodes  # trained on a node of its own Ray
    finally:
        head.terminate()  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()


def test_unreachable_or_malformed_address_exits_2_and_writes_nothing(
    tmp_path, tiny_spec, phasesweep_cli
):
    store = tmp_path / "store"
    spec = tiny_spec()
    cases = [
        (["--address", "127.0.0.1:1"], {}, "cannot reach"),
        (["--address", "not a host"], {}, "is not auto, local, standing, HOST:PORT"),
        ([], {"RAY_ADDRESS": "127.0.0.1:1"}, "cannot reach"),  # as `ray job submit` names it
    ]
    for args, env, why in cases:
        started = time.monotonic()
        proc = phasesweep_cli(["run", str(spec), "--store", str(store), *args], env_extra=env)
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "--address" in lines[0] and why in lines[0], err
        assert time.monotonic() - started < 120  # no hang (a generous bound)
        assert not store.exists()


def test_concurrent_launches_train_every_point_once(tmp_path, tiny_spec, phasesweep_cli, short_tmp):
    store = tmp_path / "store"
    spec = tiny_spec({"train.steps": 1500, "execution.max_chunk_size": 2})
    args = ["run", str(spec), "--store", str(store), "--no-progress"]
    env = {"TMPDIR": str(short_tmp)}
    procs = [phasesweep_cli(args, env_extra=env) for _ in range(2)]
    errs = [p.communicate(timeout=TIMEOUT)[1] for p in procs]
    for p, err in zip(procs, errs):
        assert p.returncode == 0, err
    trained = [int(re.search(r"trained (\d+)", err).group(1)) for err in errs]
    assert sum(trained) == 6, errs  # each point trained by exactly one of them
    assert_each_point_once(store, spec)
    assert not list((store / "claims").rglob("r*")) and not list((store / "claims").rglob("*.json"))
    assert not (short_tmp / f"phasesweep-tune-{os.getuid()}").exists()


def _wait_for(predicate, what: str) -> None:
    deadline = time.time() + TIMEOUT
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _checkpoints(store: Path) -> list[Path]:
    return sorted((store / "checkpoints").rglob("*.pt"))


def _checkpoint_step(path: Path) -> int:
    return torch.load(io.BytesIO(path.read_bytes()), weights_only=True)["k"]


#: Chunks that train for seconds (10³-10⁴ steps/s: 2-20 s), checkpointed every half second,
#: so a chunk checkpoints well before it ends however fast the machine (the hold then keeps
#: it mid-chunk); one CPU per trial, so two trials at once on a 2-core machine.
LONG_CHUNKS = {
    "train.steps": 20000,
    "model.width": 32,
    "data.n_train": 32,
    "execution.commit_every_seconds": 0.5,
}


def _held(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """``env`` plus the hold hook: each trial waits after its first checkpoint (while the
    file exists), so the test sees several chunks mid-training at once however loaded the
    machine is (else a slow second trial may start only after the first chunk ended)."""
    hold = tmp_path / "hold"
    hold.touch()
    return {**env, **trial_faults.env(**{HOLD_ENV: str(hold)})}


def _started(store: Path, n: int) -> bool:
    """``n`` chunks have checkpointed past their first steps."""
    found = _checkpoints(store)
    try:
        return len(found) >= n and all(_checkpoint_step(p) > 0 for p in found)
    except FileNotFoundError:  # committed and removed meanwhile
        return False


def test_sigkill_mid_chunk_then_relaunch_resumes_and_stores_every_point_once(
    tmp_path, tiny_spec, phasesweep_cli, short_tmp
):
    store = tmp_path / "store"
    spec = tiny_spec(LONG_CHUNKS)  # two chunks of three points
    args = ["run", str(spec), "--store", str(store), "--cpus-per-trial", "1"]
    env = {"TMPDIR": str(short_tmp)}
    lines = {**_held(env, tmp_path), LINE_EVERY_ENV: "1"}  # a progress line every second
    proc = phasesweep_cli(args, env_extra=lines, start_new_session=True)
    shown: list[str] = []  # its progress lines, read as they come

    def read() -> None:
        for line in proc.stderr:
            shown.append(line)

    reader = threading.Thread(target=read)
    reader.start()
    # progress moves during the chunks: no point done yet, member-steps and a rate shown
    # (reports from the held trials give a rate RATE_AFTER s after the first)
    during = re.compile(
        r"0/6 points .* ([1-9]\S*)/120k member-steps \[.*, [0-9.]+k? member-steps/s\]"
    )
    _wait_for(
        lambda: _started(store, 2) and any(during.search(s) for s in list(shown)),
        "checkpoints of both chunks and a progress line with a rate",
    )
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join()
    assert len(_checkpoints(store)) == 2
    assert all(0 < _checkpoint_step(p) < LONG_CHUNKS["train.steps"] for p in _checkpoints(store))
    assert not (store / "runs").exists()
    tune_dirs = short_tmp / f"phasesweep-tune-{os.getuid()}"
    assert list(tune_dirs.iterdir())  # the killed launch's Tune folder is left behind ...

    again = phasesweep_cli([*args, "--no-progress"], env_extra=env)
    _, err = again.communicate(timeout=TIMEOUT)
    assert again.returncode == 0, err
    assert "trained 6 (0 diverged, 6 resumed from checkpoints)" in err
    assert_each_point_once(store, spec)
    assert not _checkpoints(store)
    assert not tune_dirs.exists()  # ... and removed by the next launch


def _two_chunks_mid_training(tmp_path, tiny_spec, phasesweep_cli, short_tmp):
    """A launch (a session of its own) of three chunks of two points, two trials at a
    time, once two chunks have checkpointed mid-training (the third is never tried);
    returns (its process, the store, the spec, its arguments, its environment)."""
    store = tmp_path / "store"
    spec = tiny_spec({**LONG_CHUNKS, "execution.max_chunk_size": 2})
    args = ["run", str(spec), "--store", str(store), "--cpus-per-trial", "1", "--no-progress"]
    env = {"TMPDIR": str(short_tmp)}
    proc = phasesweep_cli(args, env_extra=_held(env, tmp_path), start_new_session=True)
    _wait_for(lambda: _started(store, 2), "checkpoints of two chunks")
    return proc, store, spec, args, env


@pytest.mark.parametrize(
    "stop,to_group",
    [
        (signal.SIGINT, True),  # Ctrl-C, as a terminal sends it: to the whole process group
        (signal.SIGTERM, False),  # kill PID, timeout --foreground, Kubernetes: the launch alone
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stop_signal_stops_cleanly_nothing_failed_then_relaunch_completes(
    tmp_path, tiny_spec, phasesweep_cli, short_tmp, stop, to_group
):
    """The running chunks checkpoint at the stop (not only every commit_every_seconds),
    nothing is marked failed, the exit status is 128 + the signal's number, and the
    relaunch resumes both chunks."""
    proc, store, spec, args, env = _two_chunks_mid_training(
        tmp_path, tiny_spec, phasesweep_cli, short_tmp
    )
    if to_group:
        os.killpg(proc.pid, stop)
    else:
        proc.send_signal(stop)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 128 + stop, err
    assert f"interrupted ({stop.name})" in err and "Traceback" not in err
    assert not (store / "runs").exists()  # nothing finished, nothing marked failed
    assert len(_checkpoints(store)) == 2  # the running chunks' work is kept
    assert not list((store / "claims").rglob("stop-*"))  # the stop marker is gone

    again = phasesweep_cli(args, env_extra=env)
    _, err = again.communicate(timeout=TIMEOUT)
    assert again.returncode == 0, err
    assert "(0 diverged, 4 resumed from checkpoints)" in err
    assert_each_point_once(store, spec)
    assert not _checkpoints(store)


def test_sigterm_to_the_whole_group_stops_the_launch_at_once_with_its_embedded_ray(
    tmp_path, tiny_spec, phasesweep_cli, short_tmp
):
    """SIGTERM to every process of the launch, as a batch scheduler's stop or ``kill -TERM
    -PGID`` sends it: Ray's own processes end too, so the trials cannot checkpoint. The
    launch does not wait for them (Ray's client would block it for a minute, then abort
    it, leaving the stop marker and Ray's folder): it exits 143 at once, leaving no stop
    marker, no Ray folder and no Ray process, and the relaunch trains every point once."""
    proc, store, spec, args, env = _two_chunks_mid_training(
        tmp_path, tiny_spec, phasesweep_cli, short_tmp
    )
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 143, err
    assert "interrupted (SIGTERM), which stopped the embedded Ray too" in err, err
    assert "Traceback" not in err and "GCS" not in err
    assert not (store / "runs").exists()
    assert not list((store / "claims").rglob("stop-*"))
    assert not list(short_tmp.glob("ps-ray-*"))
    assert not running_from(str(short_tmp))  # no process of that Ray's

    again = phasesweep_cli(args, env_extra=env)
    _, err = again.communicate(timeout=TIMEOUT)
    assert again.returncode == 0, err
    assert_each_point_once(store, spec)


def test_a_trial_trains_only_the_points_it_claims_and_skips_stored_ones(tmp_path, tiny_spec):
    from phasesweep.pipeline.grid import Chunk
    from phasesweep.pipeline.run._trial import train_and_store
    from phasesweep.storage import Store
    from phasesweep.storage._claims import Claims

    store = Store.open(str(tmp_path / "store"))
    spec = tiny_spec()
    points = tuple(expand(load_spec_and_raw(spec)[0]))
    chunk = Chunk("c", points)
    group = group_tag(points[0].config)  # claims are per group of shapes
    other, _ = Claims(store, "tiny", group=group).acquire([p.run_id for p in points[:2]])
    first = train_and_store(store.uri, "tiny", chunk, "cpu")
    assert (first["points"], first["busy"], first["skipped"]) == (4, 2, 0)
    assert set(_raw(Path(store.root), "runs", "tiny").run_id) == {p.run_id for p in points[2:]}
    other.release()  # ... which ended without storing them
    second = train_and_store(store.uri, "tiny", chunk, "cpu")
    assert (second["points"], second["busy"], second["skipped"]) == (2, 0, 4)
    assert_each_point_once(Path(store.root), spec)


def test_a_launch_waits_for_points_another_holds_and_trains_them_when_it_lets_go(
    tmp_path, tiny_spec, phasesweep_cli, shared_ray
):
    from phasesweep.storage import Store
    from phasesweep.storage._claims import Claims, Renewer

    store = tmp_path / "store"
    spec = tiny_spec()
    points = expand(load_spec_and_raw(spec)[0])
    held = {p.run_id for p in points[:2]}
    claims = Claims(Store.open(str(store)), "tiny", group=group_tag(points[0].config))
    lease, _ = claims.acquire(held)  # a live other launch
    with Renewer(lease):
        proc = phasesweep_cli(
            ["run", str(spec), "--store", str(store), "--no-progress", "--address", shared_ray]
        )
        _wait_for(
            lambda: (store / "runs").exists() and len(set(_raw(store, "runs", "tiny").run_id)) == 4,
            "the free points",
        )
        time.sleep(5)
        assert proc.poll() is None  # still waiting for the held points
        assert not held & set(_raw(store, "runs", "tiny").run_id)
    lease.release()  # the other launch ends without storing them: this one trains them
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    assert "trained 6" in err
    assert_each_point_once(store, spec)
