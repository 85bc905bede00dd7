"""KubernetesEnvironment: a pod of a generated Indexed Job, read from the variables the manifest gives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from k8s_pods import pod_environment

from tfstrategy.cli import build_parser
from tfstrategy.cli.k8s import options_from_args
from tfstrategy.environments import ENVIRONMENTS, detect_environment, job_identity, restart_count
from tfstrategy.environments.kubernetes import KubernetesEnvironment
from tfstrategy.errors import ClusterConfigError
from tfstrategy.kubernetes import manifests
from tfstrategy.kubernetes.manifests import POD_VARIABLES


def job(*flags: str) -> dict:
    args = build_parser().parse_args(["k8s", "--image", "x", *flags, "--", "python", "train.py"])
    return manifests(options_from_args(args))[-1]


def test_each_pod_of_the_generated_job_is_its_worker_of_one_cluster_of_stable_hostnames():
    four = job("-n", "4", "--name", "train", "--port", "2345")
    configs = [KubernetesEnvironment(pod_environment(four, i)).cluster_config() for i in range(4)]
    assert [config.task_index for config in configs] == [0, 1, 2, 3]
    assert {config.cluster["worker"] for config in configs} == {tuple(f"train-{i}.train:2345" for i in range(4))}
    environment = detect_environment(pod_environment(four, 2))
    assert isinstance(environment, KubernetesEnvironment) and environment.sets_tf_config
    assert (environment.num_workers, environment.task_index) == (4, 2)
    assert environment.describe() == "Kubernetes Indexed Job train, 4 pods"
    assert environment.job_id() == "train" and job_identity(pod_environment(four, 2)) == ("train", "TFSTRATEGY_JOB_ID")


@pytest.mark.parametrize(("failures", "ignored", "count"), [(0, 0, 0), (2, 0, 2), (1, 3, 4)])
def test_the_restart_count_is_the_pods_retries_of_its_index_counted_or_ignored(failures, ignored, count):
    env = pod_environment(job("-n", "2"), 1, failures=failures, ignored=ignored)
    assert KubernetesEnvironment(env).restart_count() == count
    assert restart_count(env) == count


def test_an_indexed_job_tfstrategy_did_not_write_is_not_detected_and_an_explicit_tf_config_wins():
    assert not KubernetesEnvironment.detect({"JOB_COMPLETION_INDEX": "0"})
    assert detect_environment({"JOB_COMPLETION_INDEX": "0"}) is None
    env = {**pod_environment(job("-n", "2"), 0),
           "TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}'}
    assert detect_environment(env).name == "TF_CONFIG"
    assert ENVIRONMENTS.index(KubernetesEnvironment) == len(ENVIRONMENTS) - 2  # after TF_CONFIG, before Slurm


GOOD = pod_environment(job("-n", "4", "--name", "train"), 3)
BAD_VALUES = {
    "JOB_COMPLETION_INDEX": [None, "", "4", "-1", "x", "1.0", "\u0663", "9" * 40],
    "TFSTRATEGY_K8S_JOB": [None, "", "Train", "-train", "a_b", "a" * 64],
    "TFSTRATEGY_K8S_SERVICE": [None, "", "svc.x", "UP"],
    "TFSTRATEGY_K8S_WORKERS": [None, "", "0", "two", "+4"],
    "TFSTRATEGY_K8S_PORT": [None, "0", "65536", "22x"],
    "TFSTRATEGY_K8S_FAILURES": ["-1", "one", "1e2"],
    "TFSTRATEGY_K8S_IGNORED_FAILURES": ["x", "-3"],
}
CASES = [pytest.param(name, value, id=f"{name}={value!r}"[:60]) for name, values in BAD_VALUES.items() for value in values]


@pytest.mark.parametrize(("name", "value"), CASES)
def test_a_bad_or_missing_variable_is_one_line_naming_it_and_the_manifest_field_that_sets_it(name, value):
    env = dict(GOOD)
    if value is None:
        del env[name]
    else:
        env[name] = value
    assert KubernetesEnvironment.detect(env)
    with pytest.raises(ClusterConfigError) as raised:
        detect_environment(env)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("Received ")
    assert name in message and POD_VARIABLES[name] in message


def test_the_index_must_fit_the_worker_count_and_a_long_name_its_hostnames():
    env = {**GOOD, "TFSTRATEGY_K8S_WORKERS": "3"}
    with pytest.raises(ClusterConfigError, match=r"JOB_COMPLETION_INDEX='3'.*0\.\.2"):
        KubernetesEnvironment(env)
    env = {**GOOD, "TFSTRATEGY_K8S_JOB": "a" * 62, "TFSTRATEGY_K8S_WORKERS": "10", "JOB_COMPLETION_INDEX": "0"}
    with pytest.raises(ClusterConfigError, match="at most 63 characters"):
        KubernetesEnvironment(env)


def test_detect_never_raises():
    class Odd(dict):
        def __contains__(self, key):
            raise RuntimeError("odd")

    assert KubernetesEnvironment.detect(Odd()) is False


def test_tfstrategy_env_in_a_pod_names_the_job_and_select_would_form_one_multi_worker_job():
    env = {**pod_environment(job("-n", "4", "--name", "train"), 1, failures=1), "PATH": os.environ["PATH"],
           "PYTHONPATH": os.pathsep.join(sys.path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "tfstrategy", "env", "--json"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["environment"] == "Kubernetes Indexed Job train, 4 pods"
    assert report["kubernetes_pod"] == ("Kubernetes Indexed Job train, 4 pods: this pod is worker 1 at "
                                        "train-1.train:2222, retry 1")
    assert report["selection"]["strategy"] == "MultiWorkerMirroredStrategy"
    assert "auto: the Kubernetes Indexed Job has 4 tasks, so MultiWorkerMirroredStrategy" in report["selection"]["reasons"]
    assert report["select_steps"][0] == "set_tf_config"
