"""A sweep on a multi-node Ray cluster (a head and a worker node on loopback)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from storage import run_query


@pytest.fixture
def ray_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def test_sweep_runs_across_nodes_of_a_cluster(tmp_path, ray_cluster, tiny_spec):
    spec = tiny_spec(
        {"name": "cluster", "train.steps": 400, "execution.max_chunk_size": 1, "grid.seed": [0, 1]}
    )
    store = tmp_path / "store"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "run",
            str(spec),
            "--store",
            str(store),
            "--address",
            ray_cluster.address,
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    names, rows = run_query(store, "SELECT status, count(*) FROM runs GROUP BY status")
    assert rows == [("completed", 4)]
    # the trials ran on both nodes of the cluster
    assert run_query(store, "SELECT count(DISTINCT node_id) FROM runs")[1] == [(2,)]
