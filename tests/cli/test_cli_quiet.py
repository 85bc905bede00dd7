"""Quiet by default (issue 35): TensorFlow's C++ start-up lines (``I0000 ...``, absl's warning) only under
``--debug``, which shows them even when the user's environment hid them (a flag beats a variable)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tfstrategy.cli._common import tensorflow_log_environment

ROOT = Path(__file__).resolve().parents[2]
#: A line of TensorFlow's C++ logging (absl's format), or absl's notice before its first one.
NATIVE_LOG = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]|WARNING: All log messages before absl)", re.M)


@pytest.mark.parametrize(
    ("debug", "env", "expected"),
    [
        pytest.param(False, {}, {"TF_CPP_MIN_LOG_LEVEL": "2"}, id="default-quiet"),
        pytest.param(False, {"TF_CPP_MIN_LOG_LEVEL": "0"}, {}, id="user-setting-kept"),
        pytest.param(True, {}, {"TF_CPP_MIN_LOG_LEVEL": "0"}, id="debug-shows"),
        pytest.param(True, {"TF_CPP_MIN_LOG_LEVEL": "3"}, {"TF_CPP_MIN_LOG_LEVEL": "0"}, id="debug-beats-variable"),
    ],
)
def test_log_level_by_flag_then_variable(debug: bool, env: dict[str, str], expected: dict[str, str]) -> None:
    assert tensorflow_log_environment(debug, env) == expected


def _run_demo(*flags: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {key: value for key, value in os.environ.items() if not key.startswith(("TF_CPP_", "TFSTRATEGY_"))}
    full.update(env)
    full["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), full.get("PATH", "")])
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), full.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "tfstrategy", "run", *flags, "--", "python",
                           "examples/strategy-demo.py"], capture_output=True, text=True, cwd=ROOT, env=full, timeout=300)


@pytest.mark.slow
def test_run_prints_no_tensorflow_start_up_lines_by_default() -> None:
    result = _run_demo(env={})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "replicas 1" in result.stdout
    assert not NATIVE_LOG.search(result.stderr), result.stderr[-2000:]


@pytest.mark.slow
def test_run_debug_shows_them_even_when_the_environment_hid_them() -> None:
    result = _run_demo("--debug", env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert NATIVE_LOG.search(result.stderr), result.stderr[-2000:]
