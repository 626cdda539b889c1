"""A sweep on a multi-node Ray cluster (a head and a worker node on loopback)."""

from __future__ import annotations

import pytest
from phasesweep.storage import run_query


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


def test_sweep_runs_across_nodes_of_a_cluster(tmp_path, ray_cluster, tiny_spec, phasesweep_cli):
    spec = tiny_spec(
        {"name": "cluster", "train.steps": 400, "execution.max_chunk_size": 1, "grid.seed": [0, 1]}
    )
    store = tmp_path / "store"
    proc = phasesweep_cli(
        ["run", str(spec), "--store", str(store), "--address", ray_cluster.address, "--no-progress"]
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    names, rows = run_query(store, "SELECT status, count(*) FROM runs GROUP BY status")
    assert rows == [("completed", 4)]
    # the trials ran on both nodes of the cluster
    assert run_query(store, "SELECT count(DISTINCT node_id) FROM runs")[1] == [(2,)]
