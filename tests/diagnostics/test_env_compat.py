"""``tfstrategy env`` on the private TF/Keras names tfstrategy uses (tfstrategy._compat's accessors)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tfstrategy import _compat
from tfstrategy.cli import build_parser
from tfstrategy.diagnostics.env_report import collect_env_report, env_report_as_dict, format_env_report


def test_the_report_says_how_many_accessors_resolve_and_lists_them_with_compat():
    count = len(_compat.registered_accessors())
    plain = collect_env_report({})
    assert plain.accessors == {}
    assert f"- Private TF/Keras access: {count} of {count} accessors resolve" in format_env_report(plain).splitlines()
    full = collect_env_report({}, compat=True)
    assert set(full.accessors) == set(_compat.registered_accessors())
    lines = format_env_report(full).splitlines()
    assert "- accessor runtime_started: resolved" in lines
    assert env_report_as_dict(full)["accessors"]["checkpoint_write_target"] == "resolved"


def test_a_missing_accessor_is_a_problem_line(monkeypatch):
    from tfstrategy._compat import registry

    monkeypatch.setitem(registry._REGISTRY, "gone_upstream", ("tensorflow.python.eager.context:Context._renamed",))
    report = collect_env_report({}, compat=True)
    assert report.accessors["gone_upstream"] == "MISSING (no tensorflow.python.eager.context:Context._renamed)"
    assert any("accessors gone_upstream" in problem for problem in report.problems)


def test_compat_flag_parses():
    parser = build_parser()
    assert parser.parse_args(["env", "--compat"]).compat is True
    assert parser.parse_args(["env"]).compat is False


REPORT_WITH_COMPAT = """
import json, sys
import tfstrategy
from tfstrategy import _compat

before = sorted({name.split(".")[0] for name in sys.modules} & {"tensorflow", "keras"})
from tfstrategy.diagnostics.env_report import collect_env_report

report = collect_env_report(compat=True)
print(json.dumps({"before": before, "started": _compat.runtime_started(),
                  "missing": [name for name, state in report.accessors.items() if state != "resolved"]}))
"""


@pytest.mark.slow
def test_checking_every_accessor_before_tensorflow_is_imported_leaves_the_runtime_unstarted():
    result = subprocess.run([sys.executable, "-c", REPORT_WITH_COMPAT], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"before": [], "started": False, "missing": []}
