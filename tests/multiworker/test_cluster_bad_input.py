"""TF_CONFIG and the cluster builders refuse what would hang, crash or be ignored (issue 13)."""

from __future__ import annotations

import json

import pytest

from tfstrategy import select, tf_config_from_hosts
from tfstrategy.environments.slurm import tf_config_from_slurm
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import read_tf_config, validate_tf_config


def _config(workers, task=None, **roles):
    return {"cluster": {"worker": workers, **roles}, "task": task or {"type": "worker", "index": 0}}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param(
            _config(["127.0.0.1:20001", "localhost:20001"]),
            r'cluster.worker\[1\]="localhost:20001", the same address as cluster.worker\[0\] written as "127.0.0.1:20001"',
            id="loopback-ip-and-localhost",
        ),
        pytest.param(
            _config(["[::1]:20001", "[0:0:0:0:0:0:0:1]:20001"]),
            r'the same address as cluster.worker\[0\] written as "\[::1\]:20001"',
            id="ipv6-loopback-written-two-ways",
        ),
        pytest.param(
            _config(["Node1:1", "node1.:1"]),
            "the same address as cluster.worker",
            id="hostname-case-and-trailing-dot",
        ),
        pytest.param(_config(["node1:2000\u0661"]), "which is not host:port", id="port-in-arabic-indic-digits"),
        pytest.param(_config(["node1:\uff11\uff12"]), "which is not host:port", id="port-in-fullwidth-digits"),
        pytest.param(
            _config(["node1:1"], ps=["node2:1"]),
            "cluster.ps with 1 address.*does not support ParameterServerStrategy yet",
            id="one-worker-and-a-ps",
        ),
        pytest.param(
            _config(["node1:1", "node2:1"], ps=["node3:1", "node4:1"]),
            "cluster.ps with 2 address.*Remove cluster.ps",
            id="workers-and-ps",
        ),
        pytest.param(_config(["node1:1"], {"type": "worker", "index": "9" * 5000}), "index must be 0..0", id="index-5000-digits"),
        pytest.param(_config(["node1:1", "node2:1"], {"type": "worker", "index": "\u0661"}), "index must be 0..1", id="index-non-ascii-digit"),
        pytest.param(_config(["node1:1"], {"type": ["worker"], "index": 0}), "not in the cluster", id="task-type-a-list"),
    ],
)
def test_tf_config_refused(config, message):
    with pytest.raises(ClusterConfigError, match=message):
        validate_tf_config(config)


def test_ps_cluster_is_refused_by_select_instead_of_silently_ignored():
    """One worker plus one ps used to get MirroredStrategy, ignoring the cluster."""
    env = {"TF_CONFIG": json.dumps(_config(["127.0.0.1:20001"], ps=["127.0.0.1:20002"]))}
    with pytest.raises(ClusterConfigError, match="ParameterServerStrategy"):
        select(env=env)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        pytest.param("[" * 100_000 + "]" * 100_000, "nested too deeply", id="deeply-nested"),
        pytest.param('{"task": {"index": ' + "9" * 5000 + "}}", "number too long", id="5000-digit-number"),
        pytest.param('{"a": "' + "x" * 2_000_000 + '"}', "characters", id="2-MB"),
    ],
)
def test_unreadable_tf_config_is_one_cluster_error(raw, message):
    with pytest.raises(ClusterConfigError, match=message) as caught:
        read_tf_config({"TF_CONFIG": raw})
    assert len(str(caught.value)) < 400


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        pytest.param((None, 0), {}, r"Received hosts=None \(NoneType\); expected a comma-separated string", id="hosts-none"),
        pytest.param((["node1", 2], 0), {}, r"Received hosts=\[\"node1\", 2\] \(list\)", id="hosts-with-an-int"),
        pytest.param(("node1,node2", "1"), {}, r'Received task_index="1" \(str\); expected .* as an int, 0..1', id="index-text"),
        pytest.param(("node1,node2", 0), {"port": "abc"}, r'Received port="abc" \(str\); expected an int in 1-65535', id="port-text"),
        pytest.param(("node1", 0), {"port": 0}, "expected an int in 1-65535", id="port-zero"),
    ],
)
def test_tf_config_from_hosts_argument_types(args, kwargs, message):
    with pytest.raises(ClusterConfigError, match=message):
        tf_config_from_hosts(*args, **kwargs)


SLURM_STEP = {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "node1", "SLURM_STEP_TASKS_PER_NODE": "1"}


@pytest.mark.parametrize(
    ("env", "kwargs", "message"),
    [
        pytest.param(SLURM_STEP, {"port": "abc"}, r'Received port="abc" \(str\)', id="port-text"),
        pytest.param(SLURM_STEP, {"port": 70000}, "expected an int in 1-65535", id="port-too-high"),
        pytest.param({**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "0"}, {}, "gives 0 tasks; expected at least 1", id="zero-tasks"),
    ],
)
def test_tf_config_from_slurm_bad_input(env, kwargs, message):
    with pytest.raises(ClusterConfigError, match=message) as caught:
        tf_config_from_slurm(env, **kwargs)
    assert "0..-1" not in str(caught.value)
