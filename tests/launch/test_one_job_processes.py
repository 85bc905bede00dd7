"""One job or a clear refusal, with real processes: each strategy kind under `tfstrategy launch -n 2` and `run`.

Joined: both workers report the same final loss, equal to the 1-process run on the same global batch.
Refused: the job exits 2 and the launcher's headline is the worker's one line saying what and what to do (end to end
for a refused class and for fit without a strategy; every kind's refusal by the hook's rewrites runs in this process).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import ROOT, run_script_on_one_cpu

SCRIPT = ROOT / "tests" / "workers" / "one_job_script.py"


def _tfstrategy(*args: str, timeout: float = 400, **extra: str):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **extra}
    return subprocess.run([sys.executable, "-m", "tfstrategy", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def _launch(case: str):
    # Every worker's lines, repeats included: the tests count each worker's copy.
    return _tfstrategy("launch", "-n", "2", "--timeout", "180", "--console-workers", "all", "--", sys.executable,
                       str(SCRIPT), case)


def _losses(stdout: str) -> list[float]:
    return [float(line.rsplit(" ", 1)[1]) for line in stdout.splitlines() if "final loss" in line]


@pytest.fixture(scope="module")
def one_process_loss() -> float:
    """The 1-process run: the script in this process, its MirroredStrategy() on one CPU (no start-up of its own)."""
    [loss] = _losses(run_script_on_one_cpu(SCRIPT, "mirrored"))
    return loss


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("case", ["mirrored", "ops_first"])
def test_launch_joins_and_trains_as_one_job(case, one_process_loss):
    result = _launch(case)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = _losses(result.stdout)
    assert len(losses) == 2 and losses[0] == losses[1], result.stdout
    assert losses[0] == pytest.approx(one_process_loss, rel=1e-5)
    assert result.stdout.count("strategy MultiWorkerMirroredStrategy 2") == 2
    assert "Collective ops must be configured" not in result.stderr
    assert "Enabling collective ops after program startup" not in result.stdout + result.stderr
    # Every worker's exit summary (its stderr, forwarded to the launcher's) names the strategy and what changed,
    # not the steps.
    assert result.stderr.count("tfstrategy: MultiWorkerMirroredStrategy, 2 replicas; 2 workers joined one "
                               "MultiWorkerMirroredStrategy;") == 2, result.stderr[-3000:]
    assert "steps: record_creation_sites" not in result.stdout + result.stderr


REFUSALS = {
    "listed": "tfstrategy refused MirroredStrategy(devices=['CPU:0', 'CPU:1'])",
    "one_device": "tfstrategy refused OneDeviceStrategy",
    "parameter_server": "tfstrategy refused ParameterServerStrategy",
    "coordinator": "tfstrategy refused ClusterCoordinator",
    "tpu": "tfstrategy refused TPUStrategy",
    "default": "tfstrategy stopped Model.fit() before its first step",
}


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.slow
@pytest.mark.parametrize("case", [
    # The two phases of the hook that refuse, each end to end: a strategy class refused at its creation (TensorFlow's
    # rewrites), Model.fit stopped without a strategy (Keras'). Every kind's line: the in-process test below.
    pytest.param("parameter_server", id="parameter-server"),
    pytest.param("default", id="default-strategy"),
])
def test_launch_refuses_what_cannot_be_one_job_in_one_line(case):
    line = REFUSALS[case]
    result = _launch(case)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    # The launcher's headline is the worker's own one line, the same whichever worker said it first, said once:
    # no traceback, no second line from the worker, no restart.
    headline = next(text for text in result.stderr.splitlines() if text.startswith("tfstrategy launch: tfstrategy "))
    assert headline.startswith(f"tfstrategy launch: {line}"), headline
    assert (result.stdout + result.stderr).count(headline.removeprefix("tfstrategy launch: ")) == 1
    assert "Traceback" not in result.stdout + result.stderr and "never created a strategy" not in result.stderr
    assert "final loss" not in result.stdout
    assert "under a multi-worker TF_CONFIG (2 workers" in headline and "more characters" not in headline


class _Stopped(Exception):
    """What the hook's ``stop()`` raises in this test instead of ending the process with exit status 2."""


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_worker_of_two_stops_each_kind_at_its_creation_in_one_line(case, monkeypatch, capsys):
    """The script, in this process as worker 1 of a 2-worker TF_CONFIG, under the hook's three refusing rewrites.

    ``stop()`` (one line, exit 2, tested in test_one_job.py) raises here, so every kind costs no TensorFlow start-up;
    the launcher's handling of that line is the end-to-end test above, each kind's message test_one_job.py's
    test_every_refusal_is_one_line_saying_what_happened_and_what_to_do.
    """
    import atexit
    import runpy

    from tfstrategy.multiworker.cluster import ClusterConfig
    from tfstrategy.runtime import hook_strategies
    from tfstrategy.runtime.inputs import PlanInputs
    from tfstrategy.runtime.rewrites import rewrites

    config = ClusterConfig(cluster={"worker": ("127.0.0.1:1", "127.0.0.1:2")}, task_type="worker", task_index=1)
    inputs = PlanInputs(consumer="hook", cluster_tasks=2, cluster_source="TF_CONFIG", cluster=config, under_launcher=True)

    def stopped(message: str):
        raise _Stopped(message)

    monkeypatch.setattr(hook_strategies, "stop", stopped)
    monkeypatch.setattr(hook_strategies.RUNTIME.hook, "joined", False)  # a worker that has not joined
    before = set(rewrites())
    try:
        hook_strategies.mirrored_devices(inputs)
        hook_strategies.refuse_unjoinable(config)
        atexit.unregister(hook_strategies._fail_if_never_joined)  # the worker's exit check, not this process's
        hook_strategies.refuse_unjoined_fit(config)
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), case])
        with pytest.raises(_Stopped) as stop:
            runpy.run_path(str(SCRIPT), run_name="__main__")
    finally:
        for rewrite in reversed(rewrites()):
            if rewrite not in before:
                rewrite.remove()
    assert set(rewrites()) == before
    message = str(stop.value)
    assert message.startswith(REFUSALS[case]), message
    assert "\n" not in message and "under a multi-worker TF_CONFIG (2 workers" in message
    assert "final loss" not in capsys.readouterr().out


@pytest.mark.multiprocess
@pytest.mark.extended
@pytest.mark.slow
def test_launch_fails_a_worker_that_trained_without_any_strategy():
    result = _launch("loop")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "never created a strategy that joined the job" in result.stderr


@pytest.mark.slow
def test_run_checks_a_listed_device_the_host_lacks_as_select_does():
    result = _tfstrategy("run", "--", sys.executable, str(SCRIPT), "gpu")
    assert result.returncode == 2
    [line] = result.stderr.splitlines()  # one line, no traceback, no summary
    assert line.startswith("tfstrategy stopped MirroredStrategy(devices=['device:GPU:0']) at tests/workers/one_job_script.py:")
    assert "this host has ['/cpu:0']" in line
    assert "final loss" not in result.stdout


@pytest.mark.slow
def test_run_device_check_warn_reports_the_missing_device_and_goes_on():
    result = _tfstrategy("run", "--", sys.executable, str(SCRIPT), "gpu", TFSTRATEGY_DEVICE_CHECK="warn")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final loss" in result.stdout
    # Said when it happens and again in the exit summary.
    assert result.stderr.count("MirroredStrategy(devices=['device:GPU:0']) at tests/workers/one_job_script.py:") == 2


@pytest.mark.slow
def test_run_reports_the_settings_a_listed_device_list_overrides():
    result = _tfstrategy("run", "--cpu-replicas", "4", "--devices", "cpu", "--", sys.executable, str(SCRIPT), "listed")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "strategy MirroredStrategy 2" in result.stdout
    note = "names its own devices, so --devices cpu and --cpu-replicas 4 had no effect on it"
    assert result.stderr.count(note) == 2  # when it happens, and in the exit summary


@pytest.mark.slow
def test_run_summary_names_a_strategy_of_any_kind():
    result = _tfstrategy("run", "--", sys.executable, str(SCRIPT), "one_device")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tfstrategy: OneDeviceStrategy, 1 replica;" in result.stderr


@pytest.mark.slow
def test_a_python_child_of_the_script_is_not_hooked_again():
    result = _tfstrategy("run", "--cpu-replicas", "2", "--", sys.executable, str(SCRIPT), "child")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "child hook steps 0 True" in result.stdout
    assert result.stderr.count("tfstrategy: MirroredStrategy, 2 replicas;") == 1
