"""Bad settings name where they came from, and oversized values give one short error (issue 13)."""

from __future__ import annotations

import pytest

from tfstrategy.errors import DeviceError, StrategyError
from tfstrategy.runtime.select import resolve_request
from tfstrategy.selection.cpu_split import MAX_CPU_REPLICAS, validate_cpu_replicas
from tfstrategy.selection.devices import parse_devices


@pytest.mark.parametrize(
    ("kwargs", "env", "error", "named"),
    [
        pytest.param({"cpu_replicas": 2}, {"TFSTRATEGY_CPU_REPLICAS": "abc"}, StrategyError, "TFSTRATEGY_CPU_REPLICAS='abc'", id="cpu-replicas-env-vs-argument"),
        pytest.param({}, {"TFSTRATEGY_CPU_REPLICAS": "abc"}, StrategyError, "TFSTRATEGY_CPU_REPLICAS='abc'", id="cpu-replicas-env"),
        pytest.param({"cpu_replicas": "abc"}, {}, StrategyError, "cpu_replicas='abc'", id="cpu-replicas-argument"),
        pytest.param({}, {"TFSTRATEGY_STRATEGY": "mirored"}, StrategyError, "TFSTRATEGY_STRATEGY='mirored'", id="strategy-env"),
        pytest.param({"strategy": "auto"}, {"TFSTRATEGY_STRATEGY": "mirored"}, StrategyError, "TFSTRATEGY_STRATEGY='mirored'", id="strategy-env-vs-argument"),
        pytest.param({}, {"TFSTRATEGY_DEVICES": "gpu0"}, DeviceError, "TFSTRATEGY_DEVICES='gpu0'", id="devices-env"),
        pytest.param({"devices": "cpu"}, {"TFSTRATEGY_DEVICES": "gpu0"}, DeviceError, "TFSTRATEGY_DEVICES='gpu0'", id="devices-env-vs-argument"),
        pytest.param({}, {"TFSTRATEGY_COLLECTIVE_TIMEOUT": "nan"}, StrategyError, "TFSTRATEGY_COLLECTIVE_TIMEOUT='nan'", id="collective-timeout-nan"),
        pytest.param({"collective_timeout": 5}, {"TFSTRATEGY_COLLECTIVE_TIMEOUT": "nan"}, StrategyError, "TFSTRATEGY_COLLECTIVE_TIMEOUT='nan'", id="collective-timeout-nan-vs-argument"),
    ],
)
def test_bad_value_names_its_source(kwargs, env, error, named):
    with pytest.raises(error, match=f"Received {named}"):
        resolve_request(**kwargs, env=env)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(100_000, f"expected at most {MAX_CPU_REPLICAS}, because every logical CPU", id="100000"),
        pytest.param(MAX_CPU_REPLICAS + 1, f"at most {MAX_CPU_REPLICAS}", id="one-over"),
        pytest.param("9" * 5000, r"Received cpu_replicas='99999.*\(5002 characters\); expected a whole number", id="5000-digits"),
        pytest.param("\u0664", "expected a whole number", id="non-ascii-digit"),
    ],
)
def test_cpu_replicas_bounded(value, message):
    with pytest.raises(StrategyError, match=message) as caught:
        validate_cpu_replicas(value)
    assert len(str(caught.value)) < 400


def test_cpu_replicas_at_the_bound_is_accepted():
    assert validate_cpu_replicas(str(MAX_CPU_REPLICAS)) == MAX_CPU_REPLICAS


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param("1" * 10_000, id="10-KB-gpu-id"),
        pytest.param("gpu:" + "9" * 5000, id="5000-digit-index"),
        pytest.param("x" * 10_000, id="10-KB-text"),
        pytest.param("gpu:\u0661", id="non-ascii-index"),
    ],
)
def test_oversized_devices_are_one_short_device_error(spec):
    with pytest.raises(DeviceError, match="is not a device") as caught:
        parse_devices(spec)
    assert len(str(caught.value)) < 600
