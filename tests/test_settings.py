"""Settings: argument > TFSTRATEGY_* variable > default, for every setting including the collective timeout."""

from __future__ import annotations

import pytest

from tfstrategy.errors import SettingsConflictError, StrategyError
from tfstrategy.selection.select import resolve_request
from tfstrategy.settings import DEFAULT_COLLECTIVE_TIMEOUT, ENV_COLLECTIVE_TIMEOUT, resolve_collective_timeout


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
