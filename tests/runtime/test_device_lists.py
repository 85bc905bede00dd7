"""Device lists as TensorFlow reads them, and the hook's policy for one a script wrote (pure, fast)."""

from __future__ import annotations

from collections import namedtuple

import pytest

from tfstrategy.runtime import device_lists, one_job
from tfstrategy.runtime.device_lists import decide_listed, local_view, read_device_list, replicas_note
from tfstrategy.selection.devices import Device
from tfstrategy.selection.host import HostInfo

CPU0, CPU1, CPU2, CPU3, GPU0, GPU1 = (Device("CPU", 0), Device("CPU", 1), Device("CPU", 2), Device("CPU", 3),
                                      Device("GPU", 0), Device("GPU", 1))
#: The shape of tf.config.LogicalDevice (a namedtuple of name and device_type), without starting TensorFlow.
LogicalDevice = namedtuple("LogicalDevice", ["name", "device_type"])
FOUR_CPUS = (CPU0, CPU1, CPU2, CPU3)
WORKER1 = ("worker", 1)


def logical(kind: str, count: int, prefix: str = "/job:localhost/replica:0/task:0") -> list[LogicalDevice]:
    return [LogicalDevice(f"{prefix}/device:{kind}:{index}", kind) for index in range(count)]


@pytest.mark.parametrize(
    ("devices", "task", "local", "foreign"),
    [
        pytest.param([], None, (), (), id="empty"),
        pytest.param(logical("GPU", 0), None, (), (), id="list_logical_devices-GPU-on-a-cpu-host"),
        pytest.param(logical("CPU", 4), None, FOUR_CPUS, (), id="list_logical_devices-CPU"),
        pytest.param(logical("GPU", 2), None, (GPU0, GPU1), (), id="logical-gpus"),
        pytest.param(["/cpu:0", "CPU:1"], None, (CPU0, CPU1), (), id="strings"),
        pytest.param(["/device:GPU:1", "/gpu:0"], None, (GPU1, GPU0), (), id="device-strings"),
        pytest.param([0, 1], None, (GPU0, GPU1), (), id="gpu-ids"),
        pytest.param("/cpu:0,/cpu:1", None, (CPU0, CPU1), (), id="one-string"),
        pytest.param(("/gpu:0", LogicalDevice("/job:localhost/replica:0/task:0/device:GPU:1", "GPU")), None,
                     (GPU0, GPU1), (), id="mixed-tuple"),
        pytest.param(["/job:worker/replica:0/task:1/device:CPU:0"], WORKER1, (CPU0,), (), id="own-task-name"),
        pytest.param(["/job:worker/replica:0/task:0/device:CPU:0"], WORKER1, (),
                     ("/job:worker/replica:0/task:0/device:CPU:0",), id="another-tasks-name"),
        pytest.param(logical("CPU", 1, "/job:worker/replica:0/task:0") + logical("CPU", 1, "/job:worker/replica:0/task:1"),
                     ("worker", 0), (CPU0,), ("/job:worker/replica:0/task:1/device:CPU:0",), id="the-clusters-devices"),
        pytest.param(["/job:worker/replica:0/task:1/device:CPU:0"], None, (),
                     ("/job:worker/replica:0/task:1/device:CPU:0",), id="a-task-name-without-a-cluster"),
    ],
)
def test_every_form_tensorflow_accepts_is_read(devices, task, local, foreign):
    listed = read_device_list(devices, task)
    assert not listed.unreadable, listed.unreadable
    assert listed.local == local and listed.foreign == foreign
    assert listed.every_local_device == (not devices)


@pytest.mark.parametrize("devices", [[object()], [True], [-1], ["/tpu:0"], ["nonsense"], ["/cpu:0", "CPU:0"], 3])
def test_what_tfstrategy_cannot_read_is_left_to_tensorflow(devices):
    listed = read_device_list(devices)
    assert listed.unreadable and not listed.every_local_device and not listed.readable_local


def test_a_logical_devices_name_is_what_messages_show():
    listed = read_device_list(logical("CPU", 2))
    assert listed.shown() == "['/job:localhost/replica:0/task:0/device:CPU:0', '/job:localhost/replica:0/task:0/device:CPU:1']"


# -- under `tfstrategy run`: plain TensorFlow's answer, a stop for a missing device, a note only when true ---------


FOUR_CPU_HOST = HostInfo(cpus=4)


def _run(devices, *, chosen=None, host=FOUR_CPU_HOST, settings=(), warn_only=False):
    return decide_listed(read_device_list(devices), where="train.py:7", chosen=chosen, host=host, settings=settings,
                         warn_only=warn_only)


@pytest.mark.parametrize("devices", [[], logical("GPU", 0)])
def test_an_empty_list_is_every_device_tfstrategy_would_use(devices):
    decision = _run(devices, chosen=FOUR_CPUS, settings=["--cpu-replicas 4"])
    assert decision.use == tuple(device.tf_name for device in FOUR_CPUS)
    assert not decision.note and not decision.stop
    # the exit summary says the list was replaced (list_logical_devices('GPU') on a CPU host is [] too)
    assert decision.change == ("MirroredStrategy(devices=[]) at train.py:7 (an empty list: every local device) given "
                               "the 4 device(s) of --cpu-replicas 4")


def test_an_empty_list_without_settings_is_left_as_plain_tensorflow_reads_it():
    assert _run([], host=HostInfo(cpus=1)) == device_lists.ListedDecision()


@pytest.mark.parametrize(
    "devices",
    [
        pytest.param(["/device:CPU:0", "/device:CPU:1", "/device:CPU:2", "/device:CPU:3"], id="what-select-passes"),
        pytest.param(logical("CPU", 4), id="list_logical_devices-CPU"),
        pytest.param(["/cpu:3", "/cpu:2", "/cpu:1", "/cpu:0"], id="any-order"),
    ],
)
def test_a_list_naming_what_tfstrategy_would_use_gets_no_note(devices):
    decision = _run(devices, chosen=FOUR_CPUS, settings=["--cpu-replicas 4"])
    assert decision == device_lists.ListedDecision()


def test_a_list_that_differs_from_the_settings_is_noted_once_in_one_line():
    decision = _run(["/cpu:0", "/cpu:1"], chosen=FOUR_CPUS, settings=["--cpu-replicas 4"])
    assert decision.use is None and not decision.stop
    assert decision.note == ("MirroredStrategy(devices=['/cpu:0', '/cpu:1']) at train.py:7 names its own devices, so "
                             "--cpu-replicas 4 had no effect on it; remove the list from the script to use them")


def test_a_list_without_settings_gets_no_note():
    assert _run(["/cpu:0", "/cpu:1"]) == device_lists.ListedDecision()


@pytest.mark.parametrize(
    ("devices", "host", "has"),
    [
        pytest.param(["/gpu:0"], HostInfo(cpus=1), "this host has ['/cpu:0']", id="gpu-on-a-cpu-host"),
        pytest.param([LogicalDevice("/job:localhost/replica:0/task:0/device:GPU:2", "GPU")], HostInfo(cpus=1, gpus=2),
                     "this host has ['/cpu:0', '/gpu:0', '/gpu:1']", id="a-gpu-past-the-last"),
        pytest.param(["/cpu:0", "/cpu:7"], HostInfo(cpus=4), "this host has ['/cpu:0', '/cpu:1', '/cpu:2', '/cpu:3']",
                     id="a-cpu-past-the-split"),
    ],
)
def test_a_listed_device_the_host_lacks_stops_with_one_line(devices, host, has):
    decision = _run(devices, host=host)
    assert decision.stop.startswith("tfstrategy stopped MirroredStrategy(devices=")
    assert " at train.py:7: Received devices=" in decision.stop and has in decision.stop
    assert "\n" not in decision.stop and decision.use is None
    warned = _run(devices, host=host, warn_only=True)
    assert not warned.stop and has in warned.note


@pytest.mark.parametrize("devices", [["/job:worker/replica:0/task:1/device:CPU:0"], [object()]])
def test_lists_tfstrategy_cannot_read_are_left_to_tensorflow_under_run(devices):
    assert _run(devices, chosen=FOUR_CPUS, settings=["--cpu-replicas 4"]) == device_lists.ListedDecision()


# -- under `tfstrategy launch`: one job when the list names every local device -------------------------------------


@pytest.mark.parametrize(
    ("devices", "gpus", "action"),
    [
        pytest.param(None, 0, one_job.JOIN, id="no-devices"),
        pytest.param([], 0, one_job.JOIN, id="empty"),
        pytest.param(logical("GPU", 0), 0, one_job.JOIN, id="list_logical_devices-GPU-on-a-cpu-host"),
        pytest.param(logical("CPU", 1), 0, one_job.JOIN, id="list_logical_devices-CPU"),
        pytest.param(logical("GPU", 2), 2, one_job.JOIN, id="list_logical_devices-GPU"),
        pytest.param(["/job:worker/replica:0/task:1/device:CPU:0"], 0, one_job.JOIN, id="own-task-name"),
        pytest.param([1, 0], 2, one_job.JOIN, id="gpu-ids"),
        pytest.param(["/job:worker/replica:0/task:0/device:CPU:0"], 0, one_job.REFUSE, id="another-tasks-device"),
        pytest.param(logical("CPU", 1, "/job:worker/replica:0/task:0") + logical("CPU", 1, "/job:worker/replica:0/task:1"),
                     0, one_job.REFUSE, id="the-clusters-devices"),
        pytest.param(logical("GPU", 1), 2, one_job.REFUSE, id="a-subset-of-gpus"),
        pytest.param([object()], 0, one_job.REFUSE, id="unreadable"),
    ],
)
def test_launch_joins_a_list_naming_every_local_device(devices, gpus, action):
    listed = None if devices is None else read_device_list(devices, WORKER1)
    decision = one_job.decide_mirrored(listed, one_job.worker_devices(gpus), 2)
    assert decision.action == action
    if action == one_job.REFUSE:
        assert decision.message.startswith("tfstrategy refused MirroredStrategy(devices=[") and "\n" not in decision.message


def test_a_launched_worker_lists_its_own_devices_as_a_lone_process_does():
    cluster = [(f"/job:worker/replica:0/task:{task}/device:{kind}:{index}", kind)
               for task in (0, 1) for kind, count in (("CPU", 1), ("GPU", 2)) for index in range(count)]
    assert local_view(cluster, WORKER1) == [
        ("/job:localhost/replica:0/task:0/device:CPU:0", "CPU"),
        ("/job:localhost/replica:0/task:0/device:GPU:0", "GPU"),
        ("/job:localhost/replica:0/task:0/device:GPU:1", "GPU"),
    ]
    local = [("/job:localhost/replica:0/task:0/device:CPU:0", "CPU")]
    assert local_view(local, WORKER1) == local  # before the cluster is configured: as it is
    # What the view lists joins the job.
    listed = read_device_list([name for name, kind in local_view(cluster, WORKER1) if kind == "GPU"], WORKER1)
    assert one_job.decide_mirrored(listed, one_job.worker_devices(2), 2).action == one_job.JOIN


@pytest.mark.parametrize("kind", ["OneDeviceStrategy", "MultiWorkerMirroredStrategy"])
def test_cpu_replicas_on_a_strategy_it_cannot_change_is_one_note(kind):
    note = replicas_note(kind, "4", "train.py:3")
    assert note.startswith(f"{kind} at train.py:3: --cpu-replicas 4 has no effect on this strategy (")
    assert "MirroredStrategy() to train on 4 replicas" in note and "\n" not in note
    assert replicas_note(kind, None, "train.py:3") == ""
    assert replicas_note("MirroredStrategy", "4", "train.py:3") == ""
