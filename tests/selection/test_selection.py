"""Strategy selection: the pure rules with made-up hosts, then real strategies."""

from __future__ import annotations

import pytest
import tensorflow as tf

from tfstrategy import select
from tfstrategy.errors import RuntimeInitializedError, SettingsConflictError, StrategyError
from tfstrategy.selection.choose import choose
from tfstrategy.selection.devices import parse_devices
from tfstrategy.selection.host import HostInfo
from tfstrategy.settings import StrategyKind, resolve_setting

AUTO = StrategyKind.AUTO


def _choose(kind=AUTO, devices=None, cpu_replicas=None, host=None, cluster_tasks=0):
    return choose(kind=kind, devices=parse_devices(devices), cpu_replicas=cpu_replicas, host=host or HostInfo(), cluster_tasks=cluster_tasks)


@pytest.mark.parametrize(
    ("kwargs", "kind", "devices"),
    [
        pytest.param({}, StrategyKind.MIRRORED, ["/cpu:0"], id="cpu-only-host-one-replica"),
        pytest.param({"host": HostInfo(gpus=1)}, StrategyKind.MIRRORED, ["/gpu:0"], id="one-gpu"),
        pytest.param({"host": HostInfo(gpus=4)}, StrategyKind.MIRRORED, ["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"], id="every-gpu"),
        pytest.param({"host": HostInfo(gpus=4), "devices": "gpu:0,gpu:1"}, StrategyKind.MIRRORED, ["/gpu:0", "/gpu:1"], id="restricted"),
        pytest.param({"host": HostInfo(cpus=4), "cpu_replicas": 4}, StrategyKind.MIRRORED, ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"], id="cpu-replicas"),
        pytest.param({"host": HostInfo(cpus=4), "cpu_replicas": 2}, StrategyKind.MIRRORED, ["/cpu:0", "/cpu:1"], id="fewer-than-split"),
        pytest.param({"cluster_tasks": 2}, StrategyKind.MULTI_WORKER, ["/cpu:0"], id="cluster-means-multi-worker"),
        pytest.param({"cluster_tasks": 1}, StrategyKind.MIRRORED, ["/cpu:0"], id="one-task-cluster-stays-local"),
        pytest.param({"kind": StrategyKind.ONE_DEVICE, "host": HostInfo(gpus=2)}, StrategyKind.ONE_DEVICE, ["/gpu:0"], id="one-device-first-gpu"),
        pytest.param({"kind": StrategyKind.ONE_DEVICE, "devices": "/gpu:1", "host": HostInfo(gpus=2)}, StrategyKind.ONE_DEVICE, ["/gpu:1"], id="one-device-chosen"),
        pytest.param({"kind": StrategyKind.DEFAULT}, StrategyKind.DEFAULT, [], id="default"),
        pytest.param({"kind": StrategyKind.TPU, "host": HostInfo(tpus=8)}, StrategyKind.TPU, [], id="tpu-present"),
    ],
)
def test_choose(kwargs, kind, devices):
    choice = _choose(**kwargs)
    assert choice.kind is kind
    assert [str(d) for d in choice.devices] == devices
    assert choice.reasons


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"kind": StrategyKind.TPU}, "no TPU TensorFlow can see", id="tpu-absent"),
        pytest.param({"kind": StrategyKind.DEFAULT, "devices": "cpu"}, "does not take devices", id="default-with-devices"),
        pytest.param({"kind": StrategyKind.ONE_DEVICE, "devices": "gpu", "host": HostInfo(gpus=2)}, "exactly one", id="one-device-two"),
        pytest.param({"cpu_replicas": 2, "devices": "gpu", "host": HostInfo(cpus=2, gpus=1)}, "exclude each other", id="cpu-replicas-with-gpus"),
        pytest.param({"cluster_tasks": 2, "cpu_replicas": 2}, "tfstrategy launch", id="multi-worker-cpu-replicas"),
        pytest.param({"kind": StrategyKind.MULTI_WORKER, "devices": "gpu:0"}, "does not take devices", id="multi-worker-devices"),
    ],
)
def test_choose_rejects(kwargs, message):
    with pytest.raises(StrategyError, match="Received") as error:
        _choose(**kwargs)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("argument", "env", "expected", "source"),
    [
        pytest.param(None, {}, "auto", "default", id="default"),
        pytest.param(None, {"TFSTRATEGY_STRATEGY": "mirrored"}, "mirrored", "env TFSTRATEGY_STRATEGY", id="env"),
        pytest.param("mirrored", {}, "mirrored", "argument", id="argument"),
        pytest.param("mirrored", {"TFSTRATEGY_STRATEGY": "Mirrored"}, "mirrored", "argument", id="agreeing"),
        pytest.param(None, {"TFSTRATEGY_STRATEGY": " "}, "auto", "default", id="blank-env-ignored"),
    ],
)
def test_setting_precedence(argument, env, expected, source):
    setting = resolve_setting("strategy", argument, "TFSTRATEGY_STRATEGY", "auto", env)
    assert (setting.value, setting.source) == (expected, source)


def test_conflict_between_code_and_environment_names_both():
    with pytest.raises(SettingsConflictError) as error:
        select(strategy="one_device", env={"TFSTRATEGY_STRATEGY": "mirrored"})
    message = str(error.value)
    assert "strategy='one_device'" in message and "TFSTRATEGY_STRATEGY='mirrored'" in message
    assert "Remove strategy=" in message


def test_devices_agree_across_spellings():
    selection = select(devices=["/cpu:0"], env={"TFSTRATEGY_DEVICES": "cpu:0"})
    assert selection.sources["devices"] == "argument"


def test_unknown_strategy_lists_kinds():
    with pytest.raises(StrategyError, match="expected one of: auto, mirrored, one_device, default, multi_worker, tpu"):
        select(strategy="horovod", env={})


@pytest.mark.parametrize("value", [0, -2, "four", 1.5, True])
def test_bad_cpu_replicas(value):
    with pytest.raises(StrategyError, match=f"Received cpu_replicas={value!r}"):
        select(cpu_replicas=value, env={})


def test_select_default_uses_every_logical_cpu_when_the_cpu_was_split():
    # conftest split the CPU into 4; an unsplit CPU gives 1 replica (see test_check's CLI tests).
    selection = select(env={})
    assert isinstance(selection.strategy, tf.distribute.MirroredStrategy)
    assert selection.num_replicas == 4
    assert "no GPU is visible" in selection.explain()


def test_explain_is_one_short_why_and_the_steps_and_workarounds_only_when_verbose():
    selection = select(cpu_replicas=4, env={"TFSTRATEGY_PRECISION": "float32"})
    short, verbose = selection.explain(), selection.explain(verbose=True)
    assert short.startswith("auto: ") and "cpu_replicas from argument" in short and "precision from" in short
    assert len(short) <= 200 and "strategy from default" not in short, short
    for detail in ("strategy from default", "record_creation_sites: ", "apply_patches: keras_"):
        assert detail not in short and detail in verbose, (detail, verbose)
    assert verbose.startswith(short.split("; cpu_replicas from")[0])


def test_select_cpu_replicas_from_environment():
    selection = select(env={"TFSTRATEGY_CPU_REPLICAS": "4"})
    assert selection.num_replicas == 4
    assert selection.sources["cpu_replicas"] == "env TFSTRATEGY_CPU_REPLICAS"
    assert [d.rsplit(":", 1)[-1] for d in selection.strategy.extended.worker_devices] == ["0", "1", "2", "3"]


@pytest.mark.parametrize(
    ("kwargs", "cls", "replicas"),
    [
        pytest.param({"strategy": "mirrored", "devices": "cpu:0,cpu:1"}, tf.distribute.MirroredStrategy, 2, id="mirrored-2"),
        pytest.param({"strategy": "one_device"}, tf.distribute.OneDeviceStrategy, 1, id="one-device"),
        pytest.param({"strategy": "default"}, type(tf.distribute.get_strategy()), 1, id="default"),
    ],
)
def test_select_builds_real_strategies(kwargs, cls, replicas):
    selection = select(**kwargs, env={})
    assert isinstance(selection.strategy, cls)
    assert selection.num_replicas == replicas


def test_cpu_replicas_after_runtime_started_says_to_call_first():
    with pytest.raises(RuntimeInitializedError, match="before any other TensorFlow call"):
        select(cpu_replicas=8, env={})


def test_cpu_device_beyond_split_is_an_error_not_a_hang():
    with pytest.raises(Exception, match=r"Received devices=\['/cpu:0', '/cpu:7'\]"):
        select(devices=["/cpu:0", "/cpu:7"], env={})
