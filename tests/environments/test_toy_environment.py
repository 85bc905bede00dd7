"""A new cluster environment is one class plus one entry in the detect list, and every consumer sees it.

``Toy`` stands for a scheduler tfstrategy has never heard of: it names the hosts
and this process's rank in its own variables, and tfstrategy derives
``TF_CONFIG`` from them. Nothing else in tfstrategy is edited to support it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

import pytest

from tfstrategy.environments import ENVIRONMENTS, detect_environment, job_identity, restart_count
from tfstrategy.environments.base import ClusterEnvironment, read_count, variables_line
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import ClusterConfig, validate_tf_config

SET_BY = "the toy scheduler"


class Toy(ClusterEnvironment):
    """``TOY_HOSTS=h1:1,h2:2``, ``TOY_RANK``, ``TOY_JOB``, ``TOY_ATTEMPT``; it warns with SIGUSR1."""

    name: ClassVar[str] = "Toy"
    sets_tf_config: ClassVar[bool] = True
    job_id_variable: ClassVar[str | None] = "TOY_JOB"

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(environ)
        hosts = [host.strip() for host in self.environ["TOY_HOSTS"].split(",")]
        rank = read_count(self.environ, "TOY_RANK", SET_BY, default=-1)
        if not 0 <= rank < len(hosts):
            raise ClusterConfigError(f"Received TOY_RANK={self.environ.get('TOY_RANK')!r} for {len(hosts)} hosts; "
                                     f"expected 0..{len(hosts) - 1}, as {SET_BY} sets it.")
        self._config = validate_tf_config({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": rank}})
        self._attempt = read_count(self.environ, "TOY_ATTEMPT", SET_BY)

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("TOY_HOSTS", "").strip())

    def cluster_config(self) -> ClusterConfig:
        return self._config

    def job_id(self) -> str | None:
        return f"toy-{self.environ['TOY_JOB']}" if self.environ.get("TOY_JOB") else None

    def restart_count(self) -> int:
        return self._attempt

    def preemption_signal(self) -> int:
        return int(signal.SIGUSR1)

    def describe(self) -> str:
        return f"Toy job {self.environ.get('TOY_JOB', '?')}: worker {self.task_index} of {self.num_workers}"

    @classmethod
    def report_lines(cls, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        values = {key: environ[key] for key in sorted(environ) if key.startswith("TOY_")}
        return (("Toy", variables_line(values, None, "not under Toy")),)


TOY = {"TOY_HOSTS": "10.0.0.1:2222,10.0.0.2:2222", "TOY_RANK": "1", "TOY_JOB": "5", "TOY_ATTEMPT": "2"}


@pytest.fixture
def toy() -> Iterator[None]:
    """The one line a new environment adds: its entry in the detect list (first, so it wins here)."""
    ENVIRONMENTS.insert(0, Toy)
    try:
        yield
    finally:
        ENVIRONMENTS.remove(Toy)


@pytest.fixture
def toy_environ(monkeypatch: pytest.MonkeyPatch, toy: None) -> None:
    for name in ("TF_CONFIG", "TFSTRATEGY_NUM_WORKERS", "TFSTRATEGY_WORKER_INDEX", "TFSTRATEGY_JOB_ID",
                 "TFSTRATEGY_STRATEGY", "TFSTRATEGY_CPU_REPLICAS", "TFSTRATEGY_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in TOY.items():
        monkeypatch.setenv(name, value)


def test_detect_environment_sees_the_toy(toy):
    environment = detect_environment(TOY)

    assert isinstance(environment, Toy)
    assert (environment.num_workers, environment.task_index, environment.cluster_config().address) == (
        2, 1, "10.0.0.2:2222")
    assert job_identity(TOY) == ("toy-5", "TOY_JOB")
    assert restart_count(TOY) == 2
    assert detect_environment({}) is None


def test_without_its_entry_the_toy_is_unknown():
    assert detect_environment(TOY) is None


def test_a_bad_toy_variable_is_one_line_naming_it(toy):
    with pytest.raises(ClusterConfigError, match=r"TOY_RANK='7' for 2 hosts.*the toy scheduler"):
        detect_environment({**TOY, "TOY_RANK": "7"})


def test_select_plans_tf_config_from_the_toy(toy_environ):
    from tfstrategy.runtime.plan import plan_steps
    from tfstrategy.runtime.select import resolve_request
    from tfstrategy.selection.choose import choose
    from tfstrategy.selection.host import HostInfo

    request = resolve_request()

    assert (request.cluster_source, request.cluster_tasks, type(request.environment)) == ("Toy", 2, Toy)
    assert [step.name for step in plan_steps(request)][:1] == ["set_tf_config"]
    choice = choose(kind=request.kind, devices=None, cpu_replicas=None, host=HostInfo(),
                    cluster_tasks=request.cluster_tasks, cluster_source="Toy")
    assert choice.reasons[0] == "auto: the Toy cluster has 2 tasks, so MultiWorkerMirroredStrategy"


def test_tfstrategy_env_shows_the_toy(toy_environ, capsys):
    from tfstrategy.cli import main

    assert main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert "- Toy: TOY_ATTEMPT=2, TOY_HOSTS=10.0.0.1:2222,10.0.0.2:2222, TOY_JOB=5, TOY_RANK=1" in lines
    assert "- Cluster environment: Toy job 5: worker 1 of 2" in lines
    chosen = next(line for line in lines if line.startswith("- select() would choose: "))
    assert "MultiWorkerMirroredStrategy" in chosen and "auto: the Toy cluster has 2 tasks" in chosen
    assert any(line.startswith("- select() steps: set_tf_config,") for line in lines)
    hook = next(line for line in lines if line.startswith("- run/launch hook steps: "))
    assert "set_tf_config" in hook and "prepare_collectives" in hook


def test_backups_and_preemption_take_the_toy_s_job_id_restarts_and_signal(toy_environ, tmp_path: Path):
    from tfstrategy.multiworker import commit
    from tfstrategy.multiworker.preemption import PreemptionWatcher

    assert commit.job_identity(TOY, tmp_path) == ("toy-5", "TOY_JOB")
    assert PreemptionWatcher().signals == (signal.SIGUSR1,)
