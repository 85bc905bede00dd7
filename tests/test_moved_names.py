"""The 0.1 names that moved still resolve, with a warning that says where to and when they go."""

from __future__ import annotations

import pytest

import tfstrategy


def test_a_moved_name_warns_with_its_new_home_and_its_removal_release():
    with pytest.warns(DeprecationWarning, match=r"import it from tfstrategy.launch.supervisor .* removed in tfstrategy 0.4"):
        result = tfstrategy.LaunchResult
    from tfstrategy.launch.states import RunResult

    assert result is RunResult
