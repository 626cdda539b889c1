"""Multi-node Ray clusters on loopback (in-process nodes, and separate `ray start` processes with
an S3 store on a moto server), and ``cluster.yaml``."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import trial_faults
import yaml
from phasesweep.pipeline.run._standing import session_pids
from phasesweep.storage import run_query
from trial_faults import HOLD_ENV

#: Environment of a driver of a loopback cluster: Ray swaps a loopback address for the
#: machine's own (where no node listens), unless Ray believes it cannot form clusters
#: (which only stops a *worker node* from starting, and drivers are none).
_LOOPBACK_DRIVER = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _token(folder: Path) -> Path:
    """A cluster token file in ``folder``, as docs/cluster.md makes one (mode 0600)."""
    path = folder / "ray_token"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


@pytest.fixture
def ray_cluster(monkeypatch, tmp_path, short_tmp):
    """A head and a worker node in this process, with token authentication (the token in
    this process's environment, so drivers started from it present it). Their session
    files and the cluster's address file are in ``short_tmp``, not the machine's /tmp/ray
    (Ray deletes no session folder, and ``ray.init()`` anywhere on the machine would find
    the address file there)."""
    from phasesweep.pipeline.run._auth import refresh_ray
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_TMPDIR", str(short_tmp))
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(_token(tmp_path)))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    refresh_ray()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.mark.ray
def test_sweep_runs_across_nodes_of_a_cluster(tmp_path, ray_cluster, tiny_spec, phasesweep_cli):
    spec = tiny_spec(
        {"name": "cluster", "train.steps": 400, "execution.max_chunk_size": 1, "grid.seed": [0, 1]}
    )
    store = tmp_path / "store"
    proc = phasesweep_cli(
        [
            "run",
            str(spec),
            "--store",
            str(store),
            "--address",
            ray_cluster.address,
            "--no-progress",
        ],
        env_extra=_LOOPBACK_DRIVER,
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "without token authentication" not in err
    names, rows = run_query(store, "SELECT status, count(*) FROM runs GROUP BY status")
    assert rows == [("completed", 4)]
    # the trials ran on both nodes of the cluster
    assert run_query(store, "SELECT count(DISTINCT node_id) FROM runs")[1] == [(2,)]


def test_a_launch_without_the_clusters_token_exits_2_and_writes_nothing(
    tmp_path, ray_cluster, tiny_spec, phasesweep_cli
):
    """Another token, and none at all (Ray then joins an explicit address unauthenticated):
    refused by the cluster, one line saying how to pass the token."""
    store = tmp_path / "store"
    other = tmp_path / "other"
    other.mkdir()
    fast = {**_LOOPBACK_DRIVER, "RAY_gcs_server_port_wait_time_s": "2"}  # Ray's retries
    for env in ({"RAY_AUTH_TOKEN_PATH": str(_token(other))}, {"RAY_AUTH_MODE": "disabled"}):
        args = ["run", str(tiny_spec()), "--store", str(store), "--address", ray_cluster.address]
        proc = phasesweep_cli(args, env_extra={**fast, **env})
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "--address" in lines[0], err
        assert "token authentication failed" in lines[0] and "RAY_AUTH_TOKEN_PATH" in lines[0]
        assert not store.exists()


def _cluster_config() -> dict:
    return yaml.safe_load((Path(__file__).parents[1] / "cluster.yaml").read_text())


def test_cluster_yaml_is_valid_for_ray():
    """Against the JSON schema the installed Ray validates `ray up` configs with."""
    import ray.autoscaler

    ray_schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    config = _cluster_config()
    jsonschema.validate(config, ray_schema)
    excluded = config["rsync_exclude"]
    assert ".venv" in excluded and any(p.strip("/") == "results" for p in excluded)
    # and the schema does catch mistakes
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**config, "rsync_excludes": [".venv"]}, ray_schema)


def test_cluster_commands_are_idempotent_and_pass_the_store_and_token_to_ray(tmp_path):
    """Run setup and start commands twice in bash with a stand-in ``ray`` and ``pip``:
    ``.bashrc`` gets each line once, the token and credentials become this account's
    only, and ``ray start`` sees the store's variables and token authentication (which
    ``cluster.env`` cannot turn off)."""
    config = _cluster_config()
    home = tmp_path / "home"
    venv_bin = home / "phasesweep" / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    fake = "#!/bin/sh\n" + 'env > "$HOME/env.$1"\n'
    for tool in ("ray", "pip"):
        (venv_bin / tool).write_text(fake)
        (venv_bin / tool).chmod(0o755)
    (home / ".bashrc").write_text("# the user's own\n")
    private = home / ".phasesweep"  # where file_mounts puts the env file and the token
    env_file, token = private / "cluster.env", private / "ray_token"
    for path in (env_file, token):
        assert f"/home/phasesweep/.phasesweep/{path.name}" in config["file_mounts"]
    private.mkdir(mode=0o755)
    env_file.write_text(
        "PHASESWEEP_STORE=s3://bucket/results\nPHASESWEEP_S3_ENDPOINT=http://127.0.0.1:9\n"
        "AWS_ACCESS_KEY_ID=key\nAWS_SECRET_ACCESS_KEY=secret\nRAY_AUTH_MODE=disabled\n"
    )
    token.write_text("0" * 64)
    for path in (env_file, token):
        path.chmod(0o644)  # as a careless copy might leave them
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "RAY_HEAD_IP": "127.0.0.1"}
    # `python3 -m venv` would build a real venv: keep the stand-in pip instead
    setup = [c.replace("python3 -m venv .venv && ", "") for c in config["setup_commands"]]
    for _ in range(2):  # a second `ray up`
        for command in setup + config["head_start_ray_commands"]:
            subprocess.run(["bash", "-c", command], env=env, cwd=home, check=True)
    bashrc = (home / ".bashrc").read_text().splitlines()
    assert len(bashrc) == 4 and len(set(bashrc)) == 4, bashrc
    assert [oct(p.stat().st_mode & 0o777) for p in (private, env_file, token)] == [
        "0o700", "0o600", "0o600"
    ]  # fmt: skip

    def started() -> dict[str, str]:
        lines = (home / "env.start").read_text().splitlines()
        (home / "env.start").unlink()
        return dict(line.split("=", 1) for line in lines)

    head = started()
    assert head["PHASESWEEP_STORE"] == "s3://bucket/results"
    assert head["PHASESWEEP_S3_ENDPOINT"] == "http://127.0.0.1:9"
    assert head["AWS_SECRET_ACCESS_KEY"] == "secret"
    for command in config["worker_start_ray_commands"]:
        subprocess.run(["bash", "-c", command], env=env, cwd=home, check=True)
    worker = started()
    assert worker["AWS_ACCESS_KEY_ID"] == "key"
    for node in (head, worker):
        assert node["RAY_AUTH_MODE"] == "token" and node["RAY_AUTH_TOKEN_PATH"] == str(token)
    # an interactive shell on a node (`ray attach`) gets them from .bashrc
    shell = subprocess.run(
        [
            "bash",
            "-c",
            "source ~/.bashrc; echo $PHASESWEEP_STORE $RAY_AUTH_MODE $RAY_AUTH_TOKEN_PATH",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert shell.stdout.split() == ["s3://bucket/results", "token", str(token)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: ``ray start``, except that 127.0.0.1 stays the node's address: the CLI swaps a loopback
#: --node-ip-address for the machine's own address, and tests stay on loopback.
_RAY_START = (
    "import sys, ray._private.services as s; s.resolve_ip_for_localhost = lambda host: host; "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"
)


def _ray_node(
    env: dict[str, str], log: Path, *args: str, python: str = sys.executable, **popen: Any
) -> subprocess.Popen:
    """``ray start --block`` in a session of its own (so the node can be killed whole),
    every port chosen free so no other Ray on the machine is touched; ``python`` runs it,
    ``popen`` goes to :class:`subprocess.Popen` (``user=``: as another account)."""
    command = [
        python,
        "-c",
        _RAY_START,
        "start",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
        *args,
    ]
    out = open(log, "w")  # noqa: SIM115  (lives as long as the node)
    return subprocess.Popen(
        command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **popen
    )


def _session(leader: subprocess.Popen) -> list[int]:
    """Pids of the processes in ``leader``'s session (the node's raylet, store, workers)."""
    return session_pids(leader.pid)


def _training(leader: subprocess.Popen) -> bool:
    """Whether a Tune trial is training in a Ray worker of ``leader``'s node."""
    for pid in _session(leader):
        with contextlib.suppress(OSError):
            title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if title.startswith("ray::") and ".train" in title:
                return True
    return False


def _kill_session(leader: subprocess.Popen) -> None:
    """SIGKILL every process of ``leader``'s session: the node's raylet, store, workers."""
    for pid in _session(leader):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    leader.wait(timeout=60)


def _start_node(
    address: str, env: dict[str, str], nodes: list[subprocess.Popen], start, deadline: float
) -> None:
    """``start()`` a node and wait until it and all ``nodes`` are alive in the cluster, then
    append it. A loaded machine can make Ray give up on a starting node (its raylet has
    30 s to register): then it is started again, until ``deadline``."""
    script = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
        "print(sum(1 for node in ray.nodes() if node['Alive']))"
    )
    node = start()
    while time.monotonic() < deadline:
        assert all(n.poll() is None for n in nodes), "a node exited: see its log"
        if node.poll() is not None:
            node = start()
        got = subprocess.run(
            [sys.executable, "-c", script, address],
            env={**env, **_LOOPBACK_DRIVER},
            capture_output=True,
            text=True,
        )
        if got.returncode == 0 and got.stdout.split()[-1:] == [str(len(nodes) + 1)]:
            nodes.append(node)
            return
        time.sleep(2)
    _kill_session(node)
    raise TimeoutError(f"a Ray node did not join the cluster at {address}")


@pytest.mark.slow
@pytest.mark.process
@pytest.mark.ray
def test_worker_node_killed_mid_sweep_on_s3_store(tmp_path, tiny_spec, phasesweep_cli, short_tmp):
    """Head and two worker nodes as separate `ray start` processes, a moto S3 server as the
    store; one worker node is SIGKILLed once the first chunk is committed. The sweep still
    completes, and the raw files hold every point once with its whole trajectory.

    The trials of the node to be killed hold after their first checkpoint (the hold hook of
    tests/trial_faults.py, in that node's environment only), so it is training when it is
    killed however fast the machine: the other node commits chunks meanwhile."""
    from moto.server import ThreadedMotoServer
    from phasesweep.storage import Store, verify

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    nodes: list[subprocess.Popen] = []
    ray_tmp = short_tmp  # Ray's temp folder of every node, not the machine's /tmp/ray
    try:
        host, port = server.get_host_and_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_"))}
        env.update(
            RAY_AUTH_MODE="token",  # as cluster.yaml starts every node
            RAY_AUTH_TOKEN_PATH=str(_token(tmp_path)),
            PHASESWEEP_S3_ENDPOINT=f"http://{host}:{port}",
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
        )
        old_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # for Store.open in this process
        try:
            store = Store.open("s3://cluster/results")
            store.fs.mkdir("cluster")
        finally:
            for k, v in old_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

        gcs = f"127.0.0.1:{_free_port()}"
        deadline = time.monotonic() + 900
        head = [
            "--head",
            f"--port={gcs.split(':')[1]}",
            "--include-dashboard=false",
            "--num-cpus=0",  # trials run on the worker nodes only
        ]
        hold = tmp_path / "hold"
        hold.touch()
        held = {**env, **trial_faults.env(**{HOLD_ENV: str(hold)})}
        for name, args in (("head", head), ("worker0", []), ("worker1", [])):
            args = [*args, f"--temp-dir={ray_tmp}"] + ([] if args else [f"--address={gcs}"])
            log = tmp_path / f"{name}.log"
            node_env = held if name == "worker0" else env  # nodes[1]: the node killed below
            start = functools.partial(_ray_node, node_env, log, *args)
            _start_node(gcs, env, nodes, start, deadline)

        spec = tiny_spec(
            {
                "name": "killed",
                # seconds of training (10³-10⁴ steps/s), checkpointed every half second: a
                # chunk of the held node checkpoints, and holds, before it could end
                "train.steps": 20000,
                "model.width": 32,
                "data.n_train": 32,
                "execution.commit_every_seconds": 0.5,
                "execution.max_chunk_size": 1,
                "grid.seed": [0, 1, 2, 3],
            }
        )
        proc = phasesweep_cli(
            ["run", str(spec), "--store", store.uri, "--address", gcs, "--no-progress"],
            env_extra={
                **{k: env[k] for k in env if k.startswith(("AWS_", "PHASESWEEP_", "RAY_"))},
                **_LOOPBACK_DRIVER,
            },
        )
        # mid-sweep: a chunk is committed and worker0 (nodes[1]) is training (held in) another
        while proc.poll() is None and not (store.files("runs", "killed") and _training(nodes[1])):
            assert time.monotonic() < deadline, "no chunk committed beside a held one"
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1]
        _kill_session(nodes[1])
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err

        # Raw files, not the deduplicating views: every point once, whole trajectories.
        fs = store.arrow_fs
        runs = pa.concat_tables(pq.read_table(p, filesystem=fs) for p in store.files("runs"))
        run_ids = runs.column("run_id").to_pylist()
        assert len(run_ids) == len(set(run_ids)) == 8
        assert set(runs.column("status").to_pylist()) == {"completed"}
        committed = set(zip(run_ids, runs.column("attempt").to_pylist()))
        verify(store, repair=True, min_age_s=0)  # drops files of the killed node's attempts
        assert verify(store, min_age_s=0).ok
        for table, per_step in (("trajectories", 1), ("layers", 2)):
            raw = pa.concat_tables(pq.read_table(p, filesystem=fs) for p in store.files(table))
            keys = list(zip(*(raw.column(c).to_pylist() for c in ("run_id", "attempt", "step"))))
            assert {(r, a) for r, a, _ in keys} == committed
            rows = Counter(r for r, _, _ in keys)
            steps = Counter((r, s) for r, _, s in keys)
            assert all(n == 5 * per_step for n in rows.values()), rows  # 5 logged steps
            assert set(steps.values()) == {per_step}  # no step twice
    finally:
        for node in reversed(nodes):
            if node.poll() is None:
                _kill_session(node)
        server.stop()
