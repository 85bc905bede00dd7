"""The Makefile's set-up: `make check` installs what the check needs, and says so before the long part."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import ROOT


def _dry_run(target: str, venv: str) -> str:
    """The commands ``make`` would run for ``target`` with a fresh venv at ``venv`` (``make -n``: none runs)."""
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"], capture_output=True, text=True,
                          check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_check_on_a_fresh_machine_installs_tensorflow_and_no_test_extras(tmp_path):
    commands = _dry_run("check", str(tmp_path / "venv"))
    assert "pip install --progress-bar on -e '.[cpu]'" in commands, commands
    assert "[cpu,test" not in commands and "ray]" not in commands, commands
    assert commands.index("echo \"make: installing tfstrategy and tensorflow-cpu") < commands.index("-m venv"), commands


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_adds_the_test_benchmark_and_ray_extras_after_the_checks_install(tmp_path):
    commands = _dry_run("test", str(tmp_path / "venv"))
    first, extras = commands.index("-e '.[cpu]'"), commands.index("-e '.[cpu,test,bench,ray]'")
    assert first < extras < commands.index(" -m pytest "), commands
