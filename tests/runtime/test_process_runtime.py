"""One ProcessRuntime per process: every replacement registered, listed, and undone by one reset().

The proof is two different jobs in one process: after reset() nothing of the first remains.
"""

from __future__ import annotations

import os
import sys
import weakref

import keras
import pytest

import tfstrategy
from tfstrategy.diagnostics.env_report import preview_steps
from tfstrategy.patches import PATCHES, apply_patches, patch_status
from tfstrategy.runtime import worker_hook
from tfstrategy.runtime.hook_keras import keras2_aliases
from tfstrategy.runtime.rewrites import rewrites
from tfstrategy.state.registry import RUNTIME, reset
from tfstrategy.training.precision import global_policy
from tfstrategy.training.steps_per_execution import tune_at_first_fit


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _others() -> list[str]:
    """The names patch_status() lists beyond the Keras workarounds, installed or not."""
    return [status.name for status in patch_status() if status.name not in PATCHES]


@pytest.fixture
def clean_runtime():
    reset()
    yield
    reset()
    apply_patches()  # as any select() leaves the process for the tests after this one


def test_two_different_jobs_in_one_process(clean_runtime, capsys, monkeypatch):
    # Job A: 2 CPU replicas in mixed precision, a hook rewrite, an instance override of one model's fit.
    a = tfstrategy.select(cpu_replicas=2, precision="mixed_float16")
    assert [name for name, _ in a.steps] == ["split_cpu", "record_creation_sites", "apply_patches", "set_precision"]
    assert keras2_aliases() is not None and hasattr(keras.metrics.Metric, "reset_states")
    with a.scope():
        model = _model()
    tune_at_first_fit(model)
    assert "fit" in vars(model)
    installed = {status.name for status in patch_status() if status.installed}
    assert {"keras2_aliases", f"steps_per_execution_auto:{id(model)}"} <= installed
    assert installed & set(PATCHES), "select() installed the Keras workarounds"
    assert global_policy() == "mixed_float16" and RUNTIME.plans["select"].inputs.cpu_replicas == 2
    # tfstrategy env and the hook's exit summary list them too.
    listed = preview_steps(os.environ)["replacements"]
    assert "keras2_aliases: installed (metrics.Metric.reset_states); keras" in "\n".join(listed)
    assert f"steps_per_execution_auto:{id(model)}: installed (Sequential.fit); instance override" in "\n".join(listed)
    monkeypatch.setenv("TFSTRATEGY_DEBUG", "1")  # the summary names replacements only under --debug
    worker_hook._print_summary()
    assert f"; replaced: keras2_aliases, steps_per_execution_auto:{id(model)}" in capsys.readouterr().err

    removed = RUNTIME.reset()

    # Nothing of job A remains: no replacement, no plan, the model's and Keras' own attributes back.
    assert {status.name for status in removed} >= {"keras2_aliases", f"steps_per_execution_auto:{id(model)}"}
    assert not any(status.installed for status in patch_status()) and _others() == []
    assert RUNTIME.replacements() == () and RUNTIME.plans == {} and rewrites() == ()
    assert "fit" not in vars(model) and not hasattr(keras.metrics.Metric, "reset_states")
    assert global_policy() == "float32"
    assert all(patch.status().needed is None for patch in PATCHES.values()), "probes are answered anew"

    # Job B: another kind, no precision: its plan is derived from its own settings.
    b = tfstrategy.select("one_device")
    assert [name for name, _ in b.steps] == ["record_creation_sites", "apply_patches"]
    assert RUNTIME.plans["select"].inputs.cpu_replicas is None and global_policy() == "float32"
    assert _others() == [] and "mixed" not in b.explain()


def test_an_override_restores_the_instances_own_attribute_or_deletes_the_inherited_one(clean_runtime):
    class Owner:
        def inherited(self) -> str:
            return "class"

    owner = Owner()
    owner.own = "mine"
    RUNTIME.override_attribute(owner, "inherited", lambda: "override", name="t:inherited")
    own = RUNTIME.override_attribute(owner, "own", "replaced", name="t:own")
    assert (owner.inherited(), owner.own) == ("override", "replaced")
    assert [status.installed for status in patch_status() if status.name.startswith("t:")] == [
        ("Owner.inherited",), ("Owner.own",)]
    assert own.remove().installed == () and owner.own == "mine"
    assert RUNTIME.replacement("t:own") is None and RUNTIME.replacement("t:inherited") is not None
    reset()
    assert owner.inherited() == "class" and "inherited" not in vars(owner)


def test_an_override_of_an_object_that_died_is_no_longer_listed(clean_runtime):
    class Owner:
        pass

    owner = Owner()
    RUNTIME.override_attribute(owner, "method", lambda: None, name="t:dead")
    assert [item.name for item in RUNTIME.replacements()] == ["t:dead"]
    del owner
    assert RUNTIME.replacements() == ()


def test_a_module_attribute_override_is_undone(clean_runtime):
    original = sys.excepthook
    RUNTIME.override_attribute(sys, "excepthook", lambda *args: None, name="t:excepthook")
    assert sys.excepthook is not original
    reset()
    assert sys.excepthook is original


def test_reset_clears_every_registered_job_state_and_keeps_the_collective_key_counters(clean_runtime):
    from tfstrategy.multiworker import chief_files
    from tfstrategy.scope import creation_sites

    assert {"patches: probe results", "creation_sites: recorded sites",
            "chief_files: write counts and private directories"} <= set(RUNTIME.state_names())
    chief_files._COUNTS["x"] = 3
    assert RUNTIME.once("said") and not RUNTIME.once("said")
    before = RUNTIME.next_number("t:keys")
    reset()
    assert chief_files._COUNTS == {} and creation_sites._SITES == {} and RUNTIME.once("said")
    assert RUNTIME.next_number("t:keys") == before + 1, "TensorFlow remembers collective keys: never reused"


def test_what_tfstrategy_kept_for_a_model_goes_with_reset(clean_runtime):
    import tensorflow as tf

    from tfstrategy.performance.report import tracker_for
    from tfstrategy.training.sentinel import sentinel_for
    from tfstrategy.training.steps_per_execution import last_choice

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)  # the tuner answers K = 1 without timing
    strategy = tf.distribute.get_strategy()
    sentinel = sentinel_for(model, strategy)
    choice = tfstrategy.tune_steps_per_execution(model, tf.data.Dataset.from_tensor_slices(tf.ones((4, 3))).batch(2))
    tracker = tracker_for(model)
    assert set(RUNTIME.attached(model)) == {"sentinel", "steps_per_execution_choice", "performance_tracker"}
    assert sentinel_for(model, strategy) is sentinel and last_choice(model) is choice and tracker_for(model) is tracker
    assert not [name for name in vars(model) if name.startswith("_tfstrategy")], "nothing is written on the model"

    reset()

    assert RUNTIME.attached(model) == () and last_choice(model) is None
    assert sentinel_for(model, strategy) is not sentinel and tracker_for(model) is not tracker  # made anew


def test_a_value_kept_for_an_object_does_not_keep_the_object_alive(clean_runtime):
    class Owner:
        pass

    owner = Owner()
    RUNTIME.attachments("t:kept").set(owner, "value")
    assert RUNTIME.attached(owner) == ("t:kept",)
    reference = weakref.ref(owner)
    del owner
    assert reference() is None


def test_a_patch_installed_without_a_plan_counts_as_the_plans_apply_patches_step(clean_runtime):
    from tfstrategy.patches import APPLY_STEP, keras_steps_per_execution
    from tfstrategy.runtime.steps import ApplyPatches

    assert ApplyPatches.name == APPLY_STEP
    # As the steps_per_execution tuner, the performance probes and keras_mwms install the one fix they need.
    (status,) = apply_patches(keras_steps_per_execution.PATCH.name)
    assert status.installed and RUNTIME.plans == {}
    assert [item.name for item in RUNTIME.replacements(step=APPLY_STEP)] == ["keras_steps_per_execution"]
    assert RUNTIME.unowned() == ()
    reset()
    assert not keras_steps_per_execution.PATCH.status().installed
