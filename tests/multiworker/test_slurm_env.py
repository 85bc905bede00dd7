"""Parsing a Slurm job step's variables into a cluster (pure: dict environments).

The behaviour under a real Slurm is in tests/multiworker/test_slurm.py.
"""

from __future__ import annotations

import pytest

from tfstrategy.environments.slurm import (
    cluster_from_slurm_step,
    parse_port_list,
    read_slurm_step,
    tf_config_from_slurm,
)
from tfstrategy.errors import ClusterConfigError, SettingsConflictError
from tfstrategy.runtime.select import resolve_request

STEP = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURMD_NODENAME": "n1",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_RESV_PORTS": "21234-21236",
}


def task(procid: int, node: str, localid: int, **extra: str) -> dict[str, str]:
    return {**STEP, "SLURM_PROCID": str(procid), "SLURMD_NODENAME": node, "SLURM_LOCALID": str(localid), **extra}


WORKERS = ["n1:21234", "n1:21235", "n2:21234", "n2:21235"]


@pytest.mark.parametrize(
    ("env", "index", "workers"),
    [
        pytest.param(task(0, "n1", 0), 0, WORKERS, id="block-first"),
        pytest.param(task(3, "n2", 1), 3, WORKERS, id="block-last"),
        # cyclic: task 1 is on n2, task 2 on n1 (local 1); the order stays node by node
        pytest.param(task(1, "n2", 0, SLURM_DISTRIBUTION="cyclic"), 2, WORKERS, id="cyclic-task-1"),
        pytest.param(task(2, "n1", 1, SLURM_DISTRIBUTION="cyclic"), 1, WORKERS, id="cyclic-task-2"),
        pytest.param(task(1, "n1", 1, SLURM_STEP_RESV_PORTS="21234,21240"), 1,
                     ["n1:21234", "n1:21240", "n2:21234", "n2:21240"], id="port-list"),
        pytest.param(task(1, "n1", 1, SLURM_STEP_RESV_PORTS="", TFSTRATEGY_SLURM_PORT="30000"), 1,
                     ["n1:30000", "n1:30001", "n2:30000", "n2:30001"], id="env-port"),
        pytest.param(task(1, "n1", 1, SLURM_STEP_RESV_PORTS="", SLURM_JOB_ID="1234", SLURM_STEP_ID="2"), 1,
                     ["n1:29376", "n1:29377", "n2:29376", "n2:29377"], id="derived-from-job-and-step"),
        pytest.param(task(1, "n1", 1, SLURM_STEP_RESV_PORTS="", SLURM_JOB_ID=""), 1,
                     ["n1:8888", "n1:8889", "n2:8888", "n2:8889"], id="tensorflow-default"),
    ],
)
def test_cluster_from_step(env, index, workers):
    config = tf_config_from_slurm(env)

    assert (config.task_index, list(config.cluster["worker"])) == (index, workers)


def test_port_argument_wins_and_conflicts_with_the_variable():
    assert tf_config_from_slurm(task(0, "n1", 0), port=40000).address == "n1:40000"
    with pytest.raises(SettingsConflictError, match="TFSTRATEGY_SLURM_PORT='30000'"):
        tf_config_from_slurm(task(0, "n1", 0, TFSTRATEGY_SLURM_PORT="30000"), port=40000)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(task(0, "n1", 0, SLURM_STEP_RESV_PORTS="21240"),
                     r"SLURM_STEP_RESV_PORTS=21240 \(1 port\(s\)\) for a step with 2 tasks on a node.*--resv-ports=2",
                     id="too-few-reserved-ports"),
        pytest.param(task(0, "n9", 0), "SLURMD_NODENAME='n9', which is not in SLURM_STEP_NODELIST", id="foreign-node"),
        pytest.param(task(0, "n1", 2), "SLURM_LOCALID=2 on 'n1', which runs 2 task", id="local-id-out-of-range"),
        pytest.param(task(0, "n1", 0, SLURM_HET_SIZE="2"), "heterogeneous job step", id="heterogeneous"),
        pytest.param(task(0, "n1", 0, SLURM_STEP_RESV_PORTS="x-1"), "expected ports and ranges", id="bad-ports"),
        pytest.param(task(0, "n1", 0, SLURM_STEP_RESV_PORTS="", TFSTRATEGY_SLURM_PORT="http"),
                     "TFSTRATEGY_SLURM_PORT='http'; expected a port number", id="bad-env-port"),
        pytest.param(task(0, "n1", 0, SLURM_LOCALID="a"), "which do not parse", id="bad-local-id"),
    ],
)
def test_refused_layouts(env, message):
    with pytest.raises(ClusterConfigError, match=message) as error:
        tf_config_from_slurm(env)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, None, id="no-slurm"),
        pytest.param({"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "4"},
                     None, id="batch-script-without-srun"),
        pytest.param(task(0, "n1", 0, SLURM_STEP_NODELIST="n1", SLURM_STEP_TASKS_PER_NODE="1"), None, id="one-task"),
        pytest.param(task(0, "n1", 0, TF_CONFIG='{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'),
                     None, id="tf-config-wins"),
        pytest.param(task(0, "n1", 0, TFSTRATEGY_SLURM="off"), None, id="switched-off"),
        pytest.param(task(3, "n2", 1), 3, id="two-nodes-two-tasks"),
    ],
)
def test_when_select_builds_the_cluster_from_slurm(env, expected):
    cluster = cluster_from_slurm_step(env)

    assert (cluster.config.task_index if cluster else None) == expected


def test_resolve_request_reports_slurm_as_the_cluster_source():
    request = resolve_request(env=task(1, "n1", 1))

    assert (request.cluster_tasks, request.cluster_source) == (4, "Slurm")
    assert request.environment.describe() == (
        "Slurm job 7 step 0: worker 1 of 4 at n1:21235 (ports SLURM_STEP_RESV_PORTS=21234-21236)"
    )


def test_refused_layout_does_not_break_an_explicit_single_machine_strategy():
    env = task(0, "n1", 0, SLURM_STEP_RESV_PORTS="21240")
    with pytest.raises(ClusterConfigError):
        resolve_request(env=env)

    assert resolve_request("mirrored", env=env).cluster_source is None


def test_read_step_and_ports():
    step = read_slurm_step(task(2, "n1", 1, SLURM_DISTRIBUTION="cyclic"))

    assert step.describe() == "job 7 step 0, task 2 of 4 on n1 (local 1), nodes n1,n2"
    assert parse_port_list("5-7,9") == [5, 6, 7, 9]
