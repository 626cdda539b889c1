"""The standing local Ray (``run --address standing``): started on demand, reused by the
next launch, stopped by ``phasesweep standing stop`` or after idling; the embedded
default never uses it. Real processes throughout."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from phasesweep.pipeline.run import _standing
from phasesweep.storage import run_query

pytestmark = [pytest.mark.ray, pytest.mark.process]


@pytest.fixture
def standing_dir(monkeypatch, short_tmp):
    """A private folder for the standing instance (short: Ray's socket paths live in it);
    whatever a test leaves running there is stopped afterwards."""
    monkeypatch.setenv("PHASESWEEP_STANDING_DIR", str(short_tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield short_tmp
    _standing.stop()


def _run(phasesweep_cli, spec: Path, store: Path, *args: str, env: dict | None = None):
    proc = phasesweep_cli(
        ["run", str(spec), "--store", str(store), "--no-progress", *args], env_extra=env
    )
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out + err


def _node_ids(store: Path, sweep: str) -> set[str]:
    rows = run_query(store, f"SELECT DISTINCT node_id FROM runs WHERE sweep = '{sweep}'")[1]
    return {r[0] for r in rows}


def test_launches_share_one_standing_ray_until_stop(
    standing_dir, tmp_path, tiny_spec, phasesweep_cli
):
    store = tmp_path / "store"
    nodes = {}
    for name in ("first", "second"):
        spec = tiny_spec({"name": name, "train.steps": 20})
        rc, out = _run(phasesweep_cli, spec, store, "--address", "standing")
        assert rc == 0, out
        assert "without token authentication" not in out
        info = json.loads((standing_dir / "instance.json").read_text())
        assert info["auth"] == "token"  # tests/test_security.py: no one else joins it
        nodes[name] = (info["pid"], _node_ids(store, name))
    # the second launch joined the instance the first one started, and it is still up
    assert nodes["first"] == nodes["second"]
    leader = nodes["first"][0]
    assert _standing.session_pids(leader)
    # the embedded default ignores it: a private Ray, another node
    spec = tiny_spec({"name": "embedded", "train.steps": 20})
    rc, out = _run(phasesweep_cli, spec, store)
    assert rc == 0, out
    assert _node_ids(store, "embedded").isdisjoint(nodes["first"][1])
    # every point of the three sweeps stored once
    counts = run_query(store, "SELECT count(*), count(DISTINCT run_id) FROM runs")[1]
    assert counts[0][0] == counts[0][1] > 0

    status = phasesweep_cli(["standing", "status"]).communicate(timeout=60)[0]
    assert status.startswith("running at 127.0.0.1:")
    proc = phasesweep_cli(["standing", "stop"])
    assert proc.communicate(timeout=120)[0].strip() == "stopped"
    assert proc.returncode == 0
    assert _standing.session_pids(leader) == []
    assert not (standing_dir / "instance.json").exists()
    status = phasesweep_cli(["standing", "status"]).communicate(timeout=60)[0]
    assert status.strip() == "no standing Ray is running"


def test_an_idle_standing_ray_stops_itself(standing_dir, tmp_path, tiny_spec, phasesweep_cli):
    """(Started without a token, as the user's environment asks: the launch says so once.)"""
    spec = tiny_spec({"name": "idle", "train.steps": 20})
    env = {_standing.IDLE_ENV: "0.05", "RAY_AUTH_MODE": "disabled"}  # 3 s without a launch
    rc, out = _run(phasesweep_cli, spec, tmp_path / "store", "--address", "standing", env=env)
    assert rc == 0, out
    assert out.count("runs without token authentication") == 1, out
    assert "started with RAY_AUTH_MODE=disabled" in out
    info = json.loads((standing_dir / "instance.json").read_text())
    assert info["auth"] == "disabled" and not (standing_dir / "auth_token").exists()
    leader = info["pid"]
    deadline = time.monotonic() + 300
    while _standing.session_pids(leader) and time.monotonic() < deadline:
        time.sleep(1)
    assert _standing.session_pids(leader) == []
    assert not (standing_dir / "instance.json").exists()
    assert _standing.address() is None


def test_a_launch_holds_it_while_connected(standing_dir):
    """The watchdog's test of "in use": it cannot take the lock while a launch holds it."""
    import fcntl
    import subprocess
    import sys

    standing_dir.mkdir(exist_ok=True)
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "from phasesweep.pipeline.run import _standing; import sys, time; "
            "_standing.hold(); print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = os.open(standing_dir / "in-use", os.O_RDWR)
        with pytest.raises(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.kill()
        holder.wait(timeout=60)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the process
        os.close(fd)
    finally:
        holder.kill()


def test_a_stale_record_is_not_joined(standing_dir):
    """instance.json of a dead instance (its leader gone, nothing on its port) is ignored."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (standing_dir / "instance.json").write_text(
        json.dumps({"address": "127.0.0.1:1", "pid": dead.pid, "temp_dir": ""})
    )
    assert _standing.address() is None


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf", "nan"])
def test_a_bad_idle_time_exits_2_and_writes_nothing(
    standing_dir, tmp_path, tiny_spec, phasesweep_cli, value
):
    store = tmp_path / "store"
    spec = tiny_spec({"name": "bad"})
    rc, out = _run(
        phasesweep_cli, spec, store, "--address", "standing", env={_standing.IDLE_ENV: value}
    )
    assert rc == 2, out
    assert _standing.IDLE_ENV in out and "number > 0" in out
    assert not store.exists() or not any(store.rglob("*.yaml"))
    assert not (standing_dir / "instance.json").exists()


#: A driver that connects as a launch does (ray imported after connect set its environment)
#: and prints the niceness its Ray worker runs at.
_NICENESS_PROBE = (
    "import os, sys; from phasesweep.pipeline.run._ray import connect; "
    "connect(sys.argv[1] or None); import ray; "
    "print(ray.get(ray.remote(lambda: os.nice(0)).remote()))"
)


def _worker_niceness(address: str, **env: str) -> int:
    import subprocess
    import sys

    folder = tempfile.mkdtemp(prefix="pn", dir="/tmp")  # short: Ray's socket paths
    try:
        probe = subprocess.run(
            [sys.executable, "-c", _NICENESS_PROBE, address],
            env={**os.environ, "TMPDIR": folder, **env},
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert probe.returncode == 0, probe.stderr
    return int(probe.stdout.split()[-1])


def test_trials_of_a_local_ray_run_at_normal_priority(standing_dir):
    """Ray's default worker niceness (15) starves trials beside any busy process; the local
    Rays this tool starts run them at 0, unless the user's environment says otherwise."""
    assert _standing.LOCAL_DEFAULTS["RAY_worker_niceness"] == "0"
    assert _worker_niceness("") == 0
    assert _worker_niceness("", RAY_worker_niceness="12") == 12
    assert _worker_niceness("standing") == 0
