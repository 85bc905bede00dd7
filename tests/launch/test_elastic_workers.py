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
        waiting = last == 2 and len(fleet.attempts[2]) == 1  # round 2's replacement, which never gets ready here
        if last < 2 or waiting:
            _training(fleet, min(last, 1))
        if last == 0 and now > 2:
            fleet.at(0, 1).exit(-signal.SIGKILL)
        if waiting and now > 8:
            fleet.at(1, 0).exit(-signal.SIGKILL)  # at MIN
        if last == 2 and len(fleet.attempts[2]) == 3:
            for worker in fleet.attempts[2][1:]:
                worker.join()
                worker.train(steps=3)
                if now > 20:
                    worker.exit(0)

    result, err, fleet = _run(scenario, tmp_path, workers=2, fewest=1, max_restarts=2)
    # 2 workers -> worker 1 lost, 1 goes on, a replacement for worker 1 waits (restart 1 of 2) -> the one left is
    # killed at MIN before the replacement is ready: the job's failure, restarted whole (2 again; restart 2 of 2),
    # and the replacement, waiting for a round that will not come, is stopped.
    waiting, *restarted = fleet.attempts[2]
    assert [len(group) for group in fleet.attempts[:2]] == [2, 1] and len(restarted) == 2, err
    assert waiting.returncode == -signal.SIGKILL and not waiting.joined
    assert "worker 1 lost: going on with 1 worker" in err and "(restart 2 of 2)" in err
    assert (result.returncode, result.restarts, result.replacements, len(result.reformations)) == (0, 1, 1, 1)


def _train_all(fleet: Fleet) -> None:
    """Every live worker of every attempt joins and trains (a replacement too, ahead of its round)."""
    for attempt in range(len(fleet.attempts)):
        _training(fleet, attempt)


def test_a_lost_workers_replacement_is_taken_back_at_a_step_the_workers_agree_on(tmp_path):
    def scenario(fleet: Fleet, now: float) -> None:
        last = len(fleet.attempts) - 1
        _train_all(fleet)
        if last == 0 and now > 2:
            fleet.at(0, 2).exit(-signal.SIGKILL)
        if last == 2 and len(fleet.attempts[2]) == 3 and now > 20:
            for worker in fleet.attempts[2]:
                worker.exit(0)

    result, err, fleet = _run(scenario, tmp_path, workers=3, fewest=2, max_restarts=1, log_dir=tmp_path / "logs",
                              run_id="r")
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED), err
    # 3 -> worker 2 lost -> 2; a replacement started as worker 2 of round 2, then workers 0 and 1 beside it.
    replacement, *others = fleet.attempts[2]
    assert [len(group) for group in fleet.attempts] == [3, 2, 3] and replacement.index == 2, err
    assert sorted(w.index for w in others) == [0, 1]
    assert {int(w.spec.env["TFSTRATEGY_NUM_WORKERS"]) for w in fleet.attempts[2]} == {3}
    assert {w.spec.env["TF_CONFIG"] for w in fleet.attempts[2]} != set()
    clusters = {json.dumps(json.loads(w.spec.env["TF_CONFIG"])["cluster"]) for w in fleet.attempts[2]}
    assert len(clusters) == 1  # the replacement waited in the cluster the others then joined
    # Taken at a step the workers agree on: SIGTERM (the preemption callbacks), not a kill mid-step.
    assert all(w.signals[:1] == [signal.SIGTERM] for w in fleet.attempts[1])
    assert replacement.returncode == 0  # not stopped with the group it waited for: it trained in the next
    assert "starting a replacement for a lost worker, as worker 2 of the next group (restart 1 of 1)" in err
    assert ("tfstrategy launch: worker 2 back: going on with 3 workers from scratch (nothing committed yet); "
            "the workers stopped at a step they agreed on") in err
    assert (result.restarts, result.replacements, result.workers) == (0, 1, 3)
    records = [json.loads(line) for line in (tmp_path / "logs" / "r" / "reformations.jsonl").read_text().splitlines()]
    assert [(r["lost_worker"], r["joined_worker"], r["workers"], r["round"], r["graceful"]) for r in records] == [
        (2, None, 2, 1, False), (None, 2, 3, 2, True)]


def test_without_a_restart_left_a_lost_worker_is_not_replaced(tmp_path):
    result, err, fleet = _run(_lose(2, at=2, then_succeed=30), tmp_path, workers=3, fewest=2)
    assert (result.returncode, result.replacements) == (0, 0), err
    assert [len(group) for group in fleet.attempts] == [3, 2] and "replacement" not in err


def test_a_worker_that_dies_every_time_is_replaced_at_most_max_restarts_times(tmp_path):
    def scenario(fleet: Fleet, now: float) -> None:
        last = len(fleet.attempts) - 1
        _train_all(fleet)  # a replacement waiting alone in its round gets ready at once
        group = fleet.attempts[last]
        if len(group) == 3 and now > 2 + 10 * last:
            next(w for w in group if w.index == 2).exit(-signal.SIGKILL)  # the OOM killer, every time
        if last == 5 and now > 60:
            for worker in group:
                worker.exit(0)

    result, err, fleet = _run(scenario, tmp_path, workers=3, fewest=2, max_restarts=2)
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED), err
    # lost, replaced, lost again, replaced, lost again: the restarts are used up, the two go on alone.
    assert [len(group) for group in fleet.attempts] == [3, 2, 3, 2, 3, 2], err
    assert (result.restarts, result.replacements, len(result.reformations)) == (0, 2, 5)
    assert err.count("worker 2 lost: going on with 2 workers") == 3 and err.count("worker 2 back:") == 2


def test_a_replacement_that_fails_before_joining_leaves_the_group_alone(tmp_path):
    def scenario(fleet: Fleet, now: float) -> None:
        last = len(fleet.attempts) - 1
        _training(fleet, min(last, 1))
        if last == 0 and now > 2:
            fleet.at(0, 2).exit(-signal.SIGKILL)
        if last == 2:
            for worker in fleet.attempts[2]:
                if worker.returncode is None:
                    worker.exit(1, lines=("RuntimeError: no device",))  # before its strategy: never ready
            if len(fleet.attempts[2]) == 2 and now > 30:
                for worker in fleet.attempts[1]:
                    worker.exit(0)

    result, err, fleet = _run(scenario, tmp_path, workers=3, fewest=2, max_restarts=2)
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED), err
    assert [len(group) for group in fleet.attempts] == [3, 2, 2], err  # two replacements tried, both failed
    assert all(w.returncode == 0 for w in fleet.attempts[1])  # the group was not stopped for them
    assert err.count("the replacement worker 2 exited with status 1 before it created its strategy") == 2
    assert (result.replacements, len(result.reformations), result.workers) == (2, 1, 2)


def test_a_replacement_that_never_creates_its_strategy_is_stopped_at_the_timeout(tmp_path):
    def scenario(fleet: Fleet, now: float) -> None:
        last = len(fleet.attempts) - 1
        _training(fleet, min(last, 1))
        if last == 0 and now > 2:
            fleet.at(0, 2).exit(-signal.SIGKILL)
        if now > 60:
            for worker in fleet.attempts[1]:
                worker.exit(0)

    result, err, fleet = _run(scenario, tmp_path, workers=3, fewest=2, max_restarts=1, join_timeout=20)
    assert (result.returncode, result.replacements) == (0, 1), err
    assert fleet.attempts[2][0].signals == [signal.SIGKILL]
    assert "the replacement worker 2 did not create its strategy within --timeout 20 s; stopped it" in err


def test_a_pipeline_whose_batches_depend_on_the_worker_count_is_said_at_the_re_formation(tmp_path):
    from tfstrategy.contract.ledger import Ledger

    def scenario(fleet: Fleet, now: float) -> None:
        last = len(fleet.attempts) - 1
        _training(fleet, last)
        for worker in fleet.attempts[last]:  # by file, and steps_per_epoch counted from each worker's files
            worker.ledger = Ledger(epoch=0, extra={"sharding": "file", "epoch_steps": 30 // len(fleet.attempts[last])})
        if last == 0 and now > 2:
            fleet.at(0, 2).exit(-signal.SIGKILL)
        if last == 1 and now > 10:
            for worker in fleet.attempts[1]:
                worker.exit(0)

    result, err, fleet = _run(scenario, tmp_path, workers=3, fewest=2)
    assert result.returncode == 0, err
    lines = [line for line in err.splitlines() if line.startswith("tfstrategy launch:")]
    lost = next(i for i, line in enumerate(lines) if "worker 2 lost" in line)
    assert lines[lost + 1] == (
        "tfstrategy launch: the workers of the group before it: each reads files of its own (AutoShardPolicy.FILE, or "
        "AUTO on a dataset of files), so a global batch depends on the number of workers: the re-formed group trains "
        "on other batches than the uninterrupted run would (set the dataset's auto_shard_policy to DATA for the same "
        "batches at every size); it goes on"), err
    assert ("tfstrategy launch: the workers plan 15 steps an epoch in a group of 2, 10 in a group of 3: steps_per_epoch "
            "(or the data) depends on the number of workers") in err
    assert err.count("depends on the number of workers") == 2  # each said once


def test_a_pipeline_of_the_same_global_batches_at_every_size_is_not_said(tmp_path):
    from tfstrategy.contract.ledger import Ledger

    def scenario(fleet: Fleet, now: float) -> None:
        _lose(2, at=2, then_succeed=10)(fleet, now)
        for worker in fleet.attempts[-1]:
            worker.ledger = Ledger(epoch=0, extra={"epoch_steps": 10})

    result, err, _ = _run(scenario, tmp_path, workers=3, fewest=2)
    assert result.returncode == 0 and "worker 2 lost" in err, err
    assert "depends on the number of workers" not in err


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
