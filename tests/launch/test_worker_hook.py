"""The start-up hook: unchanged scripts under `tfstrategy run` and `tfstrategy launch`, with real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, run_script_on_one_cpu
from tfstrategy.launch.processes import exception_line, failure_reason
from tfstrategy.runtime.worker_hook import STARTUP_DIR, hook_environment

SCRIPTS = ROOT / "tests" / "workers"
TUTORIALS = ROOT / "examples" / "tutorials"


def _tfstrategy(*args: str, timeout: float, env: dict[str, str] | None = None, cwd: Path = ROOT):
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tfstrategy", *args], capture_output=True, text=True,
                            timeout=timeout, env=full_env, cwd=cwd)
    return result, time.monotonic() - started


# --- the hook itself (fast) -----------------------------------------------------------------


def test_hook_is_inert_without_its_variable_and_the_users_sitecustomize_still_runs(tmp_path):
    user_site = tmp_path / "user"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    probe = "import os, sys; print(os.environ.get('USER_SITECUSTOMIZE_RAN'), any(m.startswith('tfstrategy') for m in sys.modules))"
    env = hook_environment(env={**os.environ, "PYTHONPATH": f"{user_site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    with_hook = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert with_hook.stdout.split() == ["1", "True"], with_hook.stderr
    env.pop("TFSTRATEGY_HOOK")
    without = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert without.stdout.split() == ["1", "False"], without.stderr


def test_startup_directory_holds_only_the_sitecustomize():
    assert sorted(path.name for path in STARTUP_DIR.iterdir() if path.suffix == ".py") == ["sitecustomize.py"]


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param(["Traceback (most recent call last):", '  File "t.py", line 3', "AttributeError: 'Model' has no attribute 'fitt'"],
                     "AttributeError: 'Model' has no attribute 'fitt'", id="builtin"),
        pytest.param(["Traceback (most recent call last):", "  ...", "tensorflow.python.framework.errors_impl.UnknownError: boom", "",
                      "extra noise"], "tensorflow.python.framework.errors_impl.UnknownError: boom", id="qualified-then-noise"),
        pytest.param(["Traceback (most recent call last):", "  ...", "KeyboardInterrupt"], "KeyboardInterrupt", id="bare"),
        pytest.param(["ValueError: printed, not raised"], None, id="no-traceback"),
    ],
)
def test_exception_line(lines, expected):
    assert exception_line(lines) == expected


def test_port_conflict_is_reported_only_when_tensorflow_said_so():
    lines = ["Traceback (most recent call last):", "AttributeError: boom"]
    assert failure_reason(1, lines, 1234, joined=False) == "exited with status 1 before joining: AttributeError: boom"
    port_lines = ["UNKNOWN: Could not start gRPC server", "Traceback (most recent call last):", "StrategyError: x"]
    assert "could not serve on its port 127.0.0.1:1234" in failure_reason(1, port_lines, 1234, joined=False)
    assert failure_reason(-9, [], 1, joined=True, signalled_by_us=True) == "was killed by SIGKILL"


# --- tfstrategy run ----------------------------------------------------------------------------


@pytest.mark.slow
def test_run_gives_the_seed_script_four_replicas():
    result, _ = _tfstrategy("run", "--cpu-replicas", "4", "--", sys.executable, str(ROOT / "examples" / "strategy-demo.py"),
                            timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:4] == ["strategy MirroredStrategy", "replicas 4", "model_strategy True", "train_on_batch True"]
    assert ("tfstrategy: MirroredStrategy, 4 replicas; the CPU split into 4 logical devices; MirroredStrategy() given "
            "4 devices;") in result.stderr
    assert "steps: " not in result.stderr and "patches: " not in result.stderr  # step names only with --debug


@pytest.mark.slow
def test_run_trains_steps_per_execution_8_on_four_replicas_like_one(tmp_path):
    """The one-replica answer is the same script run in this process with MirroredStrategy() on /cpu:0 alone (what
    ``run --cpu-replicas 1`` gives it; one replica needs no fix), so only the four-replica run starts TensorFlow."""
    script = SCRIPTS / "spe_script.py"
    run_script_on_one_cpu(script, str(tmp_path / "one.npz"))
    four, _ = _tfstrategy("run", "--cpu-replicas", "4", "--", sys.executable, str(script), str(tmp_path / "four.npz"), timeout=180)
    assert four.returncode == 0, four.stderr[-2000:]
    assert "replicas 4" in four.stdout
    assert "Keras workarounds acted: keras_steps_per_execution" in four.stderr.splitlines()[-1]
    first, second = np.load(tmp_path / "one.npz"), np.load(tmp_path / "four.npz")
    for key in first:
        np.testing.assert_allclose(first[key], second[key], atol=1e-5, rtol=0)
    assert int(first["iterations"]) == int(second["iterations"]) == 32


@pytest.mark.slow
def test_run_audit_stop_names_the_optimizer_line_before_the_first_step(tmp_path):
    script = SCRIPTS / "stray_optimizer_script.py"
    result, _ = _tfstrategy("run", "--cpu-replicas", "2", "--audit", "stop", "--", sys.executable, str(script), timeout=180)
    assert result.returncode == 1
    line = next(number for number, text in enumerate(script.read_text().splitlines(), 1) if "Adam(" in text)
    assert "tfstrategy stopped fit() before its first step (--audit stop)" in result.stderr
    assert f"optimizer variables created at tests/workers/stray_optimizer_script.py:{line}" in result.stderr
    assert "steps trained" not in result.stdout


@pytest.mark.slow
def test_run_audit_warn_reports_once_and_trains_on():
    script = SCRIPTS / "stray_optimizer_script.py"
    result, _ = _tfstrategy("run", "--cpu-replicas", "2", "--", sys.executable, str(script), timeout=180)
    assert result.stderr.count("scope audit before fit() (--audit warn, training goes on)") == 1
    assert "scope audit: 1 of 1 found variables outside the scope" in result.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--cpu-replicas", "x", "--", "true"], "Received --cpu-replicas x", id="bad-replicas"),
        pytest.param(["--devices", "gpu0", "--", "true"], "Did you mean 'gpu:0'", id="bad-devices"),
        pytest.param(["--cpu-replicas", "2"], "Received no command to run", id="no-command"),
    ],
)
def test_run_refuses_bad_input_in_one_line(argv, message):
    result, _ = _tfstrategy("run", *argv, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("tfstrategy run: error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# --- tfstrategy launch of scripts that create their own strategy ---------------------------------


@pytest.mark.multiprocess
def test_launch_gives_the_seed_script_a_multi_worker_strategy():
    result, _ = _tfstrategy("launch", "-n", "2", "--console-workers", "all", "--timeout", "120", "--", sys.executable,
                            str(ROOT / "examples" / "strategy-demo.py"), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    for index in (0, 1):
        assert f"[worker {index}] strategy MultiWorkerMirroredStrategy" in result.stdout
        assert f"[worker {index}] replicas 2" in result.stdout
        assert f"[worker {index}] train_on_batch True" in result.stdout


@pytest.mark.multiprocess
def test_launch_runs_the_keras_tutorial_unchanged_and_workers_agree():
    result, _ = _tfstrategy("launch", "-n", "2", "--console-workers", "all", "--timeout", "120", "--", sys.executable,
                            str(TUTORIALS / "keras_multi_worker.py"), timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [line.rsplit(" ", 1)[1] for line in result.stdout.splitlines() if "final loss" in line]
    assert len(losses) == 2 and losses[0] == losses[1]


@pytest.mark.multiprocess
def test_launch_runs_the_custom_loop_tutorial_unchanged_and_workers_agree():
    result, _ = _tfstrategy(
        "launch", "-n", "2", "--console-workers", "all", "--timeout", "120", "--", sys.executable,
        str(TUTORIALS / "custom_loop_multi_worker.py"), "--epochs", "2", "--steps", "20", timeout=400,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    epoch_lines = [line.split("] ", 1)[1] for line in result.stdout.splitlines() if "Epoch: 1," in line]
    assert len(epoch_lines) == 2 and epoch_lines[0] == epoch_lines[1]


@pytest.mark.multiprocess
def test_launch_never_kills_a_healthy_job_running_longer_than_the_timeout():
    """--timeout bounds the join only: workers that joined and then run 6 s outlast --timeout 5 and end with status 0.

    Plain workers, so the join is not TensorFlow's start-up (which a timeout above it must wait out on a loaded
    machine); the launcher's rule over a long training, with fakes: test_policy.py's
    test_a_joined_job_training_past_the_join_timeout_is_never_stopped.
    """
    timeout = 5
    result, seconds = _tfstrategy("launch", "-n", "2", "--timeout", str(timeout), "--", sys.executable,
                                  str(SCRIPTS / "plain_worker.py"), "outlast", timeout=60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert seconds > timeout


@pytest.mark.multiprocess
def test_worker_raising_before_joining_is_reported_with_its_exception_and_no_port_talk(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import tensorflow as tf\nmodel = tf.keras.Sequential()\nmodel.fitt()\n")
    result, _ = _tfstrategy("launch", "-n", "2", "--console-workers", "all", "--timeout", "120", "--", sys.executable, str(script), timeout=240)
    assert result.returncode == 1
    # Named as it raises (the process still exiting) or once it exited; either way before joining, with its error.
    headline = next(line for line in result.stderr.splitlines() if re.match(r"tfstrategy launch: worker \d (raised|exited)", line))
    assert "AttributeError: 'Sequential' object has no attribute 'fitt'" in headline
    assert "before joining" in headline
    assert "port" not in headline


@pytest.mark.multiprocess
def test_non_python_worker_that_never_listens_fails_at_the_timeout():
    result, seconds = _tfstrategy("launch", "-n", "2", "--console-workers", "all", "--timeout", "3", "--", "sleep", "60", timeout=60)
    assert result.returncode == 124
    assert "did not join within --timeout 3 s" in result.stderr
    assert seconds < 20


@pytest.mark.slow
def test_run_hooks_a_script_that_imports_keras_before_tensorflow():
    result, _ = _tfstrategy("run", "--cpu-replicas", "2", "--", sys.executable, str(SCRIPTS / "keras_first_script.py"),
                            timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 8" in result.stdout  # steps_per_execution=4 on 2 replicas: the patch was installed
    assert "hook errors" not in result.stderr and "partially initialized" not in result.stderr


_OPS_BEFORE_THE_STRATEGY = """
import tensorflow as tf
from tensorflow.python import pywrap_tfe
calls = []
enable = pywrap_tfe.TFE_EnableCollectiveOps
pywrap_tfe.TFE_EnableCollectiveOps = lambda *args: calls.append(1) or enable(*args)
data = tf.data.Dataset.range(8).map(lambda x: x * 2)  # the runtime starts here, before the strategy
total = int(data.reduce(tf.constant(0, tf.int64), lambda a, b: a + b))
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    variable = tf.Variable(tf.random.uniform([3], seed=None))  # broadcast from worker 0
summed = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.5)), axis=None)  # a float all-reduce
# A second strategy (the Keras guide's fault-tolerance recipe makes one per run): its first collective, an int64
# broadcast, must not meet the float collectives the first one made under the same keys.
second = tf.distribute.MirroredStrategy()
with second.scope():
    counter = tf.Variable(tf.constant(7, tf.int64))
print("server enabled", len(calls), "time(s); total", total, "variable", [round(float(v), 6) for v in variable.numpy()],
      "sum", float(summed), "counter", int(counter.numpy()), type(second).__name__)
"""


@pytest.mark.multiprocess
def test_ops_before_the_strategy_start_the_collective_server_once_and_join(tmp_path):
    """A second enable on a running runtime rebuilt the server under a peer's feet: 3 of 6 runs hung at a broadcast.

    Without that rebuild, a second strategy needs collective keys of its own (see ``_keys_of_its_own``).
    """
    script = tmp_path / "ops_first.py"
    script.write_text(_OPS_BEFORE_THE_STRATEGY)
    result, _ = _tfstrategy("launch", "-n", "2", "--console-workers", "all", "--timeout", "120", "--", sys.executable, str(script), timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sorted(line.split("] ", 1)[1] for line in result.stdout.splitlines() if "server enabled" in line)
    assert len(lines) == 2 and lines[0] == lines[1], lines  # one job: the same variable on both
    assert lines[0].startswith("server enabled 1 time(s); total 56 variable "), lines
    assert lines[0].endswith(" sum 3.0 counter 7 MultiWorkerMirroredStrategy"), lines
