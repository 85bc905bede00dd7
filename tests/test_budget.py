"""The suite's time budget (tests/budget.py): the rules of the per-test ceiling and its named exceptions."""

from __future__ import annotations

import pytest

from budget import CEILING_SECONDS, BudgetError, granted_seconds


@pytest.mark.parametrize(
    ("over_ceiling", "timeout", "granted"),
    [
        pytest.param(None, None, None, id="no-marker-the-ceiling"),
        pytest.param(None, pytest.mark.timeout(30).mark, None, id="a-shorter-timeout-needs-no-grant"),
        pytest.param(pytest.mark.over_ceiling(seconds=400, reason="one Ray cluster").mark, None, 400.0, id="granted"),
        pytest.param(pytest.mark.over_ceiling(400, reason="positional seconds").mark, None, 400.0, id="positional"),
    ],
)
def test_a_grant_is_the_ceiling_or_a_named_exception(over_ceiling, timeout, granted):
    assert granted_seconds("t", over_ceiling, timeout) == granted


@pytest.mark.parametrize(
    ("over_ceiling", "timeout", "message"),
    [
        pytest.param(None, pytest.mark.timeout(1200).mark, r"received timeout\(1200\), above the per-test ceiling of "
                     r"120 s\. Make the test faster, or grant it with over_ceiling\(seconds=1200", id="bare-timeout"),
        pytest.param(pytest.mark.over_ceiling(seconds=400).mark, None, r"without a reason", id="no-reason"),
        pytest.param(pytest.mark.over_ceiling(seconds=400, reason="  ").mark, None, r"without a reason", id="blank-reason"),
        pytest.param(pytest.mark.over_ceiling(seconds=60, reason="short").mark, None,
                     r"received over_ceiling\(seconds=60\); an exception grants more than the 120 s", id="not-above"),
        pytest.param(pytest.mark.over_ceiling(reason="no seconds").mark, None, r"over_ceiling\(seconds=None\)",
                     id="no-seconds"),
    ],
)
def test_a_grant_that_breaks_the_rules_is_refused_saying_how_to_fix_it(over_ceiling, timeout, message):
    with pytest.raises(BudgetError, match=message):
        granted_seconds("t", over_ceiling, timeout)


def test_pyproject_sets_the_ceiling_as_pytest_timeout(pytestconfig):
    assert float(pytestconfig.getini("timeout")) == CEILING_SECONDS
