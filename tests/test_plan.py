"""The one plan of process-wide steps: what select(), the hook and `tfstrategy env` take, decided purely."""

from __future__ import annotations

import pytest

from tfstrategy.errors import TFStrategyError
from tfstrategy.runtime.hook_steps import HOOK_STEPS
from tfstrategy.runtime.inputs import PlanInputs, derive_inputs
from tfstrategy.runtime.plan import PHASES, Step, plan_steps
from tfstrategy.runtime.steps import SELECT_STEPS, SetTFConfig
from tfstrategy.runtime.worker_hook import hook_plan
from tfstrategy.selection.devices import parse_devices
from tfstrategy.settings import StrategyKind

TWO_WORKERS = '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}'
#: A Slurm job step of 2 tasks on one node (what `srun -n 2` sets).
SLURM_STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n1",
              "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "1",
              "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_RESV_PORTS": "21234-21235"}


def names(inputs: PlanInputs) -> list[str]:
    return [step.name for step in plan_steps(inputs)]


def select_names(env: dict[str, str], strategy: str | None = None) -> list[str]:
    return names(derive_inputs("select", strategy, env=env))


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        pytest.param(PlanInputs(consumer="select"), ["record_creation_sites", "apply_patches"], id="select-default"),
        pytest.param(PlanInputs(consumer="select", cpu_replicas=4),
                     ["split_cpu", "record_creation_sites", "apply_patches"], id="select-cpu-split"),
        pytest.param(PlanInputs(consumer="select", kind=StrategyKind.DEFAULT, cpu_replicas=4),
                     ["record_creation_sites", "apply_patches"], id="select-default-kind-no-split"),
        pytest.param(PlanInputs(consumer="select", cpu_replicas=2, cluster_tasks=2, cluster_source="TF_CONFIG"),
                     ["record_creation_sites", "apply_patches"], id="select-auto-multi-worker-no-split"),
        pytest.param(PlanInputs(consumer="hook", cpu_replicas=2),
                     ["split_cpu", "record_creation_sites", "watch_strategies", "mirrored_devices", "apply_patches",
                      "keras2_aliases", "audit"], id="hook-run"),
        pytest.param(PlanInputs(consumer="hook", audit="off"),
                     ["record_creation_sites", "watch_strategies", "mirrored_devices", "apply_patches",
                      "keras2_aliases"], id="hook-audit-off"),
        pytest.param(PlanInputs(consumer="hook", cpu_replicas=2, cluster_tasks=2, cluster_source="TF_CONFIG"),
                     ["record_creation_sites", "prepare_collectives", "watch_strategies", "mirrored_devices",
                      "refuse_unjoinable", "checkpoint_files", "data_sharding", "apply_patches", "keras2_aliases",
                      "audit", "refuse_unjoined_fit"],
                     id="hook-launch-no-split"),
    ],
)
def test_plan(inputs, expected):
    assert names(inputs) == expected


def test_a_cluster_environment_that_derives_the_cluster_sets_tf_config_for_a_multi_worker_select():
    assert select_names({**SLURM_STEP, "TFSTRATEGY_JOIN_FILE": "/tmp/j"}) == [
        "set_tf_config", "record_creation_sites", "ledger", "signal_launcher", "apply_patches"]
    # An explicit single-machine kind does not read the step at all.
    assert select_names(SLURM_STEP, "mirrored") == ["record_creation_sites", "apply_patches"]
    assert "set_tf_config" in [step.name for step in hook_plan(SLURM_STEP)]
    # TF_CONFIG itself is the cluster: nothing to set.
    assert "set_tf_config" not in [step.name for step in hook_plan({"TF_CONFIG": TWO_WORKERS})]


def test_every_step_has_a_phase_and_the_rewrites_are_marked():
    steps = plan_steps(PlanInputs(consumer="hook", cluster_tasks=2, cluster_source="TF_CONFIG"))
    assert {step.phase for step in steps} <= set(PHASES)
    rewrites = {step.name for step in steps if step.rewrites}
    assert rewrites == {"watch_strategies", "mirrored_devices", "refuse_unjoinable", "checkpoint_files", "data_sharding",
                        "apply_patches", "keras2_aliases", "audit", "refuse_unjoined_fit"}
    # The steps that must run before the script's first op come before every Keras step.
    phases = [step.phase for step in steps]
    assert phases == sorted(phases, key=list(PHASES).index)


def test_select_and_hook_agree_on_the_shared_steps():
    # Under a multi-worker TF_CONFIG neither splits the CPU; on one machine both do.
    for env, split in (({"TFSTRATEGY_CPU_REPLICAS": "2"}, True),
                       ({"TFSTRATEGY_CPU_REPLICAS": "1", "TF_CONFIG": TWO_WORKERS}, False)):
        hook = [step.name for step in hook_plan(env)]
        select = select_names(env)
        assert ("split_cpu" in hook) is ("split_cpu" in select) is split, (env, hook, select)
        shared = [name for name in hook if name in select]
        assert shared == [name for name in select if name in hook]


def test_shared_steps_are_the_same_classes():
    shared = set(SELECT_STEPS) & set(HOOK_STEPS)
    assert {step.name for step in shared} == {"split_cpu", "record_creation_sites", "set_tf_config", "ledger",
                                              "apply_patches", "set_precision"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({"TFSTRATEGY_CPU_REPLICAS": "abc"}, "TFSTRATEGY_CPU_REPLICAS", id="cpu-replicas"),
        pytest.param({"TFSTRATEGY_AUDIT": "loud"}, "TFSTRATEGY_AUDIT", id="audit"),
        pytest.param({"TF_CONFIG": "{not json"}, "TF_CONFIG", id="tf-config"),
    ],
)
def test_one_error_policy_for_every_consumer(env, message):
    for consumer in ("select", "hook"):
        with pytest.raises(TFStrategyError, match=message):
            derive_inputs(consumer, env=env)


def test_unknown_consumer_is_refused():
    with pytest.raises(ValueError, match="unknown consumer"):
        plan_steps(PlanInputs(consumer="nobody"))


def test_every_step_the_plans_can_name_is_a_step_object_with_a_detail_and_a_status():
    devices = parse_devices("cpu")
    variants = [PlanInputs(consumer=consumer, cpu_replicas=2, devices=devices, cluster_tasks=tasks,
                           cluster_source=source, precision="mixed_float16", under_launcher=True, profile="/tmp/r")
                for consumer in ("select", "hook") for tasks, source in ((0, None), (2, "TF_CONFIG"))]
    steps = [step for inputs in variants for step in plan_steps(inputs)]
    # (set_tf_config needs a cluster environment: see the test above.)
    assert {type(step) for step in steps} == (set(SELECT_STEPS) | set(HOOK_STEPS)) - {SetTFConfig}
    for step in steps:
        assert isinstance(step, Step) and step.detail() and step.status().startswith(f"{step.name}: planned (")


def test_a_precision_is_a_keras_step_of_both_plans_and_absent_without_one():
    for consumer in ("select", "hook"):
        steps = plan_steps(PlanInputs(consumer=consumer, precision="mixed_bfloat16"))
        chosen = [step for step in steps if step.name == "set_precision"]
        assert len(chosen) == 1 and chosen[0].phase == "keras" and "mixed_bfloat16" in chosen[0].detail()
        assert "set_precision" not in {step.name for step in plan_steps(PlanInputs(consumer=consumer))}


def test_a_profile_is_the_hooks_last_keras_step_and_not_selects():
    steps = plan_steps(PlanInputs(consumer="hook", profile="/tmp/reports"))
    assert steps[-1].name == "performance_report" and steps[-1].phase == "keras" and "/tmp/reports" in steps[-1].detail()
    assert "performance_report" not in {step.name for step in plan_steps(PlanInputs(consumer="hook"))}
    # select() never wraps fit with the report (the hook of `run/launch --profile` does): not in its plan.
    assert "performance_report" not in select_names({"TFSTRATEGY_PROFILE": "/tmp/reports"})
