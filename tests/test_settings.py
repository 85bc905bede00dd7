"""Settings: argument > TFSTRATEGY_* variable > default, for every setting including the collective timeout."""

from __future__ import annotations

import pytest

from tfstrategy.cli.check import _check_collective_timeout
from tfstrategy.errors import DeviceError, LaunchError, SettingsConflictError, StrategyError
from tfstrategy.runtime.hook_steps import WatchStrategies
from tfstrategy.runtime.inputs import PlanInputs
from tfstrategy.runtime.select import Selection, resolve_request
from tfstrategy.selection.choose import Choice
from tfstrategy.settings import (
    DEFAULT_COLLECTIVE_TIMEOUT,
    ENV_COLLECTIVE_TIMEOUT,
    StrategyKind,
    resolve_collective_timeout,
)
from tfstrategy.state.registry import RUNTIME

TWO_WORKERS = '{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}'


@pytest.mark.parametrize(
    ("argument", "env_value", "expected", "source"),
    [
        pytest.param(None, None, DEFAULT_COLLECTIVE_TIMEOUT, "default", id="default"),
        pytest.param(None, "45", 45.0, f"env {ENV_COLLECTIVE_TIMEOUT}", id="env-seconds"),
        pytest.param(None, "none", None, f"env {ENV_COLLECTIVE_TIMEOUT}", id="env-none-waits-forever"),
        pytest.param(120, None, 120.0, "argument", id="argument"),
        pytest.param(300, None, 300.0, "argument", id="argument-equal-to-default-is-still-the-argument"),
        pytest.param(120, "120", 120.0, "argument", id="argument-and-env-agree"),
        pytest.param("none", None, None, "argument", id="argument-none-text"),
        pytest.param(float("inf"), None, None, "argument", id="argument-infinity"),
    ],
)
def test_collective_timeout_precedence(argument, env_value, expected, source):
    env = {} if env_value is None else {ENV_COLLECTIVE_TIMEOUT: env_value}
    assert resolve_collective_timeout(argument, env) == (expected, source)


def test_explicit_timeout_is_not_overridden_by_the_environment():
    """0.1 let the environment silently replace collective_timeout=300 (it compared with the default)."""
    with pytest.raises(SettingsConflictError, match=r"collective_timeout=300.*TFSTRATEGY_COLLECTIVE_TIMEOUT='45'"):
        resolve_collective_timeout(300, {ENV_COLLECTIVE_TIMEOUT: "45"})


@pytest.mark.parametrize(
    ("argument", "env_value", "named"),
    [
        pytest.param(None, "-3", ENV_COLLECTIVE_TIMEOUT, id="env-negative"),
        pytest.param(None, "nan", ENV_COLLECTIVE_TIMEOUT, id="env-nan"),
        pytest.param(None, "abc", ENV_COLLECTIVE_TIMEOUT, id="env-text"),
        pytest.param(float("nan"), None, "collective_timeout", id="argument-nan"),
        pytest.param(-1, None, "collective_timeout", id="argument-negative"),
        pytest.param(True, None, "collective_timeout", id="argument-bool"),
    ],
)
def test_bad_timeouts_are_refused_naming_their_source(argument, env_value, named):
    env = {} if env_value is None else {ENV_COLLECTIVE_TIMEOUT: env_value}
    with pytest.raises(StrategyError, match=rf"Received {named}=.*expected seconds > 0"):
        resolve_collective_timeout(argument, env)


def test_request_records_where_the_timeout_came_from():
    request = resolve_request(env={ENV_COLLECTIVE_TIMEOUT: "60"})
    assert request.collective_timeout == 60.0
    assert request.sources["collective_timeout"] == f"env {ENV_COLLECTIVE_TIMEOUT}"


def test_no_collective_timeout_by_default():
    """TensorFlow holds a thread per collective for the timeout: a default one aborted fast jobs (upstream-bugs.md)."""
    assert DEFAULT_COLLECTIVE_TIMEOUT is None
    assert resolve_collective_timeout(None, {}) == (None, "default")
    request = resolve_request(env={"TF_CONFIG": TWO_WORKERS})
    assert request.collective_timeout is None and "collective_timeout" not in request.sources



@pytest.mark.parametrize(
    ("kind", "timeout", "cost"),
    [
        pytest.param(StrategyKind.MULTI_WORKER, 120.0, "collective timeout 120 s: TensorFlow keeps a thread per "
                     "collective op alive for 120 s", id="multi-worker-timeout"),
        pytest.param(StrategyKind.MULTI_WORKER, None, None, id="multi-worker-none"),
        pytest.param(StrategyKind.MIRRORED, 120.0, None, id="mirrored-has-no-collective-timeout"),
    ],
)
def test_explain_names_the_cost_of_a_chosen_collective_timeout(kind, timeout, cost):
    selection = Selection(strategy=None, choice=Choice(kind=kind, reasons=("why",)), collective_timeout=timeout)
    if cost is None:
        assert "collective timeout" not in selection.explain()
    else:
        assert cost in selection.explain()


@pytest.mark.parametrize(("timeout", "cost"), [(45.0, True), (None, False)])
def test_exit_summary_names_the_cost_of_a_chosen_collective_timeout(timeout, cost, monkeypatch):
    monkeypatch.setattr(RUNTIME.hook, "joined", True)
    step = WatchStrategies(PlanInputs(consumer="hook", cluster_tasks=2, cluster_source="TF_CONFIG",
                                      collective_timeout=timeout))
    change = step.change()
    assert change is not None and change.startswith("2 workers joined one MultiWorkerMirroredStrategy")
    assert ("TensorFlow keeps a thread per collective op alive for 45 s" in change) is cost


@pytest.mark.parametrize(
    ("tasks", "env_value", "expected"),
    [
        pytest.param(2, None, 60.0, id="multi-worker-bounded-by-join-timeout"),
        pytest.param(1, None, None, id="one-task-no-collectives-to-bound"),
        pytest.param(2, "30", None, id="variable-decides-through-select"),
    ],
)
def test_check_bounds_its_few_collectives(tasks, env_value, expected, monkeypatch):
    monkeypatch.delenv(ENV_COLLECTIVE_TIMEOUT, raising=False)
    if env_value is not None:
        monkeypatch.setenv(ENV_COLLECTIVE_TIMEOUT, env_value)
    assert _check_collective_timeout(tasks, 60.0) == expected


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        pytest.param("TFSTRATEGY_CPU_REPLICAS", " 4 ", 4, id="integer-stripped"),
        pytest.param("TFSTRATEGY_CPU_REPLICAS", None, None, id="unset-default"),
        pytest.param("TFSTRATEGY_AUDIT", "", "warn", id="blank-is-unset"),
        pytest.param("TFSTRATEGY_AUDIT", "STOP", "stop", id="one-of-any-case"),
        pytest.param("TFSTRATEGY_SENTINEL", "on", "epoch", id="sentinel-on"),
        pytest.param("TFSTRATEGY_PRECISION", "mixed-float16", "mixed_float16", id="precision-dash"),
        pytest.param("TFSTRATEGY_PROFILE", "off", None, id="profile-off"),
        pytest.param("TFSTRATEGY_DEBUG", "1", True, id="flag"),
        pytest.param("TFSTRATEGY_RESTART", None, 0, id="restart-default"),
    ],
)
def test_a_variable_parses_its_text_else_gives_its_default(name, text, expected):
    from tfstrategy.settings import variable

    env = {} if text is None else {name: text}
    assert variable(name).read(env) == expected


def test_a_bad_variable_names_itself_and_what_a_valid_value_is():
    from tfstrategy.errors import LaunchError
    from tfstrategy.settings import CPU_REPLICAS

    with pytest.raises(StrategyError, match=r"^Received TFSTRATEGY_CPU_REPLICAS='0'; expected a number of logical CPU "
                                            r"devices, 1 or more\.$"):
        CPU_REPLICAS.read({"TFSTRATEGY_CPU_REPLICAS": "0"})
    with pytest.raises(LaunchError, match=r"'x'; expected a number .* \(set by launch\)\.$"):
        CPU_REPLICAS.read({"TFSTRATEGY_CPU_REPLICAS": "x"}, error=LaunchError, fix="set by launch")


def test_the_hook_reads_its_device_check_and_the_settings_it_quotes_from_its_inputs():
    from tfstrategy.runtime.inputs import HOOK, derive_inputs

    inputs = derive_inputs(HOOK, env={"TFSTRATEGY_DEVICE_CHECK": "warn", "TFSTRATEGY_CPU_REPLICAS": "2"})
    assert (inputs.device_check, dict(inputs.flags), inputs.cpu_replicas) == ("warn", {"--cpu-replicas": "2"}, 2)
    assert derive_inputs(HOOK, env={}).flags == {}


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        pytest.param("TFSTRATEGY_STRATEGY", "Multi-Worker", StrategyKind.MULTI_WORKER, id="strategy"),
        pytest.param("TFSTRATEGY_STRATEGY", None, StrategyKind.AUTO, id="strategy-default-auto"),
        pytest.param("TFSTRATEGY_DEVICES", "gpu:1,0", "/gpu:1,/gpu:0", id="devices"),
        pytest.param("TFSTRATEGY_PORT_RANGE", " 31000-31099 ", (31000, 31099), id="port-range"),
        pytest.param("TFSTRATEGY_RUN_ID", "exp1", "exp1", id="run-id"),
    ],
)
def test_a_variable_the_cli_also_takes_parses_as_its_flag_does(name, text, expected):
    from tfstrategy.settings import variable

    value = variable(name).read({} if text is None else {name: text})
    assert (str(value) if name == "TFSTRATEGY_DEVICES" else value) == expected


@pytest.mark.parametrize(
    ("name", "text", "error", "message"),
    [
        pytest.param("TFSTRATEGY_STRATEGY", "mirored", StrategyError,
                     r"^Received TFSTRATEGY_STRATEGY='mirored'; expected one of: .* Did you mean 'mirrored'\?",
                     id="strategy"),
        pytest.param("TFSTRATEGY_DEVICES", "gpu0", DeviceError, r"^Received TFSTRATEGY_DEVICES='gpu0'; 'gpu0' is not",
                     id="devices"),
        pytest.param("TFSTRATEGY_PORT_RANGE", "lots", LaunchError,
                     r"^Received TFSTRATEGY_PORT_RANGE 'lots'; expected LOW-HIGH", id="port-range"),
        pytest.param("TFSTRATEGY_RUN_ID", "a/b", LaunchError,
                     r"^Received TFSTRATEGY_RUN_ID 'a/b'; expected one folder name", id="run-id"),
    ],
)
def test_its_error_is_the_flags_naming_the_variable_whatever_error_the_reader_asks_for(name, text, error, message):
    """The parser words its own message (what each flag's says), so ``read(error=...)`` does not rewrite it."""
    from tfstrategy.settings import variable

    with pytest.raises(error, match=message):
        variable(name).read({name: text}, error=SettingsConflictError, fix="never shown")


def test_a_variable_writes_the_text_it_reads_back():
    from pathlib import Path

    from tfstrategy.settings import variable

    for name, value in (("TFSTRATEGY_STRATEGY", StrategyKind.ONE_DEVICE), ("TFSTRATEGY_DEBUG", True),
                        ("TFSTRATEGY_PROFILE_EVERY", 2.5), ("TFSTRATEGY_PROFILE_EVERY", 10.0),
                        ("TFSTRATEGY_BACKUP_DIR", Path("/b/k")), ("TFSTRATEGY_CPU_REPLICAS", 4)):
        spec = variable(name)
        assert spec.read(spec.to_environ(value)) == value, name
    assert variable("TFSTRATEGY_PROFILE_EVERY").to_environ(10.0) == {"TFSTRATEGY_PROFILE_EVERY": "10"}
    assert variable("TFSTRATEGY_DEBUG").to_environ(False) == variable("TFSTRATEGY_JOB_ID").to_environ(None) == {}


@pytest.mark.parametrize(
    ("argument", "env", "expected", "source"),
    [
        pytest.param(None, {}, StrategyKind.AUTO, "default", id="default"),
        pytest.param(None, {"TFSTRATEGY_STRATEGY": "one-device"}, StrategyKind.ONE_DEVICE, "env TFSTRATEGY_STRATEGY",
                     id="variable"),
        pytest.param("mirrored", {}, StrategyKind.MIRRORED, "argument", id="argument"),
        pytest.param(StrategyKind.MIRRORED, {"TFSTRATEGY_STRATEGY": "Mirrored"}, StrategyKind.MIRRORED, "argument",
                     id="both-agree"),
    ],
)
def test_resolve_takes_argument_then_variable_then_default(argument, env, expected, source):
    from tfstrategy.settings import STRATEGY

    setting = STRATEGY.resolve("strategy", argument, env, StrategyKind.parse)
    assert (setting.value, setting.source) == (expected, source)


def test_resolve_refuses_code_and_variable_that_differ_and_names_a_bad_value_where_it_came_from():
    from tfstrategy.settings import STRATEGY

    with pytest.raises(SettingsConflictError, match="Received strategy='mirrored' in code and TFSTRATEGY_STRATEGY='tpu'"):
        STRATEGY.resolve("strategy", "mirrored", {"TFSTRATEGY_STRATEGY": "tpu"}, StrategyKind.parse)
    with pytest.raises(StrategyError, match="^Received strategy='mirored'"):
        STRATEGY.resolve("strategy", "mirored", {}, StrategyKind.parse)
    with pytest.raises(StrategyError, match="^Received TFSTRATEGY_STRATEGY='mirored'"):
        STRATEGY.resolve("strategy", "mirrored", {"TFSTRATEGY_STRATEGY": "mirored"}, StrategyKind.parse)
