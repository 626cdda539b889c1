"""No one else can run code through a Ray that phasesweep starts (SECURITY.md), shown with
a second local account where the tests run as root: it can neither join the standing or
the embedded Ray (as a node, as a driver) nor read their token or session files, and a
state folder it planted is refused. The checks that need no second account run anywhere.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from phasesweep.pipeline.run import _auth, _standing
from phasesweep.pipeline.spec import SpecError
from test_cluster import _kill_session, _ray_node

#: Subprocess timeouts: Ray starts slowly on a loaded machine.
TIMEOUT = 300
#: Environment of the other account's Ray clients: Ray's retries of a refused GCS
#: connection cut from 20 s to about 2 (the refusal is the same).
_CLIENT = {"RAY_gcs_server_port_wait_time_s": "2"}
#: ... and of its drivers: the loopback address kept (a node refuses to start with it).
_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: A driver: join ``argv[1]`` and run a task.
_DRIVER = (
    "import os, sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
    "print('ran as uid', ray.get(ray.remote(os.getuid).remote()))"
)
#: Which of ``argv[1:]`` this account can read (``read``) or not (``denied``).
_READ = (
    "import os, sys\n"
    "for path in sys.argv[1:]:\n"
    "    try:\n"
    "        os.listdir(path) if os.path.isdir(path) else open(path).read()\n"
    "        print('read', path)\n"
    "    except PermissionError:\n"
    "        print('denied', path)\n"
)
#: Ray's words when the GCS refuses a request for its token.
_REFUSED = "InvalidAuthToken"


@dataclass
class Account:
    """A second local account, and a Python with Ray that it can run."""

    name: str
    uid: int
    gid: int
    home: Path
    python: str
    env: dict[str, str]

    def popen_as(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "cwd": self.home}

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        """``python *args`` as this account; stdout and stderr together."""
        return subprocess.run(
            [self.python, *args],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT,
            **self.popen_as(),
        )


def _python_for(account: Account) -> str | None:
    """This interpreter, else a system one of the same version, that ``account`` can run
    and import this Ray with (this one may live in a folder only root can enter)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/local/bin/{version}", f"/usr/bin/{version}"):
        account.python = python
        try:
            if account.run("-c", "import ray").returncode == 0:
                return python
        except OSError:
            continue
    return None


@pytest.fixture(scope="module")
def other_account():
    """A new unprivileged local account (removed afterwards); skipped unless root."""
    if os.geteuid() != 0:
        pytest.skip("creating a second local account needs root")
    if not shutil.which("useradd"):
        pytest.skip("no useradd to create a second local account")
    name = f"ps-sec-{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", name], check=True)
    home = Path(tempfile.mkdtemp(prefix="pso", dir="/tmp"))  # short: Ray's socket paths
    try:
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        import ray

        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "PYTHONPATH": str(Path(ray.__file__).parents[1]),  # this Ray, read-only
            "RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL": "minor",  # a system Python's patch
            **_CLIENT,
        }
        account = Account(name, entry.pw_uid, entry.pw_gid, home, "", env)
        if _python_for(account) is None:
            pytest.skip(f"the account {name} can run no Python {sys.version_info[:2]} with Ray")
        yield account
    finally:
        subprocess.run(["userdel", name], check=False)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def state_folder(monkeypatch, short_tmp):
    """A fresh state folder for this test's local Rays; what runs there is stopped after."""
    monkeypatch.setenv(_auth.FOLDER_ENV, str(short_tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(_auth.MODE, raising=False)
    yield short_tmp
    _standing.stop()


def _alive_nodes(address: str) -> int:
    """Live nodes of the standing Ray at ``address``, asked by its owner with its token."""
    probe = subprocess.run(
        [
            sys.executable, "-c",
            "import sys, ray; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))",
            address,
        ],
        env={**os.environ, **_standing.driver_env()},
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    return int(probe.stdout.split()[-1])


@pytest.mark.ray
@pytest.mark.process
def test_another_account_can_neither_join_the_standing_ray_nor_read_its_token(
    other_account, state_folder, tmp_path
):
    address = _standing.ensure(num_cpus=1)
    token = _auth.token_file(state_folder)
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_folder.stat().st_mode) == 0o700
    readable = Path(_auth.__file__)  # control: a file every account may read
    seen = other_account.run("-c", _READ, str(token), str(state_folder), str(readable)).stdout
    assert seen.split("\n")[:3] == [
        f"denied {token}",
        f"denied {state_folder}",
        f"read {readable}",
    ], seen

    # as a driver (a wrong token is refused alike: test_cluster.py)
    driver = other_account.run("-c", _DRIVER, address, **_LOOPBACK)
    assert driver.returncode != 0 and _REFUSED in driver.stdout, driver.stdout[-3000:]
    assert "ran as uid" not in driver.stdout

    # as a node: refused; with the token (the control), the same command joins
    def node(log: Path, **env: str) -> subprocess.Popen:
        return _ray_node(
            {**other_account.env, **env}, log, f"--address={address}",
            f"--temp-dir={other_account.home / 'r'}",
            python=other_account.python, **other_account.popen_as(),
        )  # fmt: skip

    refused = node(tmp_path / "refused.log")
    assert refused.wait(timeout=TIMEOUT) != 0
    assert _REFUSED in (tmp_path / "refused.log").read_text()
    assert _alive_nodes(address) == 1
    joined = node(tmp_path / "joined.log", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token.read_text())
    try:
        deadline = time.monotonic() + TIMEOUT
        while _alive_nodes(address) < 2 and joined.poll() is None:
            assert time.monotonic() < deadline, (tmp_path / "joined.log").read_text()[-3000:]
            time.sleep(1)
        assert joined.poll() is None, (tmp_path / "joined.log").read_text()[-3000:]
    finally:
        _kill_session(joined)


#: The embedded Ray of a launch: connect as ``phasesweep run`` does, report where its
#: token and files are, wait for a line on stdin, disconnect.
_EMBEDDED = """
import json, os, sys, ray
from phasesweep.pipeline.run._ray import connect, disconnect
connect(None)
node = ray._private.worker.global_worker.node
print(json.dumps({
    "address": node.gcs_address,
    "token": os.environ.get("RAY_AUTH_TOKEN_PATH"),
    "session": node.get_session_dir_path(),
    "worker": ray.get(ray.remote(lambda: os.environ.get("RAY_AUTH_MODE")).remote()),
}), flush=True)
sys.stdin.readline()
disconnect()
"""


def _embedded(**env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _EMBEDDED],
        env={**os.environ, **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.ray
@pytest.mark.process
def test_the_embedded_ray_is_private_to_its_owner(other_account, state_folder):
    launch = _embedded(RAY_AUTH_TOKEN="from-the-users-environment")
    try:
        line = launch.stdout.readline()
        assert line, launch.communicate(timeout=TIMEOUT)[1]
        info = json.loads(line)
        assert info["token"] == str(state_folder / "auth_token") and info["worker"] == "token"
        session = Path(info["session"])
        private = session.parents[1]  # …/ps-ray-XXXX/r/session_…
        assert not session.is_relative_to("/tmp/ray")
        assert stat.S_IMODE(private.stat().st_mode) == 0o700 and private.stat().st_uid == 0
        logs = session / "logs"
        seen = other_account.run("-c", _READ, info["token"], str(logs)).stdout
        assert seen.split("\n")[:2] == [f"denied {info['token']}", f"denied {logs}"], seen
        driver = other_account.run("-c", _DRIVER, info["address"], **_LOOPBACK)
        assert driver.returncode != 0 and _REFUSED in driver.stdout, driver.stdout[-3000:]
        _, err = launch.communicate("\n", timeout=TIMEOUT)
        assert launch.returncode == 0, err
        assert not private.exists()  # removed with the Ray
    finally:
        launch.kill()


def test_a_folder_another_account_planted_is_refused_and_nothing_in_it_used(
    other_account, tmp_path, tiny_spec, phasesweep_cli, short_tmp
):
    """The attack of issue 25: another account creates the state folder first, with an
    ``instance.json`` that names a process of the owner and a folder to delete. Every
    command refuses the folder (exit 2, naming it and the fix) and touches neither."""
    shared = short_tmp
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True)
    keep = tmp_path / "keep"
    keep.mkdir()
    try:
        shared.chmod(0o1777)  # like /tmp
        planted = shared / "phasesweep-ray"  # the default under $XDG_RUNTIME_DIR
        forged = {"address": "127.0.0.1:1", "pid": victim.pid, "temp_dir": str(keep)}
        made = other_account.run(
            "-c",
            "import os, sys; os.mkdir(sys.argv[1], 0o700); os.chmod(sys.argv[1], 0o700); "
            "open(os.path.join(sys.argv[1], 'instance.json'), 'w').write(sys.argv[2])",
            str(planted), json.dumps(forged),
        )  # fmt: skip
        assert made.returncode == 0, made.stdout
        env = {"XDG_RUNTIME_DIR": str(shared), _auth.FOLDER_ENV: ""}
        store = tmp_path / "store"
        for args in (
            ["standing", "stop"],
            ["standing", "status"],
            ["run", str(tiny_spec()), "--store", str(store), "--address", "standing"],
            ["run", str(tiny_spec()), "--store", str(store)],  # the embedded Ray's token
        ):
            proc = phasesweep_cli(args, env_extra=env)
            out, err = proc.communicate(timeout=TIMEOUT)
            assert proc.returncode == 2, out + err
            refusal = err.strip().splitlines()[-1]  # after `run`'s plan, if any
            assert refusal.startswith("phasesweep: ") and str(planted) in refusal, err
            assert f"owned by uid {other_account.uid}" in refusal and "remove" in refusal
        assert victim.poll() is None and keep.exists() and not store.exists()
        assert json.loads((planted / "instance.json").read_text()) == forged
    finally:
        victim.kill()
        victim.wait()


# Without a second account: what the owner's own mistakes, or a link, look like.


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda p: p.symlink_to(tempfile.mkdtemp(dir=p.parent)), "is a symbolic link"),
        (lambda p: p.mkdir(mode=0o755) or p.chmod(0o755), "has mode 0755, not 0700"),
        (lambda p: p.write_text(""), "is not a folder"),
        (lambda p: p.parent.chmod(0o777), "is writable by every account"),
    ],
)
def test_a_state_folder_that_is_not_private_is_refused(tmp_path, monkeypatch, make, problem):
    folder = tmp_path / "state"
    make(folder)
    monkeypatch.setenv(_auth.FOLDER_ENV, str(folder))
    with pytest.raises(SpecError, match=problem) as refused:
        _standing.state_dir()
    assert str(folder) in str(refused.value) and _auth.FOLDER_ENV in str(refused.value)
    assert not (folder / "auth_token").exists()


def test_a_new_state_folder_is_0700_whatever_the_umask(tmp_path, monkeypatch):
    monkeypatch.delenv(_auth.FOLDER_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    old = os.umask(0o277)  # would leave the owner only r
    try:
        folder = _standing.state_dir()
    finally:
        os.umask(old)
    assert folder == tmp_path / "phasesweep-ray"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_concurrent_first_launches_write_one_token(tmp_path):
    """Written once: launches that start at once all get the same complete token."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o700)
    with multiprocessing.get_context("fork").Pool(12) as pool:  # forked: they start at once
        paths = pool.map(_auth.token_file, [folder] * 12, chunksize=1)
    tokens = {path.read_text() for path in paths}
    assert len(tokens) == 1
    written = paths[0].stat()
    assert _auth.token_file(folder).stat().st_ino == written.st_ino  # never rewritten
    (token,) = tokens
    assert len(token) == 64 and int(token, 16) >= 0  # 256 bits in hex
    assert sorted(os.listdir(folder)) == ["auth_token"]  # no draft left
    path = folder / "auth_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o644)  # then some tool made it readable to others
    with pytest.raises(SpecError, match="mode 0600"):
        _auth.token_file(folder)


#: A notebook: a launch without a token (``RAY_AUTH_MODE=disabled``), then, the variable
#: gone, one with; each prints the mode its Ray's workers run with.
_TWICE = """
import os
from phasesweep.pipeline.run._ray import connect, disconnect
for mode in ("disabled", None):
    os.environ.pop("RAY_AUTH_MODE", None) if mode is None else os.environ.update(RAY_AUTH_MODE=mode)
    connect(None)
    import ray
    print(ray.get(ray.remote(lambda: os.environ.get("RAY_AUTH_MODE")).remote()), flush=True)
    disconnect()
"""


@pytest.mark.ray
@pytest.mark.process
def test_a_ray_without_token_authentication_is_said_once(state_folder):
    """``RAY_AUTH_MODE=disabled`` in the user's environment: the embedded Ray starts
    without a token (none is written), and the launch says so once on stderr. A later
    launch in the same process has token authentication again (Ray caches its settings
    per process: without refreshing them it would present no token and be refused)."""
    launch = subprocess.run(
        [sys.executable, "-c", _TWICE], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert launch.returncode == 0, launch.stderr
    assert launch.stdout.split() == ["disabled", "token"]
    warnings = [line for line in launch.stderr.splitlines() if "without token auth" in line]
    assert len(warnings) == 1 and "RAY_AUTH_MODE=disabled" in warnings[0], launch.stderr
    assert (state_folder / "auth_token").exists()  # written by the second launch only


def test_the_tune_folder_of_a_launch_is_checked_like_the_state_folder(tmp_path, monkeypatch):
    """Tune's experiment folders live under $TMPDIR/phasesweep-tune-$UID: a link planted
    there is refused (exit 2, nothing followed); a folder an earlier version left (ours,
    0755: others could read it, not write it) is made 0700 and used."""
    from phasesweep.pipeline.run._driver import launch_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    base = tmp_path / f"phasesweep-tune-{os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    base.symlink_to(elsewhere)
    with pytest.raises(SpecError, match="symbolic link"), launch_folder():
        pass
    assert not any(elsewhere.iterdir())
    base.unlink()
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    with launch_folder() as folder:
        assert Path(folder).parent == base
        assert stat.S_IMODE(os.stat(base).st_mode) == 0o700
