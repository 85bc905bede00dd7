"""``tfstrategy launch -n MIN:MAX`` on one machine: a worker lost re-forms the others; policy with fakes.

A worker killed with no error of its own (the OOM killer, its device gone) is lost: while more than
MIN train, the others re-form without it from the newest committed step, which is not a restart.
An error in the script, or a loss at MIN, is the job's failure as without MIN (restarted whole under
``--max-restarts``). The real run is ``test_elastic_job.py``'s local case.
"""

from __future__ import annotations

import argparse
import io
import json
import signal
import sys

import pytest
from fakes import Clock, Fleet

from tfstrategy.errors import LaunchError
from tfstrategy.launch.reports import ErrorRecord
from tfstrategy.launch.states import EndReason
from tfstrategy.launch.supervisor import Launcher, LaunchOptions, validate_launch_options

COMMAND = (sys.executable, "train.py")


def _run(scenario, tmp_path, *, workers: int, fewest: int | None, **options):
    clock = Clock()
    fleet = Fleet(clock)
    err = io.StringIO()
    backup = tmp_path / "backup"
    backup.mkdir(mode=0o700, exist_ok=True)
    launcher = Launcher(LaunchOptions(command=COMMAND, num_workers=workers, min_workers=fewest, backup_dir=backup,
                                      **options), env={}, out=io.StringIO(), err=err, spawn=fleet.spawn,
                        clock=clock, wall=clock.wall, sleep=clock.sleep)

    def tick(now: float) -> None:
        if now > 3600:
            raise AssertionError("the scenario never ended")
        scenario(fleet, now)

    clock.hooks.append(tick)
    return launcher.run(), err.getvalue(), fleet


def _training(fleet: Fleet, attempt: int) -> None:
    for worker in fleet.attempts[attempt]:
        if worker.returncode is None:
            worker.join()
            worker.train(steps=3)


def _lose(index: int, at: float, then_succeed: float):
    """Worker ``index`` of the first group is SIGKILLed at ``at``; the next group succeeds at ``then_succeed``."""

    def scenario(fleet: Fleet, now: float) -> None:
        last = len(fleet.attempts) - 1
        _training(fleet, last)
        if last == 0 and now > at:
            fleet.at(0, index).exit(-signal.SIGKILL)
        if last >= 1 and now > then_succeed:
            for worker in fleet.attempts[last]:
                worker.exit(0)

    return scenario


def test_a_worker_killed_re_forms_the_others_without_it_and_the_job_succeeds(tmp_path):
    result, err, fleet = _run(_lose(2, at=2, then_succeed=10), tmp_path, workers=3, fewest=2, log_dir=tmp_path / "logs",
                              run_id="r")
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED), err
    assert [len(group) for group in fleet.attempts] == [3, 2]  # the re-formed group: workers 0 and 1
    assert {int(w.spec.env["TFSTRATEGY_NUM_WORKERS"]) for w in fleet.attempts[1]} == {2}
    assert all(w.returncode == -signal.SIGKILL for w in fleet.attempts[0][:2])  # stuck with a dead peer: no grace
    assert "tfstrategy launch: worker 2 was killed by SIGKILL" in err
    assert "tfstrategy launch: worker 2 lost: going on with 2 workers from scratch (nothing committed yet)" in err
    assert result.restarts == 0 and result.failures == []  # a re-formation, not a restart nor the job's failure
    record = json.loads((tmp_path / "logs" / "r" / "reformations.jsonl").read_text())
    assert (record["lost_worker"], record["workers"], record["round"]) == (2, 2, 1)


def test_an_error_in_the_script_is_the_jobs_failure_not_a_loss(tmp_path):
    def scenario(fleet: Fleet, now: float) -> None:
        _training(fleet, 0)
        if now > 2:
            fleet.at(0, 1).exit(1, error=ErrorRecord(type="ValueError", message="bad batch", frame="train.py:9 in main",
                                                     time=now), lines=("ValueError: bad batch",))

    result, err, fleet = _run(scenario, tmp_path, workers=3, fewest=1)
    assert (result.returncode, result.reason) == (1, EndReason.FAILED)
    assert len(fleet.attempts) == 1 and "lost: going on" not in err  # the others would meet the same error


def test_a_loss_at_min_fails_the_job_and_a_restart_brings_back_every_worker(tmp_path):
    def scenario(fleet: Fleet, now: float) -> None:
        last = len(fleet.attempts) - 1
        _training(fleet, last)
        if last in (0, 1) and now > 2 + 4 * last:
            fleet.at(last, len(fleet.attempts[last]) - 1).exit(-signal.SIGKILL)
        if last == 2 and now > 20:
            for worker in fleet.attempts[last]:
                worker.exit(0)

    result, err, fleet = _run(scenario, tmp_path, workers=2, fewest=1, max_restarts=1)
    # 2 workers -> worker 1 lost, 1 goes on -> that one killed at MIN: the job's failure, restarted whole (2 again).
    assert [len(group) for group in fleet.attempts] == [2, 1, 2], err
    assert "worker 1 lost: going on with 1 worker" in err and "(restart 1 of 1)" in err
    assert (result.returncode, result.restarts, len(result.reformations)) == (0, 1, 1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"num_workers": 2, "min_workers": 3}, "Received -n 3:2; expected -n MIN:MAX with 1 <= MIN <= MAX",
                     id="min-above-max"),
        pytest.param({"num_workers": 2, "min_workers": 0}, "Received -n 0:2; expected -n MIN:MAX", id="min-zero"),
        pytest.param({"num_workers": 2, "min_workers": 1, "backup_dir": None}, "-n 1:2 without --backup-dir",
                     id="no-backup-dir"),
    ],
)
def test_bad_elastic_worker_counts_are_refused_before_anything_starts(options, message, tmp_path):
    options = {"backup_dir": tmp_path, **options}
    with pytest.raises(LaunchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_launch_options(LaunchOptions(command=COMMAND, **options))


def test_with_nnodes_the_job_is_elastic_by_its_nodes(tmp_path):
    from tfstrategy.launch.rendezvous.options import NodeOptions

    nodes = NodeOptions(nnodes=2, node_rank=0, master_host="127.0.0.1", master_port=29400, secret=b"s" * 32)
    with pytest.raises(LaunchError, match="pass --nnodes MIN:MAX with -n 2"):
        validate_launch_options(LaunchOptions(command=COMMAND, num_workers=2, min_workers=1, backup_dir=tmp_path,
                                              nodes=nodes))


@pytest.mark.parametrize(("value", "parsed"), [("3", (None, 3)), ("2:4", (2, 4)), ("0", (None, 0)), ("-1", (None, -1))])
def test_the_cli_reads_n_or_min_max(value, parsed):
    from tfstrategy.cli.launch import _WorkerCount

    namespace = argparse.Namespace()
    _WorkerCount(["-n"], "num_workers")(argparse.ArgumentParser(), namespace, value)
    assert (namespace.min_workers, namespace.num_workers) == parsed


def test_the_cli_refuses_what_is_neither_first_thing_with_exit_2(capsys):
    from tfstrategy.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["launch", "-n", "two", "--", "true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and "Received -n 'two'; expected a worker count N, or MIN:MAX" in err[0], err
