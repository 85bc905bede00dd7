"""The launcher's diagnosis from the ledgers, through the real monitor loop over fake workers and a fake clock."""

from __future__ import annotations

import json

from fakes import Fleet
from test_policy import _headline, _joined_and_training, _record, _run

from tfstrategy.launch.ledger import FunctionTrace, Ledger
from tfstrategy.launch.states import EndReason

HINT = "batch with drop_remainder=True, or use tfstrategy.prepare_dataset"


def _uneven(fleet: Fleet, now: float) -> None:
    """Worker 1's shard is a batch shorter: after 7 batches its data runs out; worker 0 waits inside batch 8."""
    _joined_and_training(fleet, steps=7)
    fleet.at(0, 0).ledger = Ledger(epoch=0, batches=8, steps=7, total_steps=7, frame="train.py:20 in main",
                                   extra={"epoch_steps": 8})
    if now > 2:
        fleet.at(0, 1).in_step = False
        fleet.at(0, 1).ledger = Ledger(epoch=0, batches=8, steps=7, total_steps=7, end_of_data=((0, 8),),
                                       frame="train.py:20 in main", extra={"epoch_steps": 7})


def test_uneven_shards_are_named_on_the_stall_with_what_the_launcher_saw():
    result, err, _, _ = _run(lambda fleet, now, launcher: _uneven(fleet, now), stall_report=5, stall_timeout=30)
    assert (result.returncode, result.reason) == (125, EndReason.STALLED)
    stall = next(line for line in err.splitlines() if line.startswith("tfstrategy launch: stall:"))
    assert stall == ("tfstrategy launch: stall: worker 1 ran out of data after 7 batch(es) of epoch 1 while worker 0 "
                     f"waits in batch 8: the shards differ by one batch ({HINT})")
    assert "  worker 1: epoch 1, 8 batch(es) begun, 7 done, 7 planned, data ran out in batch 8" in err
    assert "  what the launcher saw: worker 1 has been outside its step for" in err
    assert _headline(err).startswith("tfstrategy launch: worker 1 ran out of data after 7 batch(es) of epoch 1")


def test_the_diagnosed_worker_is_the_root_cause_not_the_peer_whose_collective_aborted_first():
    def scenario(fleet, now, launcher):
        _uneven(fleet, now)
        if now > 3:  # the collective timeout ends worker 0 first; worker 1 is still alive
            fleet.at(0, 0).exit(1, _record("tensorflow.python.framework.errors_impl.UnavailableError",
                                           "Collective ops is aborted by: peer is unavailable", 1003.0))

    result, err, _, clock = _run(scenario, stall_report=30)
    assert (result.returncode, result.reason) == (1, EndReason.FAILED)
    assert _headline(err) == ("tfstrategy launch: worker 1 ran out of data after 7 batch(es) of epoch 1 while worker 0 "
                              f"was in batch 8: the shards differ by one batch ({HINT})")
    assert "  what the launcher saw: worker 0 exited with status 1: tensorflow" in err
    assert "a consequence of a failure elsewhere" not in err
    # Diagnosed: no settle wait (3 s) for another failure to show; only the live worker 1's ledger (written long
    # before, so no write is due) is given the longest pause between two samples and a read (0.375 + 0.25 s) to show
    # it as of the failure.
    assert clock.now < 3 + 0.625 + 0.2


def test_different_train_functions_are_named_when_every_worker_waits_in_its_first_batch():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet, steps=0)
        for worker in fleet.attempts[0]:
            variables = 2 + 2 * worker.index
            worker.ledger = Ledger(epoch=0, batches=1, functions=(FunctionTrace(
                kind="train", fingerprint=f"f{worker.index}", collectives=variables,
                summary=f"Sequential: {variables} variables"),))
        if now > 30:
            for worker in fleet.attempts[0]:
                worker.exit(0)

    result, err, _, _ = _run(scenario, stall_report=5, stall_timeout=None)
    assert "tfstrategy launch: stall: workers 0 and 1 traced different train functions (step 1)\n" in err
    assert "  worker 1: Sequential: 4 variables, 4 collective(s) a step [fingerprint f1]" in err


def test_different_train_functions_in_the_first_batch_fail_the_job_at_the_stall_timeout():
    """No collective timeout ends it (TensorFlow's threads, see upstream-bugs): the launcher does."""
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet, steps=0)
        for worker in fleet.attempts[0]:
            worker.ledger = Ledger(epoch=0, batches=1, functions=(FunctionTrace(
                kind="train", fingerprint=f"f{worker.index}", collectives=2 + worker.index, summary="Sequential"),))

    result, err, fleet, clock = _run(scenario, stall_report=5, stall_timeout=20)
    assert (result.returncode, result.reason) == (125, EndReason.STALLED)
    assert _headline(err) == "tfstrategy launch: workers 0 and 1 traced different train functions (step 1)"
    assert all(worker.stacks_dumped == 1 for worker in fleet.attempts[0])


def _pace(fleet: Fleet, now: float, *, slow_input: float) -> None:
    """Every worker trains; worker 1 waits ``slow_input`` s a step for its input, its peers 2 ms."""
    steps = int(now * 5)
    _joined_and_training(fleet, steps=steps)
    for worker in fleet.attempts[0]:
        wait = slow_input if worker.index == 1 else 0.002
        worker.ledger = Ledger(epoch=0, batches=steps, steps=steps, total_steps=steps, step_seconds=0.2,
                               input_seconds=wait, cpu_seconds=0.05, time=round(now, 1))
    if now > 20:
        for worker in fleet.attempts[0]:
            worker.exit(0)


def test_a_straggler_is_a_warning_while_the_job_runs_on_to_success():
    result, err, fleet, _ = _run(lambda fleet, now, launcher: _pace(fleet, now, slow_input=0.1))
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED)
    warnings = [line for line in err.splitlines() if line.startswith("tfstrategy launch: warning: worker")]
    assert warnings == ["tfstrategy launch: warning: worker 1 is a straggler: it waits 0.10 s a step for its input, "
                        "50.0x its peers' (a slower input pipeline or host: more parallel reads, prefetch, or a cache)"]
    assert err.index(warnings[0]) < err.index("the job goes on")


def test_a_healthy_job_gets_no_straggler_warning():
    result, err, _, _ = _run(lambda fleet, now, launcher: _pace(fleet, now, slow_input=0.0025))
    assert result.returncode == 0 and "straggler" not in err


def test_the_diagnosis_is_kept_in_the_log_dir_as_text_and_json(tmp_path):
    def scenario(fleet, now, launcher):
        fleet.at(0, 0).join()
        fleet.at(0, 0).train(steps=0)
        if now > 1:
            fleet.at(0, 1).exit(1, _record("ValueError", "bad flag", 1001.0))

    result, err, _, _ = _run(scenario, log_dir=tmp_path, run_id="r1")
    assert result.returncode == 1
    text = (tmp_path / "r1" / "attempt-0" / "failure.txt").read_text()
    assert text.startswith("worker 1 raised ValueError before joining: the job cannot form\n"
                           "  worker 1's error: ValueError: bad flag (at train.py:12 in main)\n"
                           "  worker 0 joined and waits for it\n")
    assert "  what the launcher saw: worker 1 exited with status 1 before joining: ValueError: bad flag" in text
    record = json.loads((tmp_path / "r1" / "attempt-0" / "failure.json").read_text())
    assert record["headline"] == "worker 1 raised ValueError before joining: the job cannot form"
    assert record["diagnosis"][2] == "worker 0 joined and waits for it"
    assert (record["worker"], record["exit_status"], record["attempt"]) == (1, 1, 0)
