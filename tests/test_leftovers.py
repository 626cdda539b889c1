"""Nothing of ours is left behind: a launch from the Python API or the command line and
``standing stop`` leave no ``ps-ray-*`` folder in the temporary directory and no process
of the Ray they started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_SPEC

pytestmark = [pytest.mark.ray, pytest.mark.process]


def _ours(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("ps-ray-*"))


def _ray_processes(tmp: Path) -> list[str]:
    """Command lines of the live processes that run from a Ray folder under ``tmp``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp) in text and "ray" in text:
            found.append(text)
    return found


def test_a_launch_from_the_api_leaves_no_ray_folder_or_process(short_tmp, tmp_path):
    """``phasesweep.run`` in a Python process that then exits, not calling
    ``ray.shutdown`` itself: the embedded Ray stops and its private folder goes."""
    script = (
        "import phasesweep, sys\n"
        f"spec = {TINY_SPEC!r}\n"
        "out = phasesweep.run(spec, sys.argv[1], overrides=['train.steps=20'])\n"
        "print('trained', out.trained)\n"
    )
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and "trained 6" in done.stdout, done.stderr
    assert _ours(short_tmp) == []
    assert _ray_processes(short_tmp) == []


def test_a_launch_from_the_cli_and_standing_stop_leave_nothing(
    short_tmp, tmp_path, tiny_spec, phasesweep_cli
):
    """``phasesweep run`` on its embedded Ray, then on the standing one, and ``standing
    stop``: no ``ps-ray-*`` folder and no Ray process left under the TMPDIR."""
    env = {"TMPDIR": str(short_tmp), "PHASESWEEP_STANDING_DIR": str(short_tmp / "st")}
    store = str(tmp_path / "store")
    for name, extra in (("embedded", []), ("standing", ["--address", "standing"])):
        spec = tiny_spec({"name": name, "train.steps": 20})
        proc = phasesweep_cli(["run", str(spec), "--store", store, "--no-progress", *extra], env)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        if name == "embedded":
            assert _ours(short_tmp) == [] and _ray_processes(short_tmp) == []
    assert len(_ours(short_tmp)) == 1  # the standing Ray's, while it runs
    try:
        proc = phasesweep_cli(["standing", "stop"], env)
        assert proc.communicate(timeout=120)[0].strip() == "stopped"
        assert _ours(short_tmp) == []
        assert _ray_processes(short_tmp) == []
    finally:
        phasesweep_cli(["standing", "stop"], env).communicate(timeout=120)


def test_kill_running_from_ends_exactly_the_processes_that_name_the_folder(short_tmp):
    from phasesweep.pipeline.run._standing import kill_running_from

    folder = short_tmp / "ps-ray-x"
    sleep = [sys.executable, "-c", "import time, sys; time.sleep(600)"]
    inside = subprocess.Popen([*sleep, f"--temp-dir={folder}/r"])
    beside = subprocess.Popen([*sleep, f"--temp-dir={short_tmp}/ps-ray-y/r"])
    try:
        kill_running_from(str(folder))
        assert inside.wait(timeout=30) == -9
        assert beside.poll() is None
    finally:
        inside.kill()
        beside.kill()
        beside.wait()


def _stop_once_the_ray_folder_appears(
    proc: subprocess.Popen, tmp: Path, stop: signal.Signals
) -> str:
    """Send ``stop`` to the launch ``proc`` as soon as a Ray folder appears under ``tmp``
    (its start-up under way); its stderr once it has exited."""
    deadline = time.monotonic() + 300
    while not _ours(tmp) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _ours(tmp), "the Ray's folder never appeared"
    proc.send_signal(stop)
    return proc.communicate(timeout=300)[1]


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_while_ray_starts_leaves_nothing(
    short_tmp, tmp_path, tiny_spec, phasesweep_cli, stop
):
    """SIGINT or SIGTERM as soon as the embedded Ray's folder appears (its start-up under
    way): the launch exits 128 + the signal's number and leaves no folder and no process
    of that Ray."""
    spec = tiny_spec({"train.steps": 20})
    proc = phasesweep_cli(
        ["run", str(spec), "--store", str(tmp_path / "store"), "--no-progress"],
        {"TMPDIR": str(short_tmp)},
    )
    err = _stop_once_the_ray_folder_appears(proc, short_tmp, stop)
    assert proc.returncode == 128 + stop, err
    assert _ours(short_tmp) == []
    assert _ray_processes(short_tmp) == []


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_while_the_standing_ray_starts_leaves_it_recorded(
    short_tmp, tmp_path, tiny_spec, phasesweep_cli, stop
):
    """SIGINT or SIGTERM as soon as the standing Ray's folder appears (a launch with
    ``--address standing`` starting it): the start finishes and is recorded, then the
    launch exits 128 + the signal's number, and ``standing stop`` leaves nothing. Stopped
    halfway, a head that no ``instance.json`` names ran on out of ``standing stop``'s reach
    (SIGTERM killed the launch there), and the next launch started a second one."""
    from phasesweep.pipeline.run._standing import kill_running_from

    env = {"TMPDIR": str(short_tmp), "PHASESWEEP_STANDING_DIR": str(short_tmp / "st")}
    spec = tiny_spec({"train.steps": 20})
    proc = phasesweep_cli(
        ["run", str(spec), "--store", str(tmp_path / "store"), "--no-progress"]
        + ["--address", "standing"],
        env,
    )
    try:
        err = _stop_once_the_ray_folder_appears(proc, short_tmp, stop)
        assert proc.returncode == 128 + stop, err
        assert (short_tmp / "st" / "instance.json").is_file(), "the start was not recorded"
        stopped = phasesweep_cli(["standing", "stop"], env).communicate(timeout=120)[0]
        assert stopped.strip() == "stopped"
        assert _ours(short_tmp) == []
        assert _ray_processes(short_tmp) == []
    finally:
        proc.kill()
        phasesweep_cli(["standing", "stop"], env).communicate(timeout=120)
        for folder in _ours(short_tmp):  # a head no instance.json names: by its folder
            kill_running_from(str(folder))


#: Code that sends SIGTERM at one moment of the start-up, for the test below.
STOP_AT = {
    "as the folder is made": (
        "real = _auth.private_temp_dir\n"
        "def private_temp_dir():\n"
        "    made.append(os.path.dirname(real()))\n"
        "    signal.raise_signal(signal.SIGTERM)\n"
        "    return os.path.join(made[-1], 'r')\n"
        "_auth.private_temp_dir = private_temp_dir\n"
    ),
    "as the hold ends": (
        "real, make = _ray.hold_stop_signals, _auth.private_temp_dir\n"
        "_auth.private_temp_dir = lambda: made.append(os.path.dirname(make())) or made[0] + '/r'\n"
        "@contextlib.contextmanager\n"
        "def hold_stop_signals():\n"
        "    with real():\n"
        "        yield\n"
        "    signal.raise_signal(signal.SIGTERM)\n"
        "_ray.hold_stop_signals = hold_stop_signals\n"
    ),
}


@pytest.mark.parametrize("moment", STOP_AT)
def test_a_stop_signal_at_the_edges_of_the_start_up_removes_the_ray_folder(short_tmp, moment):
    """The earliest and latest moments of the test above, made certain (``ray.init`` a
    stub, so nothing starts): SIGTERM the instant the private folder exists, or the instant
    the start-up's hold ends. The launch unwinds with ``Interrupted`` and removes the
    folder; had the folder been made before the hold, or SIGTERM's handler been set only
    after it, the default SIGTERM would kill the launch there and leave its Ray behind."""
    script = (
        "import contextlib, os, signal, ray\n"
        "from phasesweep.pipeline.run import _auth, _ray\n"
        "made = []\n"
        f"{STOP_AT[moment]}"
        "ray.init = lambda **kwargs: print('started', flush=True)\n"
        "try:\n"
        "    _ray.connect(None)\n"
        "except KeyboardInterrupt as stopped:\n"
        "    print(type(stopped).__name__, stopped.signum, os.path.exists(made[0]))\n"
    )
    env = {**os.environ, "TMPDIR": str(short_tmp)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.split("\n")[:2] == ["started", "Interrupted 15 False"], done.stdout
    assert _ours(short_tmp) == []
