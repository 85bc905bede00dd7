"""TF_CONFIG: validation, building it from hosts and Slurm, and how select() reads it."""

from __future__ import annotations

import json

import pytest

from tfstrategy import select, tf_config_from_hosts
from tfstrategy.environments.slurm import tf_config_from_slurm
from tfstrategy.errors import ClusterConfigError, StrategyError
from tfstrategy.multiworker.cluster import load_cluster_config, validate_tf_config
from tfstrategy.multiworker.worker_protocol import worker_backup_dir

W2 = ["127.0.0.1:12345", "127.0.0.1:12346"]


def _config(cluster=None, task=None, drop=()):
    config = {"cluster": {"worker": W2} if cluster is None else cluster, "task": task or {"type": "worker", "index": 0}}
    for key in drop:
        config.pop(key)
    return config


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param(_config(drop=("cluster",)), "without a usable 'cluster'", id="missing-cluster"),
        pytest.param(_config(cluster=[]), "without a usable 'cluster'", id="cluster-not-object"),
        pytest.param(_config(drop=("task",)), "without a 'task' object", id="missing-task"),
        pytest.param(_config(task={"type": "chief", "index": 0}), r'task.type="chief", which is not in the cluster \(it has worker\)', id="type-not-in-cluster"),
        pytest.param(_config(task={"type": "worker", "index": 2}), r"index must be 0..1 as cluster.worker has 2", id="index-out-of-range"),
        pytest.param(_config(task={"type": "worker", "index": -1}), "index must be 0..1", id="negative-index"),
        pytest.param(_config(task={"type": "worker", "index": True}), "index must be 0..1", id="bool-index"),
        pytest.param(_config(cluster={"worker": ["127.0.0.1:1", "127.0.0.1:1"]}), r'cluster.worker\[1\]="127.0.0.1:1", the same address as cluster.worker\[0\]', id="duplicate-address"),
        pytest.param(_config(cluster={"chief": ["10.0.0.1:1"], "worker": ["10.0.0.1:1"]}), "the same address as cluster.chief", id="duplicate-across-roles"),
        pytest.param(_config(cluster={"worker": ["node1", "node2:1"]}), r'cluster.worker\[0\]="node1", which is not host:port', id="missing-port"),
        pytest.param(_config(cluster={"worker": ["node1:http"]}), "not host:port", id="port-not-number"),
        pytest.param(_config(cluster={"worker": ["node1:70000"]}), "port 70000 is not in 1-65535", id="port-out-of-range"),
        pytest.param(_config(cluster={"worker": [12345]}), "not host:port", id="address-not-string"),
        pytest.param(_config(cluster={"worker": "127.0.0.1:1"}), "expected a non-empty list", id="addresses-not-list"),
        pytest.param(_config(cluster={"workers": W2}), "cluster.workers, an unknown task type", id="unknown-role"),
        pytest.param(_config(cluster={"chief": W2, "worker": ["127.0.0.1:3"]}), "at most one chief", id="two-chiefs"),
        pytest.param(_config(cluster={"worker": ["localhost:1", "node2:1"]}), r'cluster.worker\[0\]="localhost:1" \(this machine only\) in a cluster whose cluster.worker\[1\]="node2:1" is another host', id="localhost-with-remote"),
        pytest.param(_config(cluster={"worker": ["10.0.0.5:1", "127.0.0.1:2"]}), "this machine only", id="loopback-ip-with-remote"),
    ],
)
def test_invalid_tf_config_names_the_part_and_shows_an_example(config, message):
    with pytest.raises(ClusterConfigError, match=message) as caught:
        validate_tf_config(config)
    assert "Expected for example TF_CONFIG=" in str(caught.value)
    # The example in every message is itself valid.
    example = str(caught.value).split("Expected for example TF_CONFIG=", 1)[1].rstrip(".")
    assert validate_tf_config(json.loads(example)).num_workers == 2


@pytest.mark.parametrize(
    ("config", "num_workers", "chief", "name"),
    [
        pytest.param(_config(), 2, True, "worker-0", id="worker-0-is-chief"),
        pytest.param(_config(task={"type": "worker", "index": "1"}), 2, False, "worker-1", id="index-as-text"),
        pytest.param(_config(cluster={"chief": ["n0:1"], "worker": ["n1:1", "n2:1"]}, task={"type": "worker", "index": 0}), 3, False, "worker-0", id="explicit-chief-elsewhere"),
        pytest.param(_config(cluster={"chief": ["n0:1"], "worker": ["n1:1"]}, task={"type": "chief", "index": 0}), 2, True, "chief-0", id="chief"),
        pytest.param(_config(cluster={"worker": ["n1:1"], "evaluator": ["n9:1"]}, task={"type": "evaluator", "index": 0}), 1, False, "evaluator-0", id="evaluator-not-counted"),
        pytest.param(_config(cluster={"worker": ["[::1]:1", "localhost:2"]}), 2, True, "worker-0", id="ipv6-and-localhost-all-local"),
    ],
)
def test_valid_tf_config(config, num_workers, chief, name):
    cluster = validate_tf_config(config)
    assert (cluster.num_workers, cluster.is_chief, cluster.task_name) == (num_workers, chief, name)
    assert validate_tf_config(json.loads(cluster.to_json())) == cluster


def test_load_reads_the_environment():
    env = {"TF_CONFIG": json.dumps(_config(task={"type": "worker", "index": 1}))}
    assert load_cluster_config(env).address == "127.0.0.1:12346"
    assert load_cluster_config({}) is None
    assert load_cluster_config(env).num_workers == 2
    with pytest.raises(ClusterConfigError, match="not valid JSON"):
        load_cluster_config({"TF_CONFIG": "{cluster: }"})


def test_from_hosts():
    config = tf_config_from_hosts("node1, node2:23456", 1, port=2222)
    assert config.to_dict() == {"cluster": {"worker": ["node1:2222", "node2:23456"]}, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ClusterConfigError, match="index must be 0..1"):
        tf_config_from_hosts(["node1", "node2"], 2)
    with pytest.raises(ClusterConfigError, match="non-empty list"):
        tf_config_from_hosts("node1,,node2", 0)
    with pytest.raises(ClusterConfigError, match="the same address"):
        tf_config_from_hosts(["node1", "node1"], 0)


SLURM = {"SLURM_PROCID": "3", "SLURM_STEP_NODELIST": "gpu[01-02]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "gpu02"}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(SLURM, ("gpu02:8889", 3, ["gpu01:8888", "gpu01:8889", "gpu02:8888", "gpu02:8889"]), id="two-nodes-two-tasks"),
        pytest.param({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "a1,b[7,9]", "SLURM_STEP_TASKS_PER_NODE": "1(x3)"}, ("a1:8888", 0, ["a1:8888", "b7:8888", "b9:8888"]), id="list-and-ranges"),
    ],
)
def test_from_slurm(env, expected):
    config = tf_config_from_slurm(env)
    assert (config.address, config.task_index, list(config.cluster["worker"])) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({}, "Received no SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE", id="not-in-slurm"),
        pytest.param({**SLURM, "SLURM_PROCID": "4"}, "SLURM_PROCID=4 for a step of 4 task", id="rank-too-high"),
        pytest.param({**SLURM, "SLURMD_NODENAME": "gpu01"}, "--distribution=block", id="cyclic-distribution"),
        pytest.param({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "2"}, "one count per node", id="counts-mismatch"),
        pytest.param({**SLURM, "SLURM_STEP_NODELIST": "gpu[01-"}, "do not parse", id="bad-nodelist"),
    ],
)
def test_from_slurm_errors(env, message):
    with pytest.raises(ClusterConfigError, match=message):
        tf_config_from_slurm(env)


def test_select_validates_tf_config_before_building():
    env = {"TF_CONFIG": json.dumps(_config(task={"type": "worker", "index": 5}))}
    with pytest.raises(ClusterConfigError, match="index must be 0..1"):
        select(env=env)
    with pytest.raises(StrategyError, match="each worker uses its own GPUs or one CPU"):
        select(cpu_replicas=2, env={"TF_CONFIG": json.dumps(_config())})


def test_each_worker_gets_its_own_backup_dir(tmp_path):
    env = {"TF_CONFIG": json.dumps(_config(task={"type": "worker", "index": 1})), "TFSTRATEGY_BACKUP_DIR": str(tmp_path)}
    assert worker_backup_dir(env=env) == tmp_path / "worker-1"
    assert worker_backup_dir(tmp_path / "mine", env={}) == tmp_path / "mine" / "worker-0"
    assert worker_backup_dir(env={}) is None
