"""The Makefile's set-up: `make check` installs what the check needs, and says so before the long part."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import ROOT


def _dry_run(target: str, venv: str) -> str:
    """The commands ``make`` would run for ``target`` with fresh venvs at ``venv`` and ``venv``-extras (``make -n``:
    none runs)."""
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={venv}", f"EXTRAS={venv}-extras"],
                          capture_output=True, text=True, check=True)
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_check_on_a_fresh_machine_installs_tensorflow_and_no_test_extras(tmp_path):
    commands = _dry_run("check", str(tmp_path / "venv"))
    assert "pip install --progress-bar on -e '.[cpu]'" in commands, commands
    assert "[cpu,test" not in commands and "ray]" not in commands, commands
    assert commands.index("echo \"make: installing tfstrategy and tensorflow-cpu") < commands.index("-m venv"), commands


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_test_adds_the_test_extra_and_runs_the_ray_and_bench_tests_in_a_venv_of_their_own(tmp_path):
    """Keras imports pandas (Ray's) and matplotlib at start-up where they are installed: .venv has neither."""
    commands = _dry_run("test", str(tmp_path / "venv"))
    first, test = commands.index("-e '.[cpu]'"), commands.index("-e '.[cpu,test]'")
    extras = commands.index(f"{tmp_path / 'venv'}-extras/bin/pip install --progress-bar on -e '.[cpu,test,bench,ray]'")
    main_session = commands.index(f"{tmp_path / 'venv'}/bin/python -m pytest ")
    extras_session = commands.index(f"{tmp_path / 'venv'}-extras/bin/python -m pytest ")
    assert first < test < extras < main_session < extras_session, commands
    assert "-m \"not extras\"" in commands[main_session:extras_session], commands
    assert "-m extras" in commands[extras_session:], commands
