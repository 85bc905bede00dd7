"""One job or a clear refusal: the pure decisions, and the rewrites' undo (fast)."""

from __future__ import annotations

import types

import pytest

from tfstrategy.runtime import one_job
from tfstrategy.runtime.rewrites import Rewrite, install_rewrite, remove_rewrites
from tfstrategy.selection.devices import Device

CPU0, CPU1, GPU0, GPU1 = Device("CPU", 0), Device("CPU", 1), Device("GPU", 0), Device("GPU", 1)


@pytest.mark.parametrize(
    ("devices", "gpus", "action"),
    [
        pytest.param(None, 0, one_job.JOIN, id="no-devices"),
        pytest.param([CPU0], 0, one_job.JOIN, id="the-workers-cpu"),
        pytest.param([GPU0, GPU1], 2, one_job.JOIN, id="every-gpu"),
        pytest.param([GPU1, GPU0], 2, one_job.JOIN, id="every-gpu-any-order"),
        pytest.param([CPU0, CPU1], 0, one_job.REFUSE, id="logical-cpus"),
        pytest.param([GPU0], 2, one_job.REFUSE, id="a-subset-of-gpus"),
        pytest.param([CPU0], 1, one_job.REFUSE, id="the-cpu-of-a-gpu-worker"),
        pytest.param([], 0, one_job.REFUSE, id="unparsed-list"),
    ],
)
def test_decide_mirrored(devices, gpus, action):
    decision = one_job.decide_mirrored(devices, one_job.worker_devices(gpus), 2)
    assert decision.action == action
    if action == one_job.REFUSE:
        assert "\n" not in decision.message
        assert "each worker would train alone" in decision.message and "Omit devices" in decision.message


@pytest.mark.parametrize("what", [*one_job.REFUSED_CLASSES, "fit"])
def test_every_refusal_is_one_line_saying_what_happened_and_what_to_do(what):
    message = one_job.refusal(what, 3)
    assert "\n" not in message
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
