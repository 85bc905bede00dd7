"""The 0.1 names that moved still resolve, with a warning that says where to and when they go."""

from __future__ import annotations

import pytest

import tfstrategy


def test_a_moved_name_warns_with_its_new_home_and_its_removal_release():
    with pytest.warns(DeprecationWarning, match=r"import it from tfstrategy.launch.supervisor .* removed in tfstrategy 0.4"):
        result = tfstrategy.LaunchResult
    from tfstrategy.launch.states import RunResult

    assert result is RunResult


_LAZY = """
import sys
import tfstrategy
assert not any(name.startswith("tfstrategy.launch.") for name in sys.modules), "the launcher loaded eagerly"
assert "tensorflow" not in sys.modules
import tfstrategy.launch.states  # the subpackage the public function shares its name with
from tfstrategy.launch.library import launch
assert tfstrategy.launch is launch, tfstrategy.launch
from tfstrategy.runtime.select import select
assert tfstrategy.select is select and "select" in dir(tfstrategy)
print("lazy", len([name for name in sys.modules if name.startswith("tfstrategy")]))
"""


def test_public_names_load_on_first_use_and_launch_stays_the_function():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _LAZY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("lazy ")


def test_the_slurm_module_moved_to_environments_and_its_names_warn_until_their_removal():
    import tfstrategy.multiworker.slurm as old
    from tfstrategy.environments.slurm import read_slurm_step

    with pytest.warns(DeprecationWarning, match=r"moved to tfstrategy\.environments\.slurm .*removed in tfstrategy 0\.4"):
        moved = old.read_slurm_step
    assert moved is read_slurm_step
    with pytest.raises(AttributeError):
        old.Slurm  # noqa: B018  (only the names the old module had resolve)


def test_the_names_that_moved_to_the_contract_still_import_from_their_old_modules():
    """Module-level names, not the top-level API: their old modules re-export them as they are."""
    import importlib

    from tfstrategy import worker_contract
    from tfstrategy.contract import exits, files, ledger, pod, reports
    from tfstrategy.environments import kubernetes as pod_side
    from tfstrategy.launch import ledger as old_ledger
    from tfstrategy.launch import reports as old_reports
    from tfstrategy.launch import states
    from tfstrategy.multiworker import preemption

    manifests = importlib.import_module("tfstrategy.kubernetes.manifests")  # the package's manifests() shadows it

    assert (states.EXIT_INVALID, states.EXIT_PREEMPTED, states.EXIT_JOIN_TIMEOUT, states.EXIT_STALL) == (
        exits.EXIT_INVALID, exits.EXIT_PREEMPTED, exits.EXIT_JOIN_TIMEOUT, exits.EXIT_STALL)
    assert worker_contract.EXIT_STOPPED == exits.EXIT_STOPPED
    assert preemption.PREEMPTED_EXIT_CODE == exits.EXIT_PREEMPTED
    assert manifests.TENSORFLOW_RESTART_EXIT_CODE == exits.EXIT_TENSORFLOW_RESTART
    assert manifests.POD_VARIABLES is pod.POD_VARIABLES
    assert pod_side.POD_VARIABLES is pod.POD_VARIABLES
    assert old_ledger.Ledger is ledger.Ledger and old_ledger.ledger_path is files.ledger_path
    assert old_reports.ProgressWriter is reports.ProgressWriter and old_reports.ErrorRecord is reports.ErrorRecord


_OFF_THE_TOP_LEVEL = {
    "StrategyKind": "tfstrategy.settings", "choose": "tfstrategy.selection.choose",
    "build": "tfstrategy.selection.strategies", "HostInfo": "tfstrategy.selection.host",
    "configure_cpu_replicas": "tfstrategy.selection.cpu_split", "apply_patches": "tfstrategy.patches",
    "fix_steps_per_execution": "tfstrategy.patches.keras_steps_per_execution",
    "signal_joined": "tfstrategy.multiworker.worker_protocol", "tf_config_from_slurm": "tfstrategy.environments.slurm",
    "collect_env_report": "tfstrategy.diagnostics.env_report",
}


def test_the_top_level_is_what_a_script_calls_and_the_rest_warns_from_its_module():
    import importlib

    assert len(tfstrategy.__all__) <= 25, tfstrategy.__all__
    assert not set(_OFF_THE_TOP_LEVEL) & set(tfstrategy.__all__)
    for name, home in _OFF_THE_TOP_LEVEL.items():
        with pytest.warns(DeprecationWarning, match=rf"import it from {home} .* removed in tfstrategy 0\.4"):
            moved = getattr(tfstrategy, name)
        assert moved is getattr(importlib.import_module(home), name)


def test_the_runtime_and_select_modules_of_0_2_name_their_new_homes():
    import tfstrategy.runtime as old_runtime
    import tfstrategy.selection.select as old_select
    from tfstrategy.runtime.select import select
    from tfstrategy.state import RUNTIME

    with pytest.warns(DeprecationWarning, match=r"moved to tfstrategy\.state .*removed in tfstrategy 0\.4"):
        assert old_runtime.RUNTIME is RUNTIME
    with pytest.warns(DeprecationWarning, match=r"moved to tfstrategy\.runtime\.select .*removed in tfstrategy 0\.4"):
        assert old_select.select is select
