"""``tfstrategy env``: the report in process (against real strategies) and through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from helpers import ROOT
from tfstrategy import TFStrategyError, select
from tfstrategy.diagnostics import env_report
from tfstrategy.diagnostics.env_report import (
    DeviceFacts,
    GPUInfo,
    collect_env_report,
    describe_build,
    describe_gpus,
    env_report_as_dict,
    format_env_report,
    keras_flavour,
    parse_nvidia_smi,
)
from tfstrategy.errors import ClusterConfigError

TWO_WORKERS = {"cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]}, "task": {"type": "worker", "index": 1}}
SCRUBBED_PREFIXES = ("TF_CONFIG", "TFSTRATEGY_", "SLURM_", "CUDA_VISIBLE_DEVICES", "TF_USE_LEGACY_KERAS")


def _short(device: str) -> str:
    kind, index = device.rsplit("device:", 1)[-1].split(":")
    return f"/{kind.lower()}:{index}"


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"TFSTRATEGY_DEVICES": "cpu:0,cpu:1"}, id="devices-from-env"),
        pytest.param({"TFSTRATEGY_CPU_REPLICAS": "2"}, id="cpu-replicas-from-env"),
        pytest.param({"TFSTRATEGY_STRATEGY": "one_device"}, id="one-device"),
        pytest.param({"TFSTRATEGY_STRATEGY": "mirrored", "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})},
                     id="one-task-cluster"),
    ],
)
def test_preview_matches_what_select_builds(env):
    # The report predicts without building; select() builds. They must agree.
    preview = collect_env_report(env).selection
    strategy = select(env=env).strategy
    assert preview.error is None
    assert preview.strategy == type(strategy).__name__
    assert preview.replicas == strategy.num_replicas_in_sync
    assert list(preview.devices) == [_short(d) for d in strategy.extended.worker_devices]


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"TFSTRATEGY_DEVICES": "/gpu:0"}, id="gpu-on-cpu-host"),
        pytest.param({"TFSTRATEGY_STRATEGY": "tpu"}, id="no-tpu"),
        pytest.param({"TFSTRATEGY_STRATEGY": "parameter_server"}, id="unknown-strategy"),
        pytest.param({"TFSTRATEGY_CPU_REPLICAS": "0"}, id="zero-cpu-replicas"),
        pytest.param({"TF_CONFIG": "[1, 2]"}, id="tf-config-not-an-object"),
    ],
)
def test_preview_reports_the_error_select_would_raise(env):
    with pytest.raises(TFStrategyError) as raised:
        select(env=env)
    report = collect_env_report(env)
    assert report.selection.error == f"{type(raised.value).__name__}: {raised.value}"
    assert report.problems, "a refused selection must be listed as a problem"
    assert "- select() would choose: nothing: it would raise" in format_env_report(report)


@pytest.mark.parametrize(
    ("raw", "summary"),
    [
        pytest.param(None, "unset", id="unset"),
        pytest.param("  ", "set but empty (ignored)", id="blank"),
        pytest.param(json.dumps(TWO_WORKERS), "worker x2; this task: worker 1; 2 training task(s)", id="two-workers"),
        pytest.param(
            json.dumps({"cluster": {"chief": ["h:1"], "worker": ["h:2"], "evaluator": ["h:3"]}, "task": {"type": "chief", "index": 0}}),
            "chief x1, worker x1, evaluator x1; this task: chief 0; 2 training task(s)",
            id="chief-worker-evaluator",
        ),
    ],
)
def test_tf_config_summary(raw, summary):
    env = {} if raw is None else {"TF_CONFIG": raw}
    report = collect_env_report(env)
    assert report.tf_config.summary() == summary
    assert f"- TF_CONFIG: {summary}" in format_env_report(report).splitlines()
    assert report.problems == ()


@pytest.mark.parametrize(
    ("raw", "summary"),
    [
        pytest.param("{bad json", "invalid (see the Problem line)", id="not-json"),
        pytest.param('"worker"', "invalid (see the Problem line)", id="not-an-object"),
        pytest.param('{"cluster": ["127.0.0.1:1"]}', "no cluster; this task: not given; invalid (see the Problem line)",
                     id="cluster-not-an-object"),
        pytest.param(json.dumps({**TWO_WORKERS, "task": {"type": "worker", "index": 2}}),
                     "worker x2; this task: worker 2; invalid (see the Problem line)", id="index-out-of-range"),
        pytest.param(json.dumps({"cluster": TWO_WORKERS["cluster"]}),
                     "worker x2; this task: not given; invalid (see the Problem line)", id="no-task"),
        pytest.param(json.dumps({"cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20001"]}, "task": TWO_WORKERS["task"]}),
                     "worker x2; this task: worker 1; invalid (see the Problem line)", id="duplicate-address"),
    ],
)
def test_tf_config_select_refuses_is_a_problem_with_selects_message(raw, summary):
    env = {"TF_CONFIG": raw}
    with pytest.raises(ClusterConfigError) as raised:
        select(env=env)  # refused while reading TF_CONFIG, before any strategy is built
    report = collect_env_report(env)
    assert report.tf_config.error == str(raised.value)
    assert report.selection.error == f"ClusterConfigError: {raised.value}"
    lines = format_env_report(report).splitlines()
    assert f"- TF_CONFIG: {summary}" in lines
    assert "- select() would choose: nothing: it would raise ClusterConfigError for TF_CONFIG (see the Problem line)" in lines
    assert [line for line in lines if line.startswith("- Problem")] == [f"- Problem: select() would raise ClusterConfigError: {raised.value}"]


def test_report_lists_this_process_devices_and_versions():
    report = collect_env_report({})
    assert report.tensorflow == tf.__version__
    assert report.devices.physical == tuple(d.name.split("physical_device:")[-1] for d in tf.config.list_physical_devices())
    assert report.devices.logical == tuple(_short(d.name) for d in tf.config.list_logical_devices())
    assert report.tf_build == dict(tf.sysconfig.get_build_info())
    assert report.devices.gpus == ()
    lines = format_env_report(report).splitlines()
    assert all(line.startswith("- ") and ": " in line for line in lines)
    keys = [line[2:].split(": ", 1)[0] for line in lines]
    assert keys[:3] == ["tfstrategy", "TensorFlow", "Keras"]
    assert f"- TensorFlow: {tf.__version__}, CPU-only build (no CUDA)" in lines


FOREIGN_NODE = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n9",
                "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}


@pytest.mark.parametrize(
    ("env", "line"),
    [
        pytest.param({}, "none (no cluster variables: one process)", id="none"),
        pytest.param({"TF_CONFIG": json.dumps(TWO_WORKERS)}, "TF_CONFIG: worker-1 of 2 training task(s) at 127.0.0.1:20002",
                     id="tf-config"),
        pytest.param({"TF_CONFIG": "{"}, "TF_CONFIG: invalid (see the Problem line)", id="tf-config-invalid"),
        # strategy='mirrored' does not need the step's cluster, so its error is on the Slurm job step line only
        pytest.param({**FOREIGN_NODE, "TFSTRATEGY_STRATEGY": "mirrored"}, "Slurm: invalid (see the Slurm job step line)",
                     id="slurm-refused-layout"),
    ],
)
def test_the_cluster_environment_line(env, line):
    lines = format_env_report(collect_env_report(env)).splitlines()

    at = lines.index(f"- Cluster environment: {line}")
    assert lines[at + 1].startswith("- TFSTRATEGY_* variables: ")  # after the environments' own lines


def test_json_dict_carries_every_slurm_variable_and_the_parsed_tf_config():
    slurm = {f"SLURM_{name}": str(i) for i, name in enumerate(["JOB_ID", "NTASKS", "PROCID", "MEM_PER_CPU", "TOPOLOGY_ADDR"])}
    report = collect_env_report({**slurm, "TF_CONFIG": json.dumps(TWO_WORKERS), "CUDA_VISIBLE_DEVICES": ""})
    values = json.loads(json.dumps(env_report_as_dict(report)))
    assert values["slurm"] == slurm
    assert values["tf_config"]["config"] == TWO_WORKERS
    assert values["selection"]["kind"] == "multi_worker" and values["selection"]["replicas"] == 2
    lines = format_env_report(report).splitlines()
    assert "- Slurm: SLURM_JOB_ID=0, SLURM_NTASKS=1, SLURM_PROCID=2 (+2 more with --json)" in lines
    assert "- CUDA_VISIBLE_DEVICES: ''" in lines


@pytest.mark.parametrize(
    ("legacy", "installed", "flavour", "problem"),
    [
        pytest.param(None, {"keras": "3.15.1"}, "3.15.1 (Keras 3, TF_USE_LEGACY_KERAS unset)", None, id="keras-3"),
        pytest.param("1", {"keras": "3.15.1", "tf_keras": "2.21.0"}, "tf_keras 2.21.0 (legacy Keras 2, TF_USE_LEGACY_KERAS=1)", None, id="tf-keras"),
        pytest.param("True", {"keras": "3.15.1"}, "none: TF_USE_LEGACY_KERAS=True asks for tf_keras", "pip install tf_keras", id="tf-keras-missing"),
        pytest.param("yes", {"keras": "3.15.1"}, "3.15.1 (Keras 3, TF_USE_LEGACY_KERAS='yes' is ignored)", "is ignored", id="unrecognised-value"),
    ],
)
def test_keras_flavour(monkeypatch, legacy, installed, flavour, problem):
    # Which packages are installed is a fact of the environment; stand in for it.
    monkeypatch.setattr(env_report, "_package_version", installed.get)
    env = {} if legacy is None else {"TF_USE_LEGACY_KERAS": legacy}
    text, found = keras_flavour(env)
    assert text.startswith(flavour)
    assert (found is None) if problem is None else (problem in found)


def test_keras_flavour_of_this_environment():
    import keras

    text, problem = keras_flavour({})
    assert text.startswith(f"{keras.__version__} (Keras {keras.__version__.split('.')[0]}")
    assert problem is None


def test_gpu_descriptions():
    # No GPU can exist here: describe made-up ones as read_device_facts would record them.
    devices = DeviceFacts(
        physical=("CPU:0", "GPU:0", "GPU:1"),
        gpus=(
            GPUInfo(name="GPU:0", model="NVIDIA A100-SXM4-40GB", compute_capability="8.0", memory_limits_mb=(2048, 2048)),
            GPUInfo(name="GPU:1", model="NVIDIA A100-SXM4-40GB", compute_capability="8.0", visible=False),
        ),
    )
    assert describe_gpus(devices) == (
        "GPU:0 NVIDIA A100-SXM4-40GB (compute 8.0, memory limit 2048 MB+2048 MB); "
        "GPU:1 NVIDIA A100-SXM4-40GB (compute 8.0, hidden by set_visible_devices)"
    )
    assert describe_gpus(DeviceFacts()) == "none visible to TensorFlow"
    assert describe_build({"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}) == "CUDA build (CUDA 12.5.1, cuDNN 9)"
    assert parse_nvidia_smi("0, NVIDIA A100-SXM4-40GB, 40960 MiB\n1, Tesla T4, 15360 MiB\n") == (
        {"index": "0", "name": "NVIDIA A100-SXM4-40GB", "memory": "40960 MiB"},
        {"index": "1", "name": "Tesla T4", "memory": "15360 MiB"},
    )


def _run(args: list[str], extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # A clean environment: the report must show only what the test sets.
    env = {key: value for key, value in os.environ.items() if not key.startswith(SCRUBBED_PREFIXES)}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", **(extra_env or {})})
    return subprocess.run(args, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)


@pytest.mark.slow
def test_cli_without_tf_config():
    result = _run([sys.executable, "-m", "tfstrategy", "env"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "- TF_CONFIG: unset" in lines
    assert "- TensorFlow runtime: not started (logical devices can still be split)" in lines
    assert "- select() would choose: MirroredStrategy on /cpu:0, 1 replica in sync (auto: one machine, so MirroredStrategy; " \
        "devices not restricted: the CPU, as no GPU is visible; strategy from default)" in lines
    assert not any(line.startswith("- Problem") for line in lines)


@pytest.mark.slow
def test_cli_json_with_tf_config():
    result = _run([sys.executable, "-m", "tfstrategy", "env", "--json"], {"TF_CONFIG": json.dumps(TWO_WORKERS)})
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout)
    assert values["tf_config"]["config"] == TWO_WORKERS
    assert values["tf_config"]["tasks"] == 2
    assert values["selection"]["strategy"] == "MultiWorkerMirroredStrategy"
    assert values["devices"]["runtime_started"] is False
    assert values["problems"] == []


@pytest.mark.slow
def test_cli_bad_tf_config_is_a_clear_line_not_a_traceback():
    result = _run([sys.executable, "-m", "tfstrategy", "env"], {"TF_CONFIG": '{"cluster": {'})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "- TF_CONFIG: invalid (see the Problem line)" in result.stdout
    assert "- Problem: select() would raise ClusterConfigError: Received TF_CONFIG='{\"cluster\": {', which is not valid JSON" in result.stdout


REPORT_THEN_SPLIT = """
import json
import tfstrategy
from tensorflow.python.eager import context

from tfstrategy.diagnostics.env_report import collect_env_report

report = collect_env_report()
untouched = context.context()._context_handle is None
selection = tfstrategy.select(cpu_replicas=2)
print(json.dumps({"untouched": untouched, "logical": report.devices.logical,
                  "replicas": selection.num_replicas}))
"""


@pytest.mark.slow
def test_report_leaves_the_runtime_unstarted_so_a_later_split_works():
    result = _run([sys.executable, "-c", REPORT_THEN_SPLIT])
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values == {"untouched": True, "logical": ["/cpu:0"], "replicas": 2}
