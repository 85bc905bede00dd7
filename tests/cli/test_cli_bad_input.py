"""The CLI on bad and oversized input: exit 2 with one line, first on stderr (issue 13)."""

from __future__ import annotations

import pytest

from helpers import run_cli

DEEP_TF_CONFIG = "[" * 20_000 + "]" * 20_000  # an environment string may hold 128 KB
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3"}  # the setting: TensorFlow's start-up lines came anyway


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(("--cpu-replicas", "9" * 5000), {}, "Received --cpu-replicas 9999", id="5000-digit-cpu-replicas"),
        pytest.param(("--cpu-replicas", "100000"), {}, "expected at most 64", id="cpu-replicas-100000"),
        pytest.param(("--devices", "1" * 10_000), {}, "is not a device", id="10-KB-devices"),
        pytest.param(("--cpu-replicas", "2"), {"TFSTRATEGY_CPU_REPLICAS": "abc"}, "Received TFSTRATEGY_CPU_REPLICAS='abc'", id="env-names-variable"),
        pytest.param((), {"TFSTRATEGY_COLLECTIVE_TIMEOUT": "nan"}, "Received TFSTRATEGY_COLLECTIVE_TIMEOUT='nan'", id="collective-timeout-nan"),
        pytest.param((), {"TF_CONFIG": DEEP_TF_CONFIG}, "nested too deeply", id="deeply-nested-tf-config"),
        pytest.param(
            (), {"TF_CONFIG": '{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": ' + "9" * 5000 + "}}"},
            "number too long", id="5000-digit-task-index",
        ),
    ],
)
def test_check_bad_input_is_one_line_and_exit_2(args, env, message):
    result = run_cli("check", *args, env={**QUIET, **env})
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith("tfstrategy check: error: Received")
    assert message in lines[0]
    assert len(lines[0]) < 800


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "problem"),
    [
        pytest.param({"TF_CONFIG": DEEP_TF_CONFIG}, "nested too deeply", id="deeply-nested-tf-config"),
        pytest.param({"TFSTRATEGY_CPU_REPLICAS": "9" * 5000}, "Received TFSTRATEGY_CPU_REPLICAS='9999", id="5000-digit-cpu-replicas"),
        pytest.param({"TFSTRATEGY_DEVICES": "1" * 10_000}, "Received TFSTRATEGY_DEVICES='1111", id="10-KB-devices"),
    ],
)
def test_env_reports_bad_input_as_a_problem_and_exits_0(env, problem):
    result = run_cli("env", env={**QUIET, **env})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""
    problems = [line for line in result.stdout.splitlines() if line.startswith("- Problem:")]
    assert any(problem in line for line in problems), problems
    assert max(len(line) for line in result.stdout.splitlines()) < 1500


@pytest.mark.slow
def test_tensorflow_start_up_lines_do_not_precede_the_first_line():
    """TensorFlow's C++ import lines (absl, oneDNN) ignore TF_CPP_MIN_LOG_LEVEL=3; only --debug shows them."""
    result = run_cli("check", "--devices", "gpu:3", env=QUIET)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0].startswith("tfstrategy check: error: Received --devices gpu:3;")
    assert "absl::InitializeLog" not in result.stderr and "oneDNN" not in result.stderr
    debug = run_cli("check", "--devices", "gpu:3", "--debug", env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert "oneDNN" in debug.stderr or "absl::InitializeLog" in debug.stderr
