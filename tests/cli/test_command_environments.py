"""The ``TFSTRATEGY_*`` variables ``tfstrategy run`` and ``tfstrategy k8s`` hand the script, pinned for a few flag sets.

Each setting has one writer (its ``settings.Variable``, through ``WorkerSettings`` where a command hands on
several): these pins were written before ``run`` moved onto it, so the move changed no variable. No TensorFlow.
"""

from __future__ import annotations

import os
import sys

import pytest

from tfstrategy.cli import build_parser
from tfstrategy.cli.k8s import options_from_args as k8s_options
from tfstrategy.cli.run import run_environment
from tfstrategy.kubernetes.manifests import pod_command, pod_environment
from tfstrategy.worker_contract import STARTUP_DIR

HOOK_PATH = f"{STARTUP_DIR}{os.pathsep}/user/site"
HOOKED = {"PYTHONPATH": HOOK_PATH, "TFSTRATEGY_HOOK": "1", "TFSTRATEGY_HOOK_SUMMARY": "1"}


@pytest.fixture
def clean_environ(monkeypatch):
    """No ``TFSTRATEGY_*`` or TensorFlow log level of the caller's, and a known ``PYTHONPATH``."""
    for key in list(os.environ):
        if key.startswith("TFSTRATEGY_") or key == "TF_CPP_MIN_LOG_LEVEL":
            monkeypatch.delenv(key)
    monkeypatch.setenv("PYTHONPATH", "/user/site")
    return monkeypatch


@pytest.mark.parametrize(
    ("flags", "given", "expected"),
    [
        pytest.param([], {}, {**HOOKED, "TFSTRATEGY_AUDIT": "warn", "TF_CPP_MIN_LOG_LEVEL": "2"}, id="no-flags"),
        pytest.param(["--cpu-replicas", "2", "--devices", "cpu", "--audit", "stop", "--debug", "--precision",
                      "Mixed-Float16"], {},
                     {**HOOKED, "TFSTRATEGY_AUDIT": "stop", "TFSTRATEGY_CPU_REPLICAS": "2", "TFSTRATEGY_DEBUG": "1",
                      "TFSTRATEGY_DEVICES": "cpu", "TFSTRATEGY_PRECISION": "mixed_float16", "TF_CPP_MIN_LOG_LEVEL": "0"},
                     id="strategy-flags-debug-precision"),
        pytest.param(["--profile", "--profile-dir", "/tmp/prof", "--profile-every", "2.5", "--profile-probes", "0.25",
                      "--audit", "off"], {},
                     {**HOOKED, "TFSTRATEGY_AUDIT": "off", "TFSTRATEGY_PROFILE": "/tmp/prof",
                      "TFSTRATEGY_PROFILE_EVERY": "2.5", "TFSTRATEGY_PROFILE_PROBES": "0.25", "TF_CPP_MIN_LOG_LEVEL": "2"},
                     id="profile"),
        pytest.param(["--profile", "--profile-dir", "/tmp/prof", "--profile-every", "10"], {},
                     {**HOOKED, "TFSTRATEGY_AUDIT": "warn", "TFSTRATEGY_PROFILE": "/tmp/prof",
                      "TFSTRATEGY_PROFILE_EVERY": "10", "TF_CPP_MIN_LOG_LEVEL": "2"}, id="profile-whole-minutes"),
        pytest.param(["--precision", "mixed_float16"],
                     {"TFSTRATEGY_HOOK_PID": "123", "TF_CPP_MIN_LOG_LEVEL": "1", "TFSTRATEGY_PRECISION": "mixed_float16",
                      "TFSTRATEGY_DEVICES": "gpu:0", "TFSTRATEGY_PROFILE": "/elsewhere"},
                     {**HOOKED, "TFSTRATEGY_AUDIT": "warn", "TFSTRATEGY_DEVICES": "gpu:0",
                      "TFSTRATEGY_PRECISION": "mixed_float16", "TFSTRATEGY_PROFILE": "/elsewhere",
                      "TF_CPP_MIN_LOG_LEVEL": "1"}, id="the-callers-variables-kept-but-the-hook-pid"),
    ],
)
def test_run_hands_the_script_these_variables(flags, given, expected, clean_environ):
    for key, value in given.items():
        clean_environ.setenv(key, value)
    _, env = run_environment(build_parser().parse_args(["run", *flags, "--", sys.executable, "-c", "pass"]))
    assert {key: value for key, value in env.items()
            if key.startswith(("TFSTRATEGY_", "TF_CPP_")) or key == "PYTHONPATH"} == expected


def _shown(entry: dict) -> str:
    """One ``env`` entry of a container: ``NAME=value``, or ``NAME<-`` where Kubernetes takes it from."""
    if "value" in entry:
        return f"{entry['name']}={entry['value']}"
    source = entry["valueFrom"]
    where = source["fieldRef"]["fieldPath"] if "fieldRef" in source else f"secret {source['secretKeyRef']['name']}"
    return f"{entry['name']}<-{where}"


POD = ["TFSTRATEGY_K8S_JOB<-metadata.labels['batch.kubernetes.io/job-name']", "TFSTRATEGY_K8S_SERVICE=train",
       "TFSTRATEGY_K8S_WORKERS=2", "TFSTRATEGY_K8S_PORT=2222",
       "TFSTRATEGY_K8S_FAILURES<-metadata.annotations['batch.kubernetes.io/job-index-failure-count']",
       "TFSTRATEGY_K8S_IGNORED_FAILURES<-metadata.annotations['batch.kubernetes.io/job-index-ignored-failure-count']",
       "TFSTRATEGY_JOB_ID<-metadata.labels['batch.kubernetes.io/job-name']"]


@pytest.mark.parametrize(
    ("flags", "env", "command"),
    [
        pytest.param(["-n", "2"], POD, ["tfstrategy", "run", "--", "python", "train.py"], id="minimal"),
        pytest.param(["-n", "2", "--backup-pvc", "b", "--backup-dir", "/mnt/ckpt/", "--env", "A=1", "--audit", "stop",
                      "--precision", "mixed_bfloat16"], [*POD, "TFSTRATEGY_BACKUP_DIR=/mnt/ckpt/", "A=1"],
                     ["tfstrategy", "run", "--audit", "stop", "--precision", "mixed_bfloat16", "--", "python", "train.py"],
                     id="backups-env-run-options"),
        pytest.param(["-n", "2", "--no-hook", "--backup-pvc", "b"], [*POD, "TFSTRATEGY_BACKUP_DIR=/backups"],
                     ["python", "train.py"], id="no-hook"),
        pytest.param(["--elastic", "2:4", "--backup-pvc", "b", "--launch-secret", "s"],
                     ["TFSTRATEGY_NODE_RANK<-metadata.annotations['batch.kubernetes.io/job-completion-index']",
                      "TFSTRATEGY_LAUNCH_SECRET<-secret s", "TFSTRATEGY_JOB_ID<-metadata.labels['batch.kubernetes.io/job-name']"],
                     ["tfstrategy", "launch", "--nnodes", "2:4", "--master", "train-0.train:2223", "--node-address",
                      "train-$(TFSTRATEGY_NODE_RANK).train", "-n", "1", "--port-range", "2222-2222", "--backup-dir",
                      "/backups", "--grace", "25", "--", "python", "train.py"], id="elastic"),
    ],
)
def test_k8s_hands_each_pod_these_variables(flags, env, command):
    options = k8s_options(build_parser().parse_args(["k8s", "--image", "x", *flags, "--", "python", "train.py"]))
    assert [_shown(entry) for entry in pod_environment(options)] == env
    assert pod_command(options) == command
