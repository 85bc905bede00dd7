"""The one plan of process-wide steps: what select(), the hook and `tfstrategy env` take, decided purely."""

from __future__ import annotations

import pytest

from tfstrategy.runtime.worker_hook import hook_plan
from tfstrategy.runtime.plan import PlanInputs, plan_steps
from tfstrategy.selection.select import resolve_request, select_plan
from tfstrategy.settings import StrategyKind

TWO_WORKERS = '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}'


def names(inputs: PlanInputs) -> list[str]:
    return [step.name for step in plan_steps(inputs)]


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
        pytest.param(PlanInputs(consumer="select", cluster_tasks=2, cluster_source="Slurm", under_launcher=True),
                     ["slurm_tf_config", "record_creation_sites", "signal_launcher", "apply_patches"], id="select-slurm"),
        pytest.param(PlanInputs(consumer="select", kind=StrategyKind.MIRRORED, cluster_tasks=2, cluster_source="Slurm"),
                     ["record_creation_sites", "apply_patches"], id="select-mirrored-ignores-slurm"),
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


def test_every_step_has_a_phase_and_the_rewrites_are_marked():
    steps = plan_steps(PlanInputs(consumer="hook", cluster_tasks=2, cluster_source="TF_CONFIG"))
    assert {step.phase for step in steps} <= {"tensorflow", "strategy", "keras"}
    rewrites = {step.name for step in steps if step.rewrites}
    assert rewrites == {"watch_strategies", "mirrored_devices", "refuse_unjoinable", "checkpoint_files", "data_sharding",
                        "apply_patches", "keras2_aliases", "audit", "refuse_unjoined_fit"}
    # The steps that must run before the script's first op come before every Keras step.
    phases = [step.phase for step in steps]
    assert phases == sorted(phases, key=["tensorflow", "strategy", "keras"].index)


def test_select_and_hook_agree_on_the_shared_steps():
    # Under a multi-worker TF_CONFIG neither splits the CPU; on one machine both do.
    for env, split in (({"TFSTRATEGY_CPU_REPLICAS": "2"}, True),
                       ({"TFSTRATEGY_CPU_REPLICAS": "1", "TF_CONFIG": TWO_WORKERS}, False)):
        hook = [step.name for step in hook_plan(env)]
        select = [step.name for step in select_plan(resolve_request(env=env), env)]
        assert ("split_cpu" in hook) is ("split_cpu" in select) is split, (env, hook, select)
        shared = [name for name in hook if name in select]
        assert shared == [name for name in select if name in hook]


def test_unknown_consumer_is_refused():
    with pytest.raises(ValueError, match="unknown consumer"):
        plan_steps(PlanInputs(consumer="nobody"))


def test_the_hook_has_a_function_for_every_step_its_plan_can_name():
    from tfstrategy.runtime import worker_hook

    variants = [PlanInputs(consumer="hook", cpu_replicas=2, devices="cpu", cluster_tasks=tasks, cluster_source=source,
                           precision="mixed_float16")
                for tasks, source in ((0, None), (2, "TF_CONFIG"), (2, "Slurm"))]
    variants.append(PlanInputs(consumer="hook", under_launcher=True, profile="/tmp/reports"))
    named = {step.name for inputs in variants for step in plan_steps(inputs)}
    assert named == set(worker_hook._STEPS)


def test_a_precision_is_a_keras_step_of_both_plans_and_absent_without_one():
    for consumer in ("select", "hook"):
        steps = plan_steps(PlanInputs(consumer=consumer, precision="mixed_bfloat16"))
        chosen = [step for step in steps if step.name == "set_precision"]
        assert len(chosen) == 1 and chosen[0].phase == "keras" and "mixed_bfloat16" in chosen[0].detail
        assert "set_precision" not in {step.name for step in plan_steps(PlanInputs(consumer=consumer))}


def test_a_profile_is_the_hooks_last_keras_step_and_absent_without_one():
    steps = plan_steps(PlanInputs(consumer="hook", profile="/tmp/reports"))
    assert steps[-1].name == "performance_report" and steps[-1].phase == "keras" and "/tmp/reports" in steps[-1].detail
    assert "performance_report" not in {step.name for step in plan_steps(PlanInputs(consumer="hook"))}
