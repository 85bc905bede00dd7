"""A cluster environment added to the detect list is seen by select() (its explain()), the hook's plan and env.

The toy is one class and one entry in tfstrategy.environments.ENVIRONMENTS, as the
ARCHITECTURE.md recipe says; nothing else in tfstrategy is told about it. (The
environments' own toy, tests/environments/test_toy_environment.py, covers backups,
preemption and env's variable lines.)
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

import tfstrategy
from tfstrategy import environments
from tfstrategy.cli import main
from tfstrategy.environments import ClusterEnvironment
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import ClusterConfig, tf_config_from_hosts
from tfstrategy.patches import apply_patches
from tfstrategy.runtime.inputs import derive_inputs
from tfstrategy.runtime.plan import plan_steps
from tfstrategy.runtime.worker_hook import hook_plan
from tfstrategy.state.registry import RUNTIME, reset


class ToyScheduler(ClusterEnvironment):
    """A scheduler that says how many workers there are and which one this is; tfstrategy writes TF_CONFIG."""

    name = "toy scheduler"
    sets_tf_config = True

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("TOY_WORKERS"))

    @property
    def num_workers(self) -> int:
        return int(self.environ["TOY_WORKERS"])

    @property
    def task_index(self) -> int:
        return int(self.environ.get("TOY_RANK", "0"))

    def cluster_config(self) -> ClusterConfig:
        if self.num_workers < 2:
            raise ClusterConfigError("one toy worker has no cluster")
        return tf_config_from_hosts([f"127.0.0.1:{23000 + i}" for i in range(self.num_workers)], self.task_index)

    def describe(self) -> str:
        return f"toy job: worker {self.task_index} of {self.num_workers}"


@pytest.fixture(autouse=True)
def toy_first(monkeypatch):
    monkeypatch.setattr(environments, "ENVIRONMENTS", [ToyScheduler, *environments.ENVIRONMENTS])


def test_select_sees_it(monkeypatch):
    # Two toy workers: select()'s plan writes TF_CONFIG from the toy (planned only: building would wait for a peer).
    two = derive_inputs("select", env={"TOY_WORKERS": "2", "TOY_RANK": "1"})
    assert (two.cluster_source, two.cluster_tasks, two.cluster.task_index) == ("toy scheduler", 2, 1)
    assert [step.line() for step in plan_steps(two)][0] == "set_tf_config: set TF_CONFIG from the toy scheduler's cluster"
    # One toy worker: select() builds a strategy, and explain() says where the process runs.
    reset()
    try:
        selection = tfstrategy.select(cpu_replicas=2, env={"TOY_WORKERS": "1"})
        assert "environment from toy scheduler" in selection.explain()
        assert RUNTIME.plans["select"].inputs.environment.describe() == "toy job: worker 0 of 1"
    finally:
        reset()
        apply_patches()


def test_the_hooks_plan_sees_it():
    steps = hook_plan({"TOY_WORKERS": "3", "TOY_RANK": "2"})
    names = [step.name for step in steps]
    assert names[:4] == ["record_creation_sites", "set_tf_config", "prepare_collectives", "watch_strategies"]
    assert "set TF_CONFIG from the toy scheduler's cluster" in steps[1].line()
    assert "of 3 workers" in steps[2].line()


def test_tfstrategy_env_sees_it(monkeypatch, capsys):
    monkeypatch.setenv("TOY_WORKERS", "2")
    assert main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "- Cluster environment: toy job: worker 0 of 2" in lines
    hook = next(line for line in lines if line.startswith("- run/launch hook steps: "))
    assert "set_tf_config" in hook and "prepare_collectives" in hook
