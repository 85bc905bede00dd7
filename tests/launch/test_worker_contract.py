"""The one contract between the launcher and its workers: written by one side, read back whole by the other."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from fakes import Clock, Fleet

from tfstrategy.cli import build_parser
from tfstrategy.cli.launch import options_from_args
from tfstrategy.errors import LaunchError, PrecisionError, SettingsConflictError
from tfstrategy.launch.options import LaunchOptions, worker_settings
from tfstrategy.launch.supervisor import Launcher
from tfstrategy.multiworker.worker_protocol import signal_joined, signal_starting, worker_backup_dir
from tfstrategy.worker_contract import WorkerContract, WorkerSettings

COMMAND = (sys.executable, "train.py")


def test_a_contract_survives_the_environment_whole(tmp_path):
    contract = WorkerContract(
        index=3, num_workers=4, restart=2, join_file=tmp_path / "j", error_file=tmp_path / "e",
        progress_file=tmp_path / "p", launcher_pid=123, lifeline_fd=7, job_tag="abc", node_rank=1,
        settings=WorkerSettings(audit="stop", summary=True, precision="mixed_bfloat16", sentinel="50",
                                profile_dir=tmp_path / "prof", profile_every=2.5, profile_probes=0.5,
                                backup_dir=tmp_path / "b",
                                job_id="run-1", cpu_replicas=2, devices="cpu"))
    environ = contract.to_environ()
    assert all(name.startswith("TFSTRATEGY_") for name in environ)
    assert WorkerContract.from_environ(environ) == contract


def test_outside_launch_the_contract_is_empty_and_the_worker_side_does_nothing(tmp_path):
    contract = WorkerContract.from_environ({})
    assert not contract.launched and contract.restart == 0 and contract.settings == WorkerSettings()
    assert not signal_joined({}) and not signal_starting({})
    assert worker_backup_dir(env={}) is None


def test_the_worker_side_reads_the_join_file_and_backup_dir_through_the_contract(tmp_path):
    environ = WorkerContract(index=1, num_workers=2, join_file=tmp_path / "w1.joined",
                             settings=WorkerSettings(backup_dir=tmp_path / "backup")).to_environ()
    assert signal_starting(environ) and (tmp_path / "w1.joined.starting").exists()
    assert signal_joined(environ) and (tmp_path / "w1.joined").exists()
    environ["TF_CONFIG"] = ('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
                            '"task": {"type": "worker", "index": 1}}')
    assert worker_backup_dir(env=environ) == tmp_path / "backup" / "worker-1"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param({"TFSTRATEGY_WORKER_INDEX": "one", "TFSTRATEGY_NUM_WORKERS": "2"},
                     "Received TFSTRATEGY_WORKER_INDEX='one'; expected this worker's index", id="index-not-a-number"),
        pytest.param({"TFSTRATEGY_WORKER_INDEX": "2", "TFSTRATEGY_NUM_WORKERS": "2"},
                     "Received TFSTRATEGY_WORKER_INDEX=2 with TFSTRATEGY_NUM_WORKERS='2'; expected an index below",
                     id="index-outside-the-job"),
        pytest.param({"TFSTRATEGY_WORKER_INDEX": "0"}, "TFSTRATEGY_NUM_WORKERS=''", id="index-without-count"),
        pytest.param({"TFSTRATEGY_RESTART": "-1"}, "Received TFSTRATEGY_RESTART='-1'; expected a restart count",
                     id="negative-restart"),
        pytest.param({"TFSTRATEGY_LIFELINE_FD": "pipe"}, "Received TFSTRATEGY_LIFELINE_FD='pipe'", id="fd"),
        pytest.param({"TFSTRATEGY_SENTINEL": "often"}, "Received TFSTRATEGY_SENTINEL='often'; expected epoch",
                     id="sentinel"),
        pytest.param({"TFSTRATEGY_PRECISION": "half"}, "Received TFSTRATEGY_PRECISION='half'; expected one of",
                     id="precision"),
        pytest.param({"TFSTRATEGY_PROFILE_EVERY": "soon"}, "Received TFSTRATEGY_PROFILE_EVERY='soon'", id="minutes"),
        pytest.param({"TFSTRATEGY_AUDIT": "loud"}, "Received TFSTRATEGY_AUDIT='loud'; expected one of warn",
                     id="audit"),
        pytest.param({"TFSTRATEGY_NODE_RANK": "x" * 200}, r"Received TFSTRATEGY_NODE_RANK='x{80}\.\.\.'",
                     id="long-value-shortened"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(environ, message):
    with pytest.raises(LaunchError, match=message):
        WorkerContract.from_environ(environ)


def _worker_environ(options: LaunchOptions, env: dict[str, str]) -> dict[str, str]:
    """The environment the launcher gives worker 0 (fake processes: nothing starts)."""
    clock = Clock()
    fleet = Fleet(clock, setup=lambda worker: worker.exit(0))
    Launcher(options, env=env, out=io.StringIO(), err=io.StringIO(), spawn=fleet.spawn, clock=clock,
             wall=clock.wall, sleep=clock.sleep).run()
    return dict(fleet.at(0, 0).spec.env)


def test_the_cli_and_the_api_give_the_workers_the_same_contract(tmp_path):
    """``tfstrategy launch`` and ``tfstrategy.launch()`` both build LaunchOptions, then one mapping."""
    argv = ["launch", "-n", "2", "--precision", "mixed_float16", "--sentinel", "20", "--profile", "--profile-dir",
            str(tmp_path / "prof"), "--profile-every", "3", "--profile-probes", "2", "--audit", "stop", "--",
            sys.executable, "train.py"]
    from_cli = options_from_args(build_parser().parse_args(argv))
    from_api = LaunchOptions(command=COMMAND, num_workers=2, precision="mixed_float16", sentinel="20",
                             profile_dir=tmp_path / "prof", profile_every=3, profile_probes=2, audit="stop")
    expected = WorkerSettings(audit="stop", summary=True, precision="mixed_float16", sentinel="20",
                              profile_dir=tmp_path / "prof", profile_every=3.0, profile_probes=2.0)
    assert worker_settings(from_cli, {}) == worker_settings(from_api, {}) == expected
    contract = WorkerContract.from_environ(_worker_environ(from_api, {}))
    assert contract.settings == expected
    assert (contract.index, contract.num_workers, contract.restart, contract.launched) == (0, 2, 0, True)
    assert contract.join_file is not None and contract.join_file.name == "worker-0.joined"


def test_the_api_defaults_are_the_clis():
    """Before, only the CLI set the sentinel: ``launch()``'s workers ran without it."""
    cli = options_from_args(build_parser().parse_args(["launch", "-n", "1", "--", sys.executable, "t.py"]))
    api = LaunchOptions(command=(sys.executable, "t.py"), num_workers=1)
    assert worker_settings(cli, {}) == worker_settings(api, {})
    assert worker_settings(api, {}).sentinel == "epoch"


def test_settings_the_options_leave_open_come_from_the_environment_and_a_contradiction_is_refused(tmp_path):
    options = LaunchOptions(command=COMMAND, num_workers=1)
    env = {"TFSTRATEGY_PRECISION": "mixed_bfloat16", "TFSTRATEGY_JOB_ID": "run-7",
           "TFSTRATEGY_BACKUP_DIR": str(tmp_path)}
    settings = worker_settings(options, env)
    assert (settings.precision, settings.job_id, settings.backup_dir) == ("mixed_bfloat16", "run-7", Path(tmp_path))
    with pytest.raises(SettingsConflictError, match="TFSTRATEGY_PRECISION"):
        worker_settings(LaunchOptions(command=COMMAND, num_workers=1, precision="float32"), env)
    with pytest.raises(PrecisionError, match="--precision half"):
        Launcher(LaunchOptions(command=COMMAND, num_workers=1, precision="half"), env={})
