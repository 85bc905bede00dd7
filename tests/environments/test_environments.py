"""The cluster environments and their detect list, from fake environment variables (no processes)."""

from __future__ import annotations

import json
import signal

import pytest

from tfstrategy import environments
from tfstrategy.environments import (
    ENVIRONMENTS,
    detect_environment,
    environment_type,
    job_id,
    job_identity,
    preemption_signal,
    restart_count,
)
from tfstrategy.errors import ClusterConfigError, TFStrategyError


def tf_config(workers: int = 2, index: int = 1, chief: bool = False) -> str:
    cluster = {"worker": [f"h{i}:{2000 + i}" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["c0:1999"]
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


TF = {"TF_CONFIG": tf_config()}
LAUNCH = {**TF, "TFSTRATEGY_NUM_WORKERS": "2", "TFSTRATEGY_WORKER_INDEX": "1", "TFSTRATEGY_RESTART": "0"}
RAY = {**TF, "RAY_RAYLET_PID": "4321", "RAY_JOB_ID": "02000000"}
STEP = {
    "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURMD_NODENAME": "n2",
    "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_RESV_PORTS": "21234-21236",
}
BATCH = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}


def test_the_detect_list_has_one_entry_per_environment_in_precedence_order():
    assert [kind.name for kind in ENVIRONMENTS] == ["tfstrategy launch", "Ray", "TF_CONFIG", "Kubernetes", "Slurm"]
    assert len(set(ENVIRONMENTS)) == len(ENVIRONMENTS)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, None, id="nothing"),
        pytest.param({"TF_CONFIG": "  "}, None, id="blank-tf-config"),
        pytest.param(TF, "TF_CONFIG", id="tf-config"),
        pytest.param(LAUNCH, "tfstrategy launch", id="launcher"),
        pytest.param({**LAUNCH, **STEP}, "tfstrategy launch", id="launcher-inside-a-slurm-step"),
        pytest.param({**LAUNCH, "RAY_RAYLET_PID": "1"}, "tfstrategy launch", id="launcher-inside-a-ray-task"),
        pytest.param(RAY, "Ray", id="ray-train-worker"),
        pytest.param({"RAY_RAYLET_PID": "1"}, None, id="ray-task-without-tf-config"),
        pytest.param({**STEP, **RAY}, "Ray", id="ray-inside-slurm"),
        pytest.param(STEP, "Slurm", id="slurm-step"),
        pytest.param(BATCH, "Slurm", id="slurm-batch-script"),
        pytest.param({**STEP, **TF}, "TF_CONFIG", id="tf-config-wins-over-a-slurm-step"),
        pytest.param({k: v for k, v in STEP.items() if k != "SLURM_JOB_ID"}, "Slurm", id="slurm-step-without-job-id"),
    ],
)
def test_detect_picks_the_first_environment_of_the_list(env, expected):
    found = environment_type(env)

    assert (found.name if found else None) == expected
    assert [kind.name for kind in ENVIRONMENTS if kind.detect(env)][:1] == ([expected] if expected else [])


@pytest.mark.parametrize("value", ["", " ", "\x00", "x" * 100_000, "{", "-1", "ffffffff"])
def test_detect_never_raises_whatever_the_values(value):
    env = {name: value for name in ("TF_CONFIG", "TFSTRATEGY_NUM_WORKERS", "TFSTRATEGY_WORKER_INDEX", "RAY_RAYLET_PID",
                                    "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")}
    for kind in ENVIRONMENTS:
        assert kind.detect(env) in (True, False)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"TF_CONFIG": tf_config(3, 1, chief=True)}, ("TF_CONFIG", 4, 2, None, 0), id="tf-config-with-chief"),
        pytest.param({**LAUNCH, "TFSTRATEGY_RESTART": "2"}, ("tfstrategy launch", 2, 1, None, 2), id="launcher"),
        pytest.param(RAY, ("Ray", 2, 1, "ray-02000000", 0), id="ray"),
        pytest.param({**RAY, "RAY_JOB_ID": "ffffffff"}, ("Ray", 2, 1, None, 0), id="ray-prestarted-worker"),
        pytest.param({**STEP, "SLURM_RESTART_COUNT": "2"}, ("Slurm", 4, 3, "slurm-7", 2), id="slurm-step"),
        pytest.param({**STEP, "SLURM_PROCID": "1", "SLURMD_NODENAME": "n1", "SLURM_DISTRIBUTION": "cyclic"},
                     ("Slurm", 4, 1, "slurm-7", 0), id="slurm-cyclic"),
        pytest.param(BATCH, ("Slurm", 1, 0, "slurm-7", 0), id="slurm-batch-script"),
        pytest.param({**STEP, "TFSTRATEGY_SLURM": "off"}, ("Slurm", 1, 0, "slurm-7", 0), id="slurm-switched-off"),
        pytest.param({**STEP, "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURMD_NODENAME": "n1",
                      "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}, ("Slurm", 1, 0, "slurm-7", 0), id="slurm-one-task"),
    ],
)
def test_each_environment_reads_its_variables(env, expected):
    environment = detect_environment(env)

    assert environment is not None
    got = (environment.name, environment.num_workers, environment.task_index, environment.job_id(),
           environment.restart_count())
    assert got == expected
    assert environment.preemption_signal() == signal.SIGTERM
    assert "\n" not in environment.describe()
    if environment.num_workers > 1:
        config = environment.cluster_config()
        assert (config.num_workers, config.is_chief) == (expected[1], False)


@pytest.mark.parametrize(
    ("env", "describe"),
    [
        pytest.param(TF, "TF_CONFIG: worker-1 of 2 training task(s) at h1:2001", id="tf-config"),
        pytest.param({**LAUNCH, "TFSTRATEGY_RESTART": "1"}, "tfstrategy launch: worker 1 of 2 at h1:2001, restart 1",
                     id="launcher"),
        pytest.param(RAY, "Ray job 02000000: worker 1 of 2 at h1:2001", id="ray"),
        pytest.param(STEP, "Slurm job 7 step 0: worker 3 of 4 at n2:21235 (ports SLURM_STEP_RESV_PORTS=21234-21236)",
                     id="slurm-step"),
        pytest.param(BATCH, "Slurm job 7, not in a job step (a batch script without srun is one worker)", id="batch"),
        pytest.param({**STEP, "TFSTRATEGY_SLURM": "off"}, "Slurm job 7; TFSTRATEGY_SLURM=off, so every task is its own job",
                     id="slurm-off"),
    ],
)
def test_describe(env, describe):
    assert detect_environment(env).describe() == describe


def test_slurm_without_a_step_of_two_tasks_has_no_cluster_to_write():
    environment = detect_environment(BATCH)

    assert environment.sets_tf_config
    with pytest.raises(ClusterConfigError, match=r"Slurm job 7, not in a job step.*srun") as error:
        environment.cluster_config()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({**LAUNCH, "TFSTRATEGY_WORKER_INDEX": "x"}, r"TFSTRATEGY_WORKER_INDEX='x'.*as tfstrategy launch sets",
                     id="launcher-index-not-a-number"),
        pytest.param({**LAUNCH, "TFSTRATEGY_WORKER_INDEX": ""}, r"TFSTRATEGY_WORKER_INDEX=''; tfstrategy launch sets",
                     id="launcher-index-missing"),
        pytest.param({**LAUNCH, "TFSTRATEGY_RESTART": "-1"}, r"TFSTRATEGY_RESTART='-1'.*non-negative integer",
                     id="launcher-restart-negative"),
        pytest.param({k: v for k, v in LAUNCH.items() if k != "TF_CONFIG"}, r"TFSTRATEGY_NUM_WORKERS=2 without TF_CONFIG",
                     id="launcher-without-tf-config"),
        pytest.param({**LAUNCH, "TFSTRATEGY_NUM_WORKERS": "3"},
                     r"TFSTRATEGY_NUM_WORKERS=3 and TFSTRATEGY_WORKER_INDEX=1, but TF_CONFIG describes worker-1 of 2",
                     id="launcher-disagrees-with-tf-config"),
        pytest.param({"TF_CONFIG": "{"}, r"TF_CONFIG='\{', which is not valid JSON", id="tf-config-not-json"),
        pytest.param({**RAY, "TF_CONFIG": tf_config(2, 5)}, r"index must be 0..1", id="ray-tf-config-index"),
        pytest.param({**BATCH, "SLURM_RESTART_COUNT": "x"}, r"SLURM_RESTART_COUNT='x'.*as Slurm", id="slurm-restart"),
    ],
)
def test_a_bad_variable_is_one_line_naming_it(env, message):
    with pytest.raises(TFStrategyError, match=message) as error:
        detect_environment(env)
    assert "\n" not in str(error.value)


def test_a_slurm_layout_is_checked_when_the_cluster_is_needed():
    environment = detect_environment({**STEP, "SLURMD_NODENAME": "n9"})  # the job's identity reads fine

    assert environment.job_id() == "slurm-7"
    with pytest.raises(ClusterConfigError, match="SLURMD_NODENAME='n9', which is not in SLURM_STEP_NODELIST"):
        environment.num_workers  # noqa: B018


@pytest.mark.parametrize(
    ("env", "identity", "restarts"),
    [
        pytest.param({}, None, 0, id="nothing"),
        pytest.param(TF, None, 0, id="tf-config-has-no-job-id"),
        pytest.param({**STEP, "SLURM_RESTART_COUNT": "1"}, ("slurm-7", "SLURM_JOB_ID"), 1, id="slurm"),
        pytest.param({**STEP, "TFSTRATEGY_JOB_ID": "mine"}, ("mine", "TFSTRATEGY_JOB_ID"), 0, id="the-user-s-id-wins"),
        pytest.param({**BATCH, **TF}, ("slurm-7", "SLURM_JOB_ID"), 0, id="tf-config-inside-a-slurm-job"),
        pytest.param({**LAUNCH, "TFSTRATEGY_RESTART": "2", "SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "1"},
                     ("slurm-9", "SLURM_JOB_ID"), 3, id="launcher-restarts-inside-a-requeued-slurm-job"),
        pytest.param({**LAUNCH, "TFSTRATEGY_RESTART": "2", "SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "x"},
                     None, 2, id="an-invalid-environment-says-nothing"),
        pytest.param(RAY, ("ray-02000000", "RAY_JOB_ID"), 0, id="ray"),
    ],
)
def test_job_id_and_restart_count_are_read_in_one_place(env, identity, restarts):
    assert job_identity(env) == identity
    assert job_id(env) == (identity[0] if identity else None)
    assert restart_count(env) == restarts


def test_the_job_id_and_restarts_default_to_this_process_environment(monkeypatch):
    for name in ("SLURM_JOB_ID", "TFSTRATEGY_JOB_ID", "TF_CONFIG", "TFSTRATEGY_NUM_WORKERS", "TFSTRATEGY_WORKER_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "11")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "4")

    assert (job_id(), restart_count(), preemption_signal()) == ("slurm-11", 4, signal.SIGTERM)
    assert type(detect_environment()) is environments.Slurm
