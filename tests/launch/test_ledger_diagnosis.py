"""The launcher's diagnosis from the workers' ledgers (pure): each cause named, a healthy job left alone."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tfstrategy.launch.ledger import FunctionTrace, Ledger
from tfstrategy.launch.ledger_diagnosis import PREPARE_HINT, Diagnosis, WorkerView, diagnose
from tfstrategy.launch.stragglers import StragglerWatch
from tfstrategy.runtime.ledger import LedgerKeeper
from tfstrategy.runtime.worker_watch import heartbeat_loop
from tfstrategy.stacks import TensorFlowRuns

TRAIN = FunctionTrace(kind="train", fingerprint="a1b2c3", collectives=2, summary="Sequential: 2 variables")


def _ledger(**fields) -> Ledger:
    base = dict(epoch=0, batches=3, steps=3, total_steps=3, functions=(TRAIN,), frame="train.py:30 in main")
    return Ledger(**{**base, **fields})


def _running(index: int, ledger: Ledger | None = None, **fields) -> WorkerView:
    return WorkerView(index=index, ledger=ledger if ledger is not None else _ledger(), joined=True, joining=True,
                      **{"steps": 3, "in_step": True, **fields})


def test_a_healthy_job_has_no_diagnosis():
    assert diagnose([_running(0), _running(1)]) is None
    # every worker's data ran out at the same batch: the normal end of an epoch without steps_per_epoch
    ended = _ledger(epoch=1, batches=0, steps=0, end_of_data=((0, 9),), extra={"epoch_steps": 8})
    assert diagnose([_running(0, ended, in_step=False), _running(1, ended, in_step=False)]) is None
    # ... and a peer that failed for another reason after that end is not "ahead" of it
    last = _ledger(epoch=0, batches=9, steps=8, end_of_data=((0, 9),))
    failed = WorkerView(index=1, ledger=last, returncode=1, joined=True, error_type="ValueError")
    assert diagnose([_running(0, last, in_step=False), failed]) is None


def test_a_worker_that_exits_0_before_joining_is_named_the_job_cannot_form():
    found = diagnose([_running(0), WorkerView(index=1, returncode=0)])
    assert found is not None and found.index == 1 and found.cause == "early-exit"
    assert found.headline == "worker 1 exited 0 before joining: the job cannot form"
    assert "worker 0 joined and waits for it" in found.evidence


def test_a_worker_that_raises_before_joining_is_named_with_its_exception():
    creating = WorkerView(index=0, joining=True)
    found = diagnose([creating, WorkerView(index=1, returncode=1, error_type="ValueError",
                                           error="ValueError: bad flag (at train.py:7 in <module>)",
                                           ledger=Ledger(frame="train.py:7 in <module>"))])
    assert found is not None
    assert found.headline == "worker 1 raised ValueError before joining: the job cannot form"
    assert found.evidence[:2] == ("worker 1's error: ValueError: bad flag (at train.py:7 in <module>)",
                                  "worker 0 is creating its strategy and waits for it")
    assert "worker 1's last frame in your code: train.py:7 in <module>" in found.evidence


def test_an_exit_before_joining_with_no_peer_waiting_is_no_diagnosis():
    # both ended before joining (a script without a strategy): nobody waits, nothing to explain
    assert diagnose([WorkerView(index=0, returncode=0), WorkerView(index=1, returncode=0)]) is None


def test_a_stopped_worker_is_named_with_its_step_and_frame():
    found = diagnose([_running(0, steps=5), _running(1, steps=4, in_step=False, stopped=True)])
    assert found is not None and found.cause == "stopped" and found.index == 1
    assert found.headline == "worker 1 is stopped (SIGSTOP or a debugger) after step 4; its peers wait for it"
    assert "worker 1's last frame in your code: train.py:30 in main" in found.evidence
    assert "worker 0 is inside step 6" in found.evidence


def test_different_train_functions_are_named_with_both_fingerprints():
    other = FunctionTrace(kind="train", fingerprint="ffee99", collectives=3, summary="Sequential: 4 variables")
    found = diagnose([_running(0, steps=0), _running(1, _ledger(functions=(other,)), steps=0)])
    assert found is not None and found.cause == "different-functions"
    assert found.headline == "workers 0 and 1 traced different train functions (step 1)"
    assert found.evidence[0] == "worker 0: Sequential: 2 variables, 2 collective(s) a step [fingerprint a1b2c3]"
    assert found.evidence[1] == "worker 1: Sequential: 4 variables, 3 collective(s) a step [fingerprint ffee99]"


def test_the_same_function_traced_again_on_every_worker_is_no_diagnosis():
    again = FunctionTrace(kind="train", fingerprint="0d0d0d", epoch=2, step=40)
    ledger = _ledger(functions=(TRAIN, again))
    assert diagnose([_running(0, ledger), _running(1, ledger)]) is None


def test_a_worker_whose_data_ran_out_a_batch_early_is_named_while_its_peer_waits():
    short = _ledger(epoch=0, batches=8, steps=7, end_of_data=((0, 8),))
    waiting = _ledger(epoch=0, batches=8, steps=7)
    found = diagnose([_running(0, waiting, steps=7), _running(1, short, steps=7, in_step=False)])
    assert found is not None and found.cause == "uneven-shards" and found.index == 1
    assert found.headline == (
        "worker 1 ran out of data after 7 batch(es) of epoch 1 while worker 0 waits in batch 8: the shards differ by "
        f"one batch ({PREPARE_HINT})")


def test_a_worker_that_left_after_its_shorter_shard_is_named_while_its_peer_waits():
    # worker 1 ran out in the last epoch and exited 0; worker 0 waits inside batch 8 of that epoch
    gone = WorkerView(index=1, returncode=0, joined=True, steps=7,
                      ledger=_ledger(epoch=2, batches=8, steps=7, end_of_data=((0, 8), (1, 8), (2, 8))))
    found = diagnose([_running(0, _ledger(epoch=2, batches=8, steps=7), steps=23), gone])
    assert found is not None and found.index == 1
    assert found.headline.startswith("worker 1 ran out of data after 7 batch(es) of epoch 3 while worker 0 waits in "
                                     "batch 8")


def test_workers_whose_data_ran_out_at_different_batches_are_uneven():
    one = _ledger(epoch=1, batches=1, steps=0, end_of_data=((0, 9),))
    other = _ledger(epoch=1, batches=1, steps=0, end_of_data=((0, 8),))
    found = diagnose([_running(0, one), _running(1, other)])
    assert found is not None and found.index == 1
    assert found.headline.startswith("worker 1 ran out of data after 7 batch(es) of epoch 1, worker 0 after 8: the "
                                     "shards differ by one batch")


def test_planned_epoch_steps_that_differ_are_uneven_before_the_data_runs_out():
    found = diagnose([_running(0, _ledger(extra={"epoch_steps": 8})), _running(1, _ledger(extra={"epoch_steps": 7}))])
    assert found is not None and found.cause == "uneven-shards" and found.index == 1
    assert found.headline == (f"worker 1 plans 7 batch(es) in epoch 1 while worker 0 plans 8: the shards differ by "
                              f"one batch ({PREPARE_HINT})")


def _steady(index: int, written: float, *, input_seconds: float, cpu: float, step: float = 0.2) -> Ledger:
    return Ledger(epoch=0, batches=int(written), steps=int(written), step_seconds=step, input_seconds=input_seconds,
                  cpu_seconds=cpu, time=written)


def _watch(readings: int, make) -> list:
    watch, found = StragglerWatch(), []
    for reading in range(readings):
        found += watch.update({index: make(index, float(reading + 1)) for index in range(3)})
    return found


def test_a_worker_waiting_for_its_input_is_a_straggler_after_eight_readings():
    def make(index, written):
        return _steady(index, written, input_seconds=0.10 if index == 2 else 0.002, cpu=0.1)

    assert _watch(7, make) == []
    found = _watch(12, make)
    assert len(found) == 1 and found[0].index == 2 and found[0].cause == "straggler"
    assert found[0].headline.startswith("worker 2 is a straggler: it waits 0.10 s a step for its input, 50.0x its "
                                        "peers'")


def test_a_worker_whose_steps_burn_more_cpu_is_a_straggler_on_compute():
    def make(index, written):
        return _steady(index, written, input_seconds=0.001, cpu=0.5 if index == 0 else 0.05, step=0.6)

    found = _watch(10, make)
    assert len(found) == 1 and found[0].index == 0
    assert found[0].headline.startswith("worker 0 is a straggler: its steps take 10.0x its peers' CPU")


DECODE = "/job/train.py:12 in decode"


def test_a_worker_slow_in_its_py_function_is_named_with_the_function_not_as_waiting_for_input_or_cpu():
    def make(index, written):  # the py_function burns CPU too, and a custom loop's input wait holds it as well
        slow = index == 1
        return replace(_steady(index, written, input_seconds=0.16 if slow else 0.002, cpu=0.2 if slow else 0.05),
                       py_function_seconds=0.15 if slow else 0.001, py_function=DECODE)

    assert _watch(7, make) == []
    found = _watch(10, make)
    assert [d.headline for d in found] == [
        "worker 1 is a straggler: it spends 0.15 s a step in a tf.py_function/numpy_function (decode at train.py:12), "
        "150.0x its peers' (in its input's map or its step: TensorFlow runs it in Python, one call at a time; make it "
        "faster, or write it with TensorFlow ops)"]


def test_a_healthy_job_with_a_py_function_on_every_worker_has_no_straggler():
    rng = random.Random(11)

    def make(index, written):  # every worker's step runs the same py_function (0.1 s of its 0.2 s, with jitter)
        return replace(_steady(index, written, input_seconds=0.002 * rng.uniform(0.2, 3.0),
                               cpu=0.12 * rng.uniform(0.8, 1.25)),
                       py_function_seconds=0.1 * rng.uniform(0.75, 1.3), py_function=DECODE)

    assert _watch(500, make) == []


def test_a_worker_whose_host_burns_cpu_beside_a_shared_py_function_is_named_on_cpu():
    def make(index, written):  # every worker sleeps in the same py_function; worker 2's host burns CPU besides
        return replace(_steady(index, written, input_seconds=0.001, cpu=0.25 if index == 2 else 0.02, step=0.3),
                       py_function_seconds=0.1, py_function=DECODE)

    found = _watch(10, make)
    assert [d.headline for d in found] == ["worker 2 is a straggler: its steps take 12.5x its peers' CPU (0.25 s a step "
                                           "against 0.02 s: a slower or busier host, or more work on this worker)"]


def test_a_shared_py_function_that_waits_behind_a_cpu_burning_thread_is_not_the_cause():
    # Measured (the planted slow step under load): worker 1's sleeping numpy_function took 1.5x its peers'
    # while a thread beside it burned the CPU; the warning named the function, not the host.
    def make(index, written):
        slow = index == 1
        return replace(_steady(index, written, input_seconds=0.001, cpu=0.3 if slow else 0.04, step=0.3),
                       py_function_seconds=0.12 if slow else 0.08, py_function=DECODE)

    found = _watch(10, make)
    assert [d.headline for d in found] == ["worker 1 is a straggler: its steps take 7.5x its peers' CPU (0.30 s a step "
                                           "against 0.04 s: a slower or busier host, or more work on this worker)"]


def test_a_straggler_is_named_for_what_most_of_its_slow_readings_found_not_the_last_ones():
    # Measured (the planted slow step in a loaded full run): the warning came at the reading where worker 1's
    # sleeping numpy_function took 2.4x its peers' (0.11 s against 0.046 s) and its CPU only 0.12 s a step more,
    # so that reading alone named the function; its other readings had found the CPU.
    def make(index, written):
        slow, last = index == 1, written == 8.0
        cpu = (0.16 if last else 0.3) if slow else 0.04
        return replace(_steady(index, written, input_seconds=0.001, cpu=cpu, step=0.3),
                       py_function_seconds=(0.11 if last else 0.1) if slow else 0.046 if last else 0.1,
                       py_function=DECODE)

    found = _watch(8, make)
    assert [d.headline for d in found] == ["worker 1 is a straggler: its steps take 7.5x its peers' CPU (0.30 s a step "
                                           "against 0.04 s: a slower or busier host, or more work on this worker)"]


def test_a_py_function_place_without_a_line_is_left_out_of_the_warning():
    def make(index, written):
        return replace(_steady(index, written, input_seconds=0.001, cpu=0.1),
                       py_function_seconds=0.1 if index == 0 else 0.001, py_function="")

    found = _watch(10, make)
    assert found[0].headline.startswith("worker 0 is a straggler: it spends 0.10 s a step in a "
                                        "tf.py_function/numpy_function, 100.0x its peers'")


def test_a_fast_reading_now_and_then_does_not_hide_a_straggler():
    def make(index, written):
        slow = index == 1 and int(written) % 5 != 0  # every fifth reading is normal (an epoch's end)
        return _steady(index, written, input_seconds=0.1 if slow else 0.002, cpu=0.1)

    found = _watch(40, make)
    assert [(d.index, d.evidence[0].split(";")[0]) for d in found] == [(1, "slow in 8 of its last 9 readings")]


def test_a_worker_slow_in_every_other_reading_is_noise_not_a_straggler():
    def make(index, written):
        noisy = int(written) % 2 == index % 2  # each worker's step burns twice its peers' CPU every other reading
        return _steady(index, written, input_seconds=0.001, cpu=0.3 if noisy else 0.1, step=0.4)

    assert _watch(400, make) == []


def test_a_reading_without_step_timing_is_no_evidence_either_way():
    def make(index, written):
        untimed = int(written) % 3 == 0  # a window that saw no step: an epoch's end, an evaluation
        return Ledger(steps=int(written), step_seconds=None if untimed else 0.2, input_seconds=None if untimed else
                      (0.1 if index == 1 else 0.002), cpu_seconds=None if untimed else 0.1, time=written)

    found = _watch(12, make)  # 8 timed readings, all slow
    assert [d.index for d in found] == [1]


class _Finished(Exception):
    """The simulated worker's time is up (ends the heartbeat's loop)."""


def _heartbeat_ledgers(draw: Callable[[], float], *, step: float, in_function: float, phase: float,
                       seconds: float = 120.0) -> list[Ledger]:
    """The ledgers a worker's real keeper writes on the heartbeat's real schedule (``heartbeat_loop``, its pauses
    drawn with ``draw``) while each of its steps (``step`` seconds, from ``phase``) runs a ``py_function`` for
    its first ``in_function`` seconds; fake clocks."""
    now, written = [0.0], []

    def runs() -> TensorFlowRuns:
        inside = (now[0] - phase) % step < in_function
        return TensorFlowRuns(py_functions=(DECODE,) if inside else ())

    keeper = LedgerKeeper(Path("unwritten"), clock=lambda: now[0], cpu_clock=lambda: 0.01 * keeper.total_steps,
                          wall=lambda: now[0], frame=lambda: "", runs=runs,
                          write=lambda path, ledger: written.append(ledger))
    keeper.epoch_begins(0)
    keeper.batch_begins()
    step_ends = [phase + step]

    def sleep(pause: float) -> None:  # the steps that end meanwhile
        if now[0] >= seconds:
            raise _Finished
        wakes = now[0] + pause
        while step_ends[0] <= wakes:
            now[0] = step_ends[0]
            keeper.batch_ends()
            keeper.batch_begins()
            step_ends[0] += step
        now[0] = wakes

    with pytest.raises(_Finished):
        heartbeat_loop(keeper.sample, keeper.sample_stacks, sleep=sleep, draw=draw)
    return written


def _watched(workers: list[list[Ledger]]) -> list[Diagnosis]:
    """What the straggler watch says as the launcher reads the workers' ledgers, each as it is written."""
    watch, latest, found = StragglerWatch(), {}, []
    writes = sorted(((ledger.time, index, ledger) for index, ledgers in enumerate(workers) for ledger in ledgers),
                    key=lambda write: write[:2])
    for _, index, ledger in writes:
        latest[index] = ledger
        found += watch.update(dict(latest))
    return found


@pytest.mark.parametrize(("step", "in_function", "peer_phase"), [
    pytest.param(0.125, 0.1, 0.0625, id="half-a-heartbeat"), pytest.param(0.25, 0.1, 0.125, id="one-heartbeat"),
    pytest.param(0.3, 0.1, 0.15, id="slower"), pytest.param(0.1, 0.075, 0.03, id="twice-the-mean-pause")])
def test_workers_running_one_py_function_alike_are_sampled_alike_whatever_their_steps_period(step, in_function,
                                                                                           peer_phase):
    """CI, stop 53: the planted slow step's steps lasted 0.125 s, each sleeping 0.1 s in a ``numpy_function``; a
    heartbeat every 0.25 s sampled the same moment of every step, saw the function in every sample of one worker's
    window and in none of its peer's, and the watch named the worker for a function both ran alike (8.2x). The
    stacks are now sampled 5 times a heartbeat, each pause drawn: each worker's measure is the function's true
    seconds on average, and nobody is named in two minutes of readings, whatever the step's period against the
    samples' (fixed pauses of 0.05 s still alias with a step of two of them: ``twice-the-mean-pause``)."""
    draw = random.Random(53).random
    workers = [_heartbeat_ledgers(draw, step=step, in_function=in_function, phase=phase) for phase in (0.0, peer_phase)]
    assert _watched(workers) == []
    for ledgers in workers:
        measured = [ledger.py_function_seconds for ledger in ledgers if ledger.py_function_seconds is not None]
        assert statistics.mean(measured) == pytest.approx(in_function, rel=0.15)


def test_a_worker_whose_py_function_is_slower_is_still_named_from_drawn_samples():
    draw = random.Random(38).random
    workers = [_heartbeat_ledgers(draw, step=0.3, in_function=seconds, phase=0.0) for seconds in (0.05, 0.05, 0.2)]
    found = _watched(workers)
    assert [d.index for d in found] == [2]
    assert found[0].headline.startswith("worker 2 is a straggler: it spends 0.")


def test_a_healthy_job_with_jitter_has_no_straggler():
    rng = random.Random(7)

    def make(index, written):
        return _steady(index, written, input_seconds=0.002 * rng.uniform(0.2, 3.0), cpu=0.1 * rng.uniform(0.8, 1.25))

    assert _watch(500, make) == []


def test_an_unchanged_ledger_is_not_a_new_reading():
    watch = StragglerWatch()
    ledgers = {0: _steady(0, 1.0, input_seconds=0.1, cpu=0.1), 1: _steady(1, 1.0, input_seconds=0.001, cpu=0.1)}
    assert all(watch.update(ledgers) == [] for _ in range(30))


def test_uneven_shards_come_before_the_retrace_a_shorter_batch_may_cause():
    retraced = FunctionTrace(kind="train", fingerprint="c0ffee", step=7, summary="Sequential: 2 variables")
    short = _ledger(epoch=0, batches=8, steps=7, end_of_data=((0, 8),), functions=(TRAIN, retraced))
    other = FunctionTrace(kind="train", fingerprint="d00d00", step=7, summary="Sequential: 2 variables")
    waiting = _ledger(epoch=0, batches=8, steps=7, functions=(TRAIN, other))
    found = diagnose([_running(0, waiting, steps=7), _running(1, short, in_step=False)])
    assert found is not None and found.cause == "uneven-shards"


def test_a_worker_whose_own_steps_are_slower_is_a_straggler_when_input_and_cpu_do_not_tell():
    def make(index, written):
        return Ledger(steps=int(written), step_seconds=0.32 if index == 1 else 0.2, time=written)

    found = _watch(10, make)
    assert [d.headline for d in found] == ["worker 1 is a straggler: its steps take 1.6x its peers' time (0.32 s "
                                           "against 0.20 s)"]


def _built(*weights: tuple[str, str], count: int | None = None) -> Ledger:
    """A worker still building its model: its last weights (ordinals from 1), no function traced."""
    last = [[ordinal, name, shape] for ordinal, (name, shape) in enumerate(weights, start=1)]
    return Ledger(frame="train.py:12 in build", extra={"weights": {"count": count or len(weights), "last": last}})


def test_workers_that_build_different_models_are_named_with_the_first_weight_that_differs():
    same = ("dense/kernel", "(4, 8)"), ("dense/bias", "(8,)")
    zero = WorkerView(index=0, ledger=_built(*same, ("dense_1/kernel", "(8, 1)")), joined=True)
    one = WorkerView(index=1, ledger=_built(*same, ("dense_1/kernel", "(16, 1)")), joined=True)
    found = diagnose([zero, one])
    assert found is not None and found.cause == "different-models" and found.index is None
    assert found.headline == ("workers 0 and 1 built different models: weight 3 is dense_1/kernel (8, 1) on worker 0 "
                              "and dense_1/kernel (16, 1) on worker 1")
    assert found.evidence[1] == "worker 1: 1: dense/kernel (4, 8), 2: dense/bias (8,), 3: dense_1/kernel (16, 1)"
    # the same weights, one worker further along: no diagnosis (it waits in the next weight's broadcast)
    ahead = WorkerView(index=1, ledger=_built(*same, ("dense_1/kernel", "(8, 1)"), ("dense_1/bias", "(1,)")))
    assert diagnose([zero, ahead]) is None
