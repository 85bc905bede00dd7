"""One job or a clear refusal: the pure decisions, and the rewrites' undo (fast)."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from tfstrategy.runtime import one_job
from tfstrategy.runtime.device_lists import read_device_list
from tfstrategy.runtime.rewrites import Rewrite, install_rewrite, remove_rewrites
from tfstrategy.selection.host import HostInfo
from tfstrategy.worker_contract import EXIT_STOPPED, STOP_PREFIXES


@pytest.mark.parametrize(
    ("devices", "gpus", "action"),
    [
        pytest.param(None, 0, one_job.JOIN, id="no-devices"),
        pytest.param(["/cpu:0"], 0, one_job.JOIN, id="the-workers-cpu"),
        pytest.param(["/gpu:0", "/gpu:1"], 2, one_job.JOIN, id="every-gpu"),
        pytest.param(["/gpu:1", "/gpu:0"], 2, one_job.JOIN, id="every-gpu-any-order"),
        pytest.param([], 0, one_job.JOIN, id="empty-list-is-every-local-device"),
        pytest.param([], 2, one_job.JOIN, id="empty-list-on-a-gpu-worker"),
        pytest.param([types.SimpleNamespace(name="/job:localhost/replica:0/task:0/device:CPU:0", device_type="CPU")], 0,
                     one_job.JOIN, id="logical-devices"),
        pytest.param(["/cpu:0", "/cpu:1"], 0, one_job.REFUSE, id="logical-cpus"),
        pytest.param(["/gpu:0"], 2, one_job.REFUSE, id="a-subset-of-gpus"),
        pytest.param(["/cpu:0"], 1, one_job.REFUSE, id="the-cpu-of-a-gpu-worker"),
        pytest.param([object()], 0, one_job.REFUSE, id="unreadable-list"),
    ],
)
def test_decide_mirrored(devices, gpus, action):
    listed = None if devices is None else read_device_list(devices, ("worker", 0))
    decision = one_job.decide_mirrored(listed, one_job.worker_devices(gpus), 2)
    assert decision.action == action
    if action == one_job.REFUSE:
        assert "\n" not in decision.message and decision.message.startswith(STOP_PREFIXES)
        assert "each worker would train alone" in decision.message and "Omit devices" in decision.message


@pytest.mark.parametrize("what", [*one_job.REFUSED_CLASSES, "fit"])
def test_every_refusal_is_one_line_saying_what_happened_and_what_to_do(what):
    message = one_job.refusal(what, 3)
    assert "\n" not in message and message.startswith(STOP_PREFIXES)  # the launcher's headline, as it is
    assert "3 workers" in message and (what in message or what == "fit")
    assert any(word in message for word in ("Use ", "Run ", "run the script", "Create "))


def test_a_rewrite_is_undone_exactly_including_inherited_and_missing_attributes():
    class Base:
        def hello(self):
            return "base"

    class Child(Base):
        def own(self):
            return "own"

    module = types.SimpleNamespace(Child=Child)
    own, inherited = Child.own, Child.hello
    rewrite = Rewrite("test_rewrite", lambda: module, {
        "Child.own": lambda original: lambda self: "rewritten " + original(self),
        "Child.hello": lambda original: lambda self: "rewritten " + original(self),
        "Child.added": lambda original: lambda self: f"added over {original}",
    })
    status = install_rewrite(rewrite)
    assert status.installed == ("Child.own", "Child.hello", "Child.added")
    assert (Child().own(), Child().hello(), Child().added()) == ("rewritten own", "rewritten base", "added over None")
    assert install_rewrite(rewrite).installed == status.installed  # idempotent
    assert remove_rewrites()[0].installed == ()
    assert Child.own is own and Child.hello is inherited and "hello" not in vars(Child) and not hasattr(Child, "added")


def _stop(message: str) -> subprocess.CompletedProcess[str]:
    code = f"from tfstrategy.runtime.hook_strategies import stop\nprint('before', flush=True)\nstop({message!r})\nprint('after')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_stop_is_one_line_exit_2_and_nothing_after_it():
    """The hook's stop: no traceback, no exit summary, no second line; the script cannot catch it."""
    line = one_job.refusal("OneDeviceStrategy", 2)
    done = _stop(line)
    assert (done.returncode, done.stdout, done.stderr) == (EXIT_STOPPED, "before\n", line + "\n")


def test_stop_refuses_a_line_the_launcher_would_not_recognise():
    from tfstrategy.runtime.hook_strategies import stop

    with pytest.raises(ValueError, match="a stop line starts with"):
        stop("something went wrong")


def test_list_logical_devices_in_a_launched_worker_lists_its_own_devices_until_it_joins():
    """The hook configures the cluster at import; plain TensorFlow lists local devices until the strategy starts it."""
    import tensorflow as tf

    from tfstrategy.runtime.hook_strategies import _local_devices
    from tfstrategy.state.registry import RUNTIME

    cluster = [tf.config.LogicalDevice(f"/job:worker/replica:0/task:{task}/device:CPU:0", "CPU") for task in (0, 1)]
    listed = _local_devices(lambda device_type=None: cluster, ("worker", 1))
    assert listed("CPU") == [tf.config.LogicalDevice("/job:localhost/replica:0/task:0/device:CPU:0", "CPU")]
    joined = RUNTIME.hook.joined
    try:
        RUNTIME.hook.joined = True
        assert listed("CPU") == cluster
    finally:
        RUNTIME.hook.joined = joined


@pytest.mark.parametrize(
    ("devices", "host", "has"),
    [
        pytest.param(["/gpu:0"], HostInfo(cpus=1), "this host has ['/cpu:0']", id="a-gpu-on-a-cpu-worker"),
        pytest.param([0, 1, 2], HostInfo(cpus=1, gpus=2), "this host has ['/cpu:0', '/gpu:0', '/gpu:1']",
                     id="a-gpu-past-the-last"),
    ],
)
def test_launch_says_a_listed_device_the_worker_lacks_as_run_does(devices, host, has):
    decision = one_job.decide_mirrored(read_device_list(devices, ("worker", 0)), one_job.worker_devices(host.gpus), 2,
                                       host=host, where="train.py:5")
    assert decision.action == one_job.REFUSE
    assert decision.message.startswith("tfstrategy stopped MirroredStrategy(devices=") and "\n" not in decision.message
    assert " at train.py:5: Received devices=" in decision.message and has in decision.message


@pytest.mark.parametrize("cpus", [1, 2])
def test_a_cpu_list_is_decided_by_the_job_not_the_host(cpus):
    """Logical CPUs are refused as a list the job cannot honour (--cpu-replicas cannot help a multi-worker job)."""
    listed = read_device_list(["/cpu:0", "/cpu:1"], ("worker", 0))
    decision = one_job.decide_mirrored(listed, one_job.worker_devices(0), 2, host=HostInfo(cpus=cpus), where="t.py:1")
    assert decision.message.startswith("tfstrategy refused MirroredStrategy(devices=['/cpu:0', '/cpu:1'])")
