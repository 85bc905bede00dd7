"""The launcher's policy with fake workers and a fake clock: no process starts, every test is instant.

Each scenario drives :class:`~tfstrategy.launch.supervisor.Launcher` itself (the real monitor
loop, coordinator and stop sequence) through ``spawn=`` fakes whose observations change with
the fake clock; it checks the exit status, the reason, the headline, and what every worker got.
"""

from __future__ import annotations

import io
import signal
import sys

import pytest
from fakes import Clock, FakeWorker, Fleet

from tfstrategy.launch.coordinator import Event, LocalCoordinator
from tfstrategy.launch.reports import ErrorRecord
from tfstrategy.launch.states import EndReason, Failure, RunResult
from tfstrategy.launch.supervisor import Launcher, LaunchOptions

COMMAND = (sys.executable, "train.py")


def _run(scenario, *, workers: int = 2, coordinator=None, **options) -> tuple[RunResult, str, Fleet, Clock]:
    """Run the launcher over fakes; ``scenario(fleet, now)`` is called at every tick of the fake clock."""
    clock = Clock()
    fleet = Fleet(clock)
    err = io.StringIO()
    launcher = Launcher(LaunchOptions(command=COMMAND, num_workers=workers, **options), env={}, out=io.StringIO(),
                        err=err, spawn=fleet.spawn, coordinator=coordinator, clock=clock, wall=clock.wall,
                        sleep=clock.sleep)

    def tick(now: float) -> None:
        if now > 3600:
            raise AssertionError("the scenario never ended")
        scenario(fleet, now, launcher)

    clock.hooks.append(tick)
    result = launcher.run()
    return result, err.getvalue(), fleet, clock


def _headline(err: str) -> str:
    return next(line for line in err.splitlines() if line.startswith("tfstrategy launch: worker")
                or line.startswith("tfstrategy launch: node"))


def _record(kind: str, message: str, when: float, frame: str = "train.py:12 in main") -> ErrorRecord:
    return ErrorRecord(type=kind, message=message, frame=frame, time=when)


def _joined_and_training(fleet: Fleet, attempt: int = 0, steps: int = 3, in_step: bool = True) -> None:
    for worker in fleet.attempts[attempt]:
        if worker.returncode is None:
            worker.join()
            worker.train(steps=steps, in_step=in_step)


def test_every_worker_exits_0_the_job_succeeds():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 2:
            for worker in fleet.attempts[0]:
                worker.exit(0)

    result, err, fleet, _ = _run(scenario)
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED)
    assert all(not worker.signals or worker.signals == [signal.SIGKILL] for worker in fleet.attempts[0])


def test_first_failure_stops_the_group_at_once_and_names_the_worker():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 2:
            fleet.at(0, 1).exit(3, lines=("Traceback (most recent call last):", "ValueError: bad batch"))

    result, err, fleet, clock = _run(scenario)
    assert (result.returncode, result.reason) == (1, EndReason.FAILED)
    assert _headline(err) == "tfstrategy launch: worker 1 exited with status 3: ValueError: bad batch"
    assert result.failures[0].status == 3
    assert fleet.at(0, 0).returncode == -signal.SIGKILL  # no grace: it is stuck with a dead peer
    assert clock.now < 2.5


TRACEBACK = ("Traceback (most recent call last):", '  File "train.py", line 12, in main', "KeyError: 'accuracy'")


@pytest.mark.parametrize(("options", "repeated"), [
    pytest.param({}, False, id="shown-live-not-repeated"),
    pytest.param({"log_dir": "logs", "tee": True}, False, id="tee-not-repeated"),
    pytest.param({"log_dir": "logs"}, True, id="log-dir-only-shown-in-the-report"),
    pytest.param({"console_workers": frozenset({0})}, True, id="worker-off-the-console-shown-in-the-report"),
])
def test_a_failed_workers_last_lines_are_in_the_report_only_when_the_console_did_not_show_them(
        options, repeated, tmp_path):
    """Issue 45 point 4: a traceback shown live is not repeated under 'last N line(s)'."""
    if "log_dir" in options:
        options = {**options, "log_dir": tmp_path / options["log_dir"]}

    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 2:
            fleet.at(0, 1).exit(1, lines=TRACEBACK)

    result, err, _, _ = _run(scenario, **options)
    assert _headline(err) == "tfstrategy launch: worker 1 exited with status 1: KeyError: 'accuracy'"
    assert ("last 3 line(s) of worker 1:\n  | Traceback (most recent call last):" in err) is repeated, err
    # (the fakes keep no log files, so the report points at the console's lines)
    assert ("the output of worker 1 is above (its [worker 1] lines)" in err) is (not repeated), err
    if "log_dir" in options:  # the record keeps the lines either way
        assert "  | KeyError: 'accuracy'" in next(tmp_path.glob("logs/**/failure.txt")).read_text()


def test_a_second_run_with_the_same_log_dir_writes_a_run_folder_of_its_own(tmp_path):
    """Issue 45 point 10: D/<run-id>/attempt-N, never the first run's D/attempt-0 again."""
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 2:
            fleet.at(0, 1).exit(1, lines=TRACEBACK)

    errs = [_run(scenario, log_dir=tmp_path)[1] for _ in range(2)]
    runs = sorted(tmp_path.iterdir())
    assert len(runs) == 2 and all((run / "attempt-0" / "failure.txt").is_file() for run in runs), runs
    for run in runs:
        said = [line for err in errs for line in err.splitlines() if f"/{run.name}/" in line]
        assert said == [f"tfstrategy launch: run {run.name}: each worker's output goes to {run}/attempt-0/worker-<i>/"
                        "stdout.log and stderr.log"], errs


def test_root_cause_is_the_earliest_real_error_and_peers_echoes_are_consequences():
    """Worker 0's UnavailableError is seen first; worker 1's earlier ValueError is the root cause."""
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 2:
            fleet.at(0, 0).exit(1, _record("tensorflow.python.framework.errors_impl.UnavailableError",
                                           "Collective ops is aborted by: ... The error could be from a previous "
                                           "operation", 1002.0, frame=""))
        if now > 3:
            fleet.at(0, 1).exit(1, _record("ValueError", "shapes (32, 4) and (3, 1) not aligned", 1001.5))

    result, err, _, clock = _run(scenario)
    assert _headline(err) == ("tfstrategy launch: worker 1 exited with status 1: ValueError: shapes (32, 4) and "
                              "(3, 1) not aligned (at train.py:12 in main)")
    assert "  then, as a consequence: worker 0 exited with status 1: tensorflow.python.framework.errors_impl." \
           "UnavailableError: Collective ops is aborted by" in err
    assert clock.now < 2 + 3 + 0.5  # within the settle window after the first (consequential) failure


def test_every_worker_raising_the_same_error_on_its_own_is_no_consequence():
    """Issue 45 point 5: worker 1's own KeyError after worker 0's is "also", not "as a consequence"."""
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 2:
            fleet.at(0, 0).exit(1, _record("KeyError", "'accuracy'", 1002.0))
            fleet.at(0, 1).exit(1, _record("KeyError", "'accuracy'", 1002.05))

    result, err, _, _ = _run(scenario)
    assert _headline(err) == "tfstrategy launch: worker 0 exited with status 1: KeyError: 'accuracy' (at train.py:12 in main)"
    assert "  also: worker 1 exited with status 1: KeyError: 'accuracy'" in err
    assert "consequence" not in err


def test_a_sigkill_nobody_sent_suggests_the_oom_killer():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 1:
            fleet.at(0, 1).exit(-signal.SIGKILL)

    result, err, _, _ = _run(scenario)
    assert _headline(err).startswith("tfstrategy launch: worker 1 was killed by SIGKILL; tfstrategy did not send it: "
                                     "the kernel's OOM killer")
    assert result.failures[0].status == 137 and result.returncode == 1


def test_a_joined_job_training_past_the_join_timeout_is_never_stopped():
    """--timeout bounds the join only: a job whose training runs long past it ends as its workers do."""
    def scenario(fleet, now, launcher):
        if now > 5:
            _joined_and_training(fleet, steps=int(now))
        if now > 100:
            for worker in fleet.attempts[0]:
                worker.exit(0)

    result, err, fleet, clock = _run(scenario, join_timeout=30)
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED), err
    assert all(not worker.signals or worker.signals == [signal.SIGKILL] for worker in fleet.attempts[0])
    assert clock.now > 100 and "did not join" not in err


def test_join_timeout_names_the_worker_that_never_started_joining():
    def scenario(fleet, now, launcher):
        fleet.at(0, 0).starting = True

    result, err, _, clock = _run(scenario, join_timeout=30)
    assert (result.returncode, result.reason) == (124, EndReason.JOIN_TIMEOUT)
    assert _headline(err).startswith("tfstrategy launch: worker 1 did not join within --timeout 30 s: it never started "
                                     "creating its strategy")
    assert "worker 0 is creating its strategy" in err
    assert 30 < clock.now < 30.5


def test_exit_0_before_joining_while_a_peer_waits_fails_at_once_not_at_the_timeout():
    def scenario(fleet, now, launcher):
        fleet.at(0, 0).starting = True
        if now > 1:
            fleet.at(0, 1).exit(0)

    result, err, _, clock = _run(scenario, join_timeout=300)
    assert result.returncode == 1
    assert _headline(err) == "tfstrategy launch: worker 1 exited 0 before joining: the job cannot form"
    assert "  worker 0 is creating its strategy and waits for it" in err
    assert "  what the launcher saw: worker 1 exited with status 0 before joining, while worker(s) 0 wait for it" in err
    assert clock.now < 1.5


@pytest.mark.parametrize("code", [pytest.param(0, id="exit-0"), pytest.param(1, id="exit-1")])
def test_exit_before_joining_while_a_peer_joined_and_waits_ends_the_job_at_once(code):
    """Issue 38: worker 0 joined (its strategy exists) and waits; worker 1 ends before ever joining."""
    def scenario(fleet, now, launcher):
        fleet.at(0, 0).join()
        fleet.at(0, 0).train(steps=0, in_step=True)
        if now > 1:
            fleet.at(0, 1).exit(code)

    result, err, fleet, clock = _run(scenario, join_timeout=20, stall_report=5, stall_timeout=None)
    assert (result.returncode, result.reason) == (1, EndReason.FAILED), err
    assert _headline(err) == f"tfstrategy launch: worker 1 exited {code} before joining: the job cannot form"
    assert "  worker 0 joined and waits for it" in err
    assert f"  what the launcher saw: worker 1 exited with status {code} before joining" in err
    assert fleet.at(0, 0).returncode == -signal.SIGKILL
    assert clock.now < 1.5  # the tick after the exit: neither --timeout nor a stall decided it


def test_exit_0_before_joining_while_a_peer_is_still_starting_fails_once_the_peer_joins():
    def scenario(fleet, now, launcher):
        if now > 1:
            fleet.at(0, 1).exit(0)
        if now > 4:  # worker 0 was slow to import; it now creates its strategy and waits for worker 1
            fleet.at(0, 0).starting = True

    result, err, _, clock = _run(scenario, join_timeout=300)
    assert _headline(err) == "tfstrategy launch: worker 1 exited 0 before joining: the job cannot form"
    assert "what the launcher saw: worker 1 exited with status 0 before joining, while worker(s) 0 " in err
    assert 4 < clock.now < 4.5


def test_exit_before_joining_restarts_the_group_within_max_restarts():
    def scenario(fleet, now, launcher):
        attempt = len(fleet.attempts) - 1
        fleet.at(attempt, 0).join()
        if attempt == 0 and now > 1:
            fleet.at(0, 1).exit(0)
        if attempt == 1:
            _joined_and_training(fleet, 1)
            if now > 4:
                for worker in fleet.attempts[1]:
                    worker.exit(0)

    result, err, fleet, _ = _run(scenario, max_restarts=1)
    assert (result.returncode, result.restarts, len(fleet.attempts)) == (0, 1, 2), err
    assert "worker 1 exited with status 0 before joining" in err


def test_every_worker_exiting_0_without_ever_joining_is_a_success():
    """A script that creates no strategy at all (a data-prep step) ends the job normally."""
    def scenario(fleet, now, launcher):
        if now > 1:
            fleet.at(0, 1).exit(0)
        if now > 2:
            fleet.at(0, 0).exit(0)

    result, err, _, _ = _run(scenario)
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED), err


def test_exit_0_mid_training_while_a_peer_is_inside_a_step_fails_at_once():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet, steps=7)
        if now > 2:
            fleet.at(0, 1).exit(0)

    result, err, _, clock = _run(scenario)
    assert _headline(err) == ("tfstrategy launch: worker 1 exited with status 0 after 7 batch(es) while worker(s) 0 "
                              "still wait for it inside a step: it left the job early (every worker must run the same "
                              "number of steps)")
    assert clock.now < 2.5


def test_one_worker_finishing_while_its_peer_ends_that_same_last_step_is_no_failure():
    """Worker 1 ran its 8th and last batch; worker 0, inside its 8th, is not waiting for it: it finishes too."""
    def scenario(fleet, now, launcher):
        if now < 1:
            fleet.at(0, 0).join()
            fleet.at(0, 1).join()
            fleet.at(0, 0).train(steps=7, in_step=True)
            fleet.at(0, 1).train(steps=8, in_step=False)
        if now > 1:
            fleet.at(0, 1).exit(0)
        if now > 3:  # worker 0's last batch ends (the evaluate after fit, say) and the script exits
            fleet.at(0, 0).train(steps=8, in_step=False)
            fleet.at(0, 0).exit(0)

    result, err, _, _ = _run(scenario)
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED), err


def test_one_worker_finishing_first_while_its_peer_saves_is_no_failure():
    def scenario(fleet, now, launcher):
        if now < 1:
            _joined_and_training(fleet, steps=8, in_step=False)
        if now > 1:
            fleet.at(0, 1).exit(0)
        if now > 6:  # the chief writes its files for a while, outside any step
            fleet.at(0, 0).exit(0)

    result, _, _, _ = _run(scenario)
    assert (result.returncode, result.reason) == (0, EndReason.SUCCEEDED)


def test_restart_starts_a_new_group_with_the_next_restart_count_and_then_succeeds():
    def scenario(fleet, now, launcher):
        attempt = len(fleet.attempts) - 1
        _joined_and_training(fleet, attempt)
        if attempt == 0 and now > 1:
            fleet.at(0, 1).exit(-signal.SIGKILL)
        if attempt == 1 and now > 5:
            for worker in fleet.attempts[1]:
                worker.exit(0)

    result, err, fleet, _ = _run(scenario, max_restarts=2)
    assert (result.returncode, result.restarts, len(fleet.attempts)) == (0, 1, 2)
    assert [w.spec.env["TFSTRATEGY_RESTART"] for w in fleet.attempts[1]] == ["1", "1"]
    assert "(restart 1 of 2)" in err and len(result.rejoin_seconds) == 1


def test_restarts_exhausted_gives_up_with_the_last_root_cause():
    def scenario(fleet, now, launcher):
        attempt = len(fleet.attempts) - 1
        _joined_and_training(fleet, attempt)
        fleet.at(attempt, 0).exit(2)

    result, err, fleet, _ = _run(scenario, max_restarts=1)
    assert (result.returncode, result.restarts, len(result.failures)) == (1, 1, 2)
    assert "giving up after 1 restart(s)" in err


@pytest.mark.parametrize(("on_term", "expected"), [
    pytest.param(None, 143, id="workers-ignore-sigterm-and-are-sigkilled-after-grace-still-143"),
    pytest.param(75, 75, id="every-worker-preempted-exits-75"),
    pytest.param(-signal.SIGTERM, 143, id="workers-die-of-sigterm"),
])
def test_sigterm_to_the_launcher_is_passed_on_and_its_status_is_stated(on_term, expected):
    def scenario(fleet, now, launcher):
        for worker in fleet.attempts[0]:
            worker.on_term = on_term
        _joined_and_training(fleet)
        if now > 2 and launcher._signal is None and all(w.returncode is None for w in fleet.attempts[0]):
            launcher._signal = signal.SIGTERM

    result, err, fleet, clock = _run(scenario, grace=5)
    assert result.returncode == expected
    assert all(worker.signals[0] == signal.SIGTERM for worker in fleet.attempts[0])
    if on_term is None:
        assert 2 + 5 <= clock.now < 2 + 5.5 and fleet.at(0, 0).returncode == -signal.SIGKILL


def test_a_frozen_workers_stacks_are_asked_of_faulthandler_and_its_peers_of_the_hooks_thread():
    """A frozen worker cannot run the thread that answers the usual request: it gets the frozen one."""
    def scenario(fleet, now, launcher):
        if now < 3:
            _joined_and_training(fleet, steps=int(now * 10))
        else:
            fleet.at(0, 1).beating = False  # its heartbeat stops: a thread holds Python's lock

    result, err, fleet, _ = _run(scenario, stall_report=5, stall_timeout=40)
    assert "worker 1 has not beaten its heartbeat" in err and "frozen" in err, err
    assert [(w.stacks_dumped, w.frozen_stacks_dumped) for w in fleet.attempts[0]] == [(1, 0), (1, 1)], err
    assert _headline(err).startswith("tfstrategy launch: worker 1 "), err


def test_a_stopped_worker_is_named_its_peers_stacks_requested_then_the_group_fails_past_the_stall_timeout():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet, steps=5)
        if now > 3:
            fleet.at(0, 1).stopped = True

    result, err, fleet, clock = _run(scenario, stall_report=5, stall_timeout=20)
    assert (result.returncode, result.reason) == (125, EndReason.STALLED)
    assert ("stall: worker 1 is stopped (SIGSTOP or a debugger) after step 5; its peers wait for it\n"
            "  worker 0 is inside step 6\n") in err
    assert "  what the launcher saw: worker 1 is stopped (state T: SIGSTOP" in err
    assert all(worker.stacks_dumped == 1 for worker in fleet.attempts[0])
    assert _headline(err) == "tfstrategy launch: worker 1 is stopped (SIGSTOP or a debugger) after step 5; its peers wait for it"
    assert "  what the launcher saw: worker 1 stalled: it is stopped" in err
    assert result.stall_seconds and result.stall_seconds[0] < 2.5


def test_a_worker_outside_its_step_while_peers_wait_is_stalled_after_a_threshold_that_scales_with_step_time():
    state = {"steps": 0}

    def scenario(fleet, now, launcher):
        for worker in fleet.attempts[0]:
            worker.join()
        if now < 10:  # one batch a second, in lockstep
            state["steps"] = int(now)
            for worker in fleet.attempts[0]:
                worker.train(steps=state["steps"], in_step=True)
        else:  # worker 1 busy in a callback after its batch; worker 0 waits inside the next step
            fleet.at(0, 0).train(steps=state["steps"], in_step=True)
            fleet.at(0, 1).train(steps=state["steps"], in_step=False)

    result, err, _, clock = _run(scenario, stall_report=5, stall_timeout=60)
    assert "stall: worker 1 has been outside its step for" in err and "while worker(s) 0 wait" in err
    detected = result.stall_seconds[0]
    assert 20 <= detected < 21  # 20 x the 1 s step time, above the 5 s floor
    assert result.returncode == 125 and 60 <= clock.now - 9 < 61.5


def test_a_stall_that_resumes_is_reported_and_forgotten():
    def scenario(fleet, now, launcher):
        for worker in fleet.attempts[0]:
            worker.join()
            worker.train(steps=1 if now < 20 else 2 + int(now), in_step=worker.index == 0 or now >= 20)
        if now > 30:
            for worker in fleet.attempts[0]:
                worker.exit(0)

    result, err, _, _ = _run(scenario, stall_report=5, stall_timeout=60)
    assert result.returncode == 0
    assert "stall: worker 1 has been outside its step" in err and "worker 1 advances again" in err


def test_every_worker_long_inside_its_first_batch_is_said_once_with_stacks_and_never_fails_the_job():
    def scenario(fleet, now, launcher):
        for worker in fleet.attempts[0]:
            worker.join()
            worker.train(steps=0 if now < 40 else 3, in_step=now < 40)
            if now > 45:
                worker.exit(0)

    result, err, fleet, _ = _run(scenario, stall_report=5, stall_timeout=20)
    assert result.returncode == 0  # past --stall-timeout, still nobody stopped: the first batch traces
    said = [line for line in err.splitlines() if "inside its first batch" in line]
    assert len(said) == 1 and said[0].startswith("tfstrategy launch: every worker has been inside its first batch for 1")
    assert all(worker.stacks_dumped == 1 for worker in fleet.attempts[0])


def test_a_worker_slower_to_begin_its_first_batch_is_no_stall_and_said_once_if_long():
    """Worker 1 still builds its model while worker 0 waits inside the first batch (a loaded machine)."""
    def scenario(fleet, now, launcher):
        worker0, worker1 = fleet.attempts[0]
        worker0.join()
        worker1.join()
        worker0.train(steps=0 if now < 30 else 3, in_step=now < 30)
        worker1.train(steps=0 if now < 30 else 3, in_step=25 <= now < 30)  # begins its first batch at 25 s
        if now > 35:
            worker0.exit(0)
            worker1.exit(0)

    result, err, fleet, _ = _run(scenario, stall_report=5, stall_timeout=12)
    assert result.returncode == 0, err  # past --stall-timeout before its first batch: nobody stopped
    assert "stall:" not in err
    said = [line for line in err.splitlines() if "first batch" in line]
    assert len(said) == 1 and said[0].startswith("tfstrategy launch: worker(s) 1 have not begun their first batch 1"), said
    assert all(worker.stacks_dumped == 1 for worker in fleet.attempts[0])


class NodeLost(LocalCoordinator):
    """Another node's launcher disconnects mid-job: node 0 relays it as the round's failure."""

    rank = 0  # type: ignore[assignment]  (node 0 of a job)

    def __init__(self, clock: Clock) -> None:
        super().__init__(max_restarts=0)
        self.clock, self.stops = clock, []

    def poll(self) -> Event | None:
        if self.clock.now > 4:
            failure = Failure(index=None, node=1, reason="disconnected (it was stopped, or its machine is unreachable)",
                              status=1, time=1004.0)
            return Event.failed(failure, restart=False)
        return None


def test_a_lost_node_stops_this_nodes_workers_and_is_the_headline():
    clock_box = {}

    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)

    clock = Clock()
    clock_box["clock"] = clock
    fleet = Fleet(clock)
    err = io.StringIO()
    launcher = Launcher(LaunchOptions(command=COMMAND, num_workers=2), env={}, out=io.StringIO(), err=err,
                        spawn=fleet.spawn, coordinator=NodeLost(clock), clock=clock, wall=clock.wall,
                        sleep=clock.sleep)
    clock.hooks.append(lambda now: scenario(fleet, now, launcher))
    result = launcher.run()
    assert result.returncode == 1
    assert "node 1's launcher disconnected" in err.getvalue()
    assert all(worker.returncode == -signal.SIGKILL for worker in fleet.attempts[0])


def test_fake_worker_refuses_a_wait_while_alive():
    """The fakes themselves: waiting on a live worker would hang a real launcher, so it must never happen."""
    from tfstrategy.launch.processes import WorkerSpec

    worker = FakeWorker(WorkerSpec(index=0, command=COMMAND, env={}, port=1, join_file=None, error_file=None,
                                   progress_file=None), Clock())
    with pytest.raises(AssertionError):
        worker.wait()


def test_a_program_without_the_hook_joins_when_every_port_accepts_connections():
    from dataclasses import replace

    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy

    monitor = GroupMonitor([0, 1], Policy(join_timeout=30), started=0.0)
    assert not monitor.update(1.0, 1.0, {0: Observation(listening=True), 1: Observation()}).all_joined
    decision = monitor.update(2.0, 2.0, {0: Observation(listening=True), 1: replace(Observation(), listening=True)})
    assert decision.all_joined and monitor.update(400.0, 400.0, {0: Observation(), 1: Observation()}).outcome is None


def test_a_still_heartbeat_while_creating_the_strategy_is_no_stall_the_join_timeout_names_it():
    """Under --nnodes a worker waits inside strategy creation for a peer on another node, its server
    listening and its heartbeat still (TensorFlow holds Python's lock): not frozen; the join timeout ends it."""
    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
    from tfstrategy.launch.reports import Progress
    from tfstrategy.launch.states import Outcome

    monitor = GroupMonitor([0], Policy(join_timeout=60, heartbeat_timeout=10, stall_report=5), started=0.0)
    waiting = Observation(starting=True, listening=True, progress=Progress(1, -1, False))
    decision = monitor.update(1.0, 1.0, {0: waiting})
    assert not decision.all_joined
    for now in (20.0, 40.0, 59.0):
        decision = monitor.update(now, now, {0: waiting})
        assert decision.outcome is None and not decision.notes and not decision.dump_stacks
    decision = monitor.update(61.0, 61.0, {0: waiting})
    assert decision.outcome is Outcome.JOIN_TIMEOUT and decision.failure is not None
    assert "did not join within --timeout 60 s: it is creating its strategy" in decision.failure.reason
    assert "frozen" not in decision.failure.reason and not decision.failure.consequential
    # Under --nnodes the worker it waits for is elsewhere: this timeout echoes that node's report.
    nodes = GroupMonitor([0], Policy(join_timeout=60, heartbeat_timeout=10), started=0.0, peers_elsewhere=True)
    nodes.update(1.0, 1.0, {0: waiting})
    echo = nodes.update(61.0, 61.0, {0: waiting}).failure
    assert echo is not None and echo.consequential and echo.reason.endswith(
        "; the worker it waits for is on another node (see that node's report)")


def test_a_joined_worker_whose_heartbeat_stops_is_still_frozen():
    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
    from tfstrategy.launch.reports import Progress

    monitor = GroupMonitor([0], Policy(join_timeout=60, heartbeat_timeout=10, stall_report=5), started=0.0)
    monitor.update(1.0, 1.0, {0: Observation(starting=True, progress=Progress(1, -1, False))})
    assert monitor.update(2.0, 2.0, {0: Observation(joined=True, progress=Progress(2, 0, True))}).all_joined
    decision = monitor.update(13.0, 13.0, {0: Observation(joined=True, progress=Progress(2, 0, True))})
    assert any("has not beaten its heartbeat for 11 s: frozen" in note for note in decision.notes)
    assert decision.dump_stacks and decision.frozen == {0}  # asked through faulthandler's handler


def test_a_still_heartbeat_after_the_script_ended_is_the_teardown_not_a_freeze():
    """A worker that trained and ended its script tears TensorFlow down with its heartbeat still (slow on a
    loaded machine): no "frozen" stall and no stacks; past ``teardown_timeout`` it is stuck in the teardown."""
    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
    from tfstrategy.launch.reports import Progress
    from tfstrategy.launch.states import Outcome

    policy = Policy(join_timeout=60, heartbeat_timeout=10, stall_report=5, stall_timeout=120, teardown_timeout=60)
    monitor = GroupMonitor([0, 1], policy, started=0.0)
    joined = Observation(joined=True, progress=Progress(1, 3, False))
    assert monitor.update(1.0, 1.0, {0: joined, 1: joined}).all_joined
    finishing = Observation(joined=True, progress=Progress(2, 3, False, finishing=True))
    monitor.update(2.0, 2.0, {0: finishing, 1: Observation(returncode=0)})
    for now in (15.0, 40.0, 61.0):  # the heartbeat has been still since 2 s
        decision = monitor.update(now, now, {0: finishing})
        assert decision.outcome is None and not decision.notes and not decision.dump_stacks
    decision = monitor.update(63.0, 63.0, {0: finishing})
    assert decision.dump_stacks and decision.outcome is None
    assert decision.notes == ["stall: worker 0 finished its script 61 s ago but has not exited: stuck in "
                              "TensorFlow's teardown (its training is over) (found 61.0 s after its last progress); "
                              "every worker's Python stack follows in its output; the job fails if it does not "
                              "advance within 59 s"]
    assert monitor.update(90.0, 90.0, {0: Observation(returncode=0)}).outcome is Outcome.SUCCEEDED


@pytest.mark.parametrize("code", [0, 1])
def test_a_worker_ending_before_joining_ends_a_multi_node_job_though_no_worker_here_waits(code):
    """Under --nnodes the peers that wait are on other nodes: this node reports the early exit, diagnosed."""
    from tfstrategy.launch.ledger import Ledger
    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
    from tfstrategy.launch.reports import Progress
    from tfstrategy.launch.states import Outcome

    def run(peers_elsewhere: bool, keeps_ledger: bool = True):
        monitor = GroupMonitor([1], Policy(join_timeout=60), started=0.0, peers_elsewhere=peers_elsewhere)
        ledger = Ledger() if keeps_ledger else None
        monitor.update(1.0, 1.0, {1: Observation(progress=Progress(1, -1, False), ledger=ledger)})
        return monitor.update(2.0, 2.0, {1: Observation(returncode=code)})

    decision = run(peers_elsewhere=True)
    assert decision.outcome is Outcome.FAILED and decision.failure is not None
    assert decision.failure.index == 1 and decision.failure.diagnosis[0] == (
        f"worker 1 exited {code} before joining: the job cannot form")
    assert "the workers on the other nodes wait for it to create its strategy (--nnodes)" in decision.failure.diagnosis
    alone = run(peers_elsewhere=False)  # the only worker of the job: nobody waits for it
    assert alone.outcome is (Outcome.SUCCEEDED if code == 0 else Outcome.FAILED)
    assert alone.failure is None or not alone.failure.diagnosis
    if code == 0:  # no ledger: it never imported TensorFlow (`python -c "print(...)"` on every node): no failure
        assert run(peers_elsewhere=True, keeps_ledger=False).outcome is Outcome.SUCCEEDED


def test_a_stall_past_the_stall_timeout_restarts_the_group_with_max_restarts():
    def scenario(fleet, now, launcher):
        attempt = len(fleet.attempts) - 1
        _joined_and_training(fleet, attempt, steps=2)
        if attempt == 0 and now > 1:
            fleet.at(0, 0).stopped = True
        if attempt == 1:
            for worker in fleet.attempts[1]:
                worker.exit(0)

    result, err, fleet, _ = _run(scenario, max_restarts=1, stall_report=5, stall_timeout=10)
    assert (result.returncode, result.restarts) == (0, 1)
    assert result.failures[0].exit_status == 125 and "worker 0 stalled: it is stopped" in err
    assert fleet.at(0, 0).returncode == -signal.SIGKILL  # a stopped process still dies of SIGKILL


def test_a_worker_that_raised_is_the_root_cause_before_its_process_has_exited():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet)
        if now > 2:  # its excepthook wrote the record; TensorFlow's teardown keeps the process alive
            fleet.at(0, 1).error = _record("ValueError", "bad batch", 1002.0)

    result, err, fleet, clock = _run(scenario)
    assert _headline(err) == ("tfstrategy launch: worker 1 raised ValueError: bad batch (at train.py:12 in main) "
                              "(its process is exiting)")
    assert clock.now < 2.5 and fleet.at(0, 1).returncode == -signal.SIGKILL


@pytest.mark.parametrize("catches_up", [True, False], ids=["its-next-write", "nothing-changed"])
def test_a_diagnosis_at_a_failure_quotes_a_live_peer_as_of_the_failure_not_its_write_of_a_second_before(catches_up):
    """CI, stop 52: worker 1 (7 batches planned) aborted after its 7th while worker 0 waited in its 8th; the
    evidence said "worker 0: epoch 1, 1 batch(es) begun, 0 done" from worker 0's write of a second before (a
    worker writes its ledger at most once a second, at a sample about four times a second). The report waits for
    the live worker's next write, due by ``shows_by``: one second after its last write, and a sample; one that
    changed nothing is not written again, and then the report follows that moment (and the read's allowance)."""
    from tfstrategy.contract.ledger import shows_by
    from tfstrategy.launch.ledger import Ledger
    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
    from tfstrategy.launch.reports import Progress

    def ledger(batches, steps, planned, written):
        return Ledger(epoch=0, batches=batches, steps=steps, total_steps=steps, extra={"epoch_steps": planned},
                      time=written)

    early, waiting = ledger(1, 0, 8, written=1.4), ledger(8, 7, 8, written=2.5)
    monitor = GroupMonitor([0, 1], Policy(ledger_read=0.2), started=0.0)
    joined = {0: Observation(joined=True, progress=Progress(1, 0, True), ledger=early),
              1: Observation(joined=True, progress=Progress(1, 0, True), ledger=ledger(1, 0, 7, written=1.4))}
    assert monitor.update(1.5, 1.5, joined).outcome is None
    aborted = Observation(returncode=1, ledger=ledger(7, 7, 7, written=1.9))
    assert monitor.update(2.0, 2.0, {0: Observation(joined=True, progress=Progress(2, 7, True)), 1: aborted}).outcome \
        is None  # worker 0's ledger is from before the failure: its next write is due by 2.775 (the longest pause)
    assert shows_by(1.4, 2.0) == pytest.approx(2.775)
    if catches_up:
        decision = monitor.update(2.6, 2.6, {0: Observation(joined=True, progress=Progress(3, 7, True), ledger=waiting)})
    else:
        assert monitor.update(2.8, 2.8, {0: Observation(joined=True, progress=Progress(3, 7, True))}).outcome is None
        decision = monitor.update(3.0, 3.0, {0: Observation(joined=True, progress=Progress(4, 7, True))})
    assert decision.failure is not None and decision.failure.index == 1
    assert decision.failure.diagnosis[0].startswith("worker 1 plans 7 batch(es) in epoch 1 while worker 0 plans 8")
    quoted = "worker 0: epoch 1, 8 batch(es) begun, 7 done, 8 planned" if catches_up else \
        "worker 0: epoch 1, 1 batch(es) begun, 0 done, 8 planned"
    assert quoted in decision.failure.diagnosis


def test_exit_0_is_the_root_cause_when_the_peer_already_failed_with_an_echo():
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet, steps=4, in_step=False)  # worker 0 between steps: nothing waits yet
        if now > 2:
            fleet.at(0, 1).exit(0)
        if now > 2.15:  # then its next step finds the peer gone
            fleet.at(0, 0).exit(1, _record("tensorflow.python.framework.errors_impl.UnavailableError",
                                           "Socket closed", 1002.1, frame=""))

    result, err, _, _ = _run(scenario)
    assert _headline(err).startswith("tfstrategy launch: worker 1 exited with status 0 after 4 batch(es)")
    assert "then, as a consequence: worker 0 exited with status 1: tensorflow" in err


@pytest.mark.parametrize(("outcome", "exit_status", "consequential"), [
    pytest.param("stalled", 125, False, id="stall"),
    pytest.param("join-timeout", 124, False, id="join"),
    pytest.param("failed", 1, True, id="echo"),
    pytest.param("failed", 1, False, id="plain"),
    pytest.param("stopped", 2, False, id="stopped"),
])
def test_a_relayed_failure_crosses_the_wire_whole(outcome, exit_status, consequential):
    """Node 1's failure as node 0 relays it: the fields it sent, none re-derived from its text."""
    from tfstrategy.launch.nodes import failure_from_event, failure_to_message
    from tfstrategy.launch.rendezvous import EventKind, JobEvent
    from tfstrategy.launch.rendezvous.wire import RoundFailed
    from tfstrategy.launch.states import Outcome

    sent = Failure(index=3, reason="exited with status 1: ValueError: x", status=1, time=1_700_000_123.25,
                   consequential=consequential, last_lines=("a", "b"), logs=("/logs/w3/stdout.log",),
                   outcome=Outcome(outcome), diagnosis=("worker 3 exited 1 before joining: the job cannot form",
                                                        "worker 0 joined and waits for it"))
    message = RoundFailed.of(1, failure_to_message(0, sent), restart=False)
    failure = failure_from_event(JobEvent(EventKind.FAILED, {}, message))
    assert failure == Failure(**{**sent.__dict__, "node": 1})
    assert (failure.exit_status, failure.consequential, failure.node) == (exit_status, consequential, 1)
    if outcome == "stopped":  # a worker's stop line is its own headline, on every node
        assert failure.headline() == "exited with status 1: ValueError: x"
    else:
        assert failure.headline() == "node 1: worker 3 exited 1 before joining: the job cannot form"


def test_a_peer_failing_while_a_worker_is_stalled_is_an_echo_of_the_stall():
    """TensorFlow's coordination service gives up on a stopped task before --stall-timeout does."""
    def scenario(fleet, now, launcher):
        _joined_and_training(fleet, steps=5)
        if now > 3:
            fleet.at(0, 1).stopped = True
        if now > 12:
            fleet.at(0, 0).exit(1, _record("tensorflow.python.framework.errors_impl.UnavailableError",
                                           "Collective ops is aborted by: ... unhealthy (stopped sending heartbeats)",
                                           1012.0, frame=""))

    result, err, _, clock = _run(scenario, stall_report=5, stall_timeout=60)
    assert (result.returncode, result.reason) == (125, EndReason.STALLED)
    assert _headline(err) == "tfstrategy launch: worker 1 is stopped (SIGSTOP or a debugger) after step 5; its peers wait for it"
    assert "  what the launcher saw: worker 1 stalled: it is stopped" in err
    assert "then, as a consequence: worker 0 exited with status 1: tensorflow" in err
    assert clock.now < 12 + 3.5


def test_every_worker_state_is_entered_and_every_outcome_has_its_exit_status():
    """One vocabulary: no state that is never entered, and the exit status follows from the outcome alone."""
    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
    from tfstrategy.launch.reports import Progress
    from tfstrategy.launch.states import Outcome, WorkerState

    monitor = GroupMonitor([0, 1], Policy(stall_report=5, stall_timeout=None, heartbeat_timeout=2), started=0.0)
    seen: set[WorkerState] = set()

    def tick(now: float, **workers: Observation) -> None:
        monitor.update(now, 1000 + now, {int(key[1:]): value for key, value in workers.items()})
        seen.update(worker.state for worker in monitor.workers.values())

    tick(0.0, w0=Observation(), w1=Observation())
    tick(1.0, w0=Observation(starting=True), w1=Observation(starting=True))
    tick(2.0, w0=Observation(joined=True, progress=Progress(1, 1, True)),
         w1=Observation(joined=True, progress=Progress(1, 1, True)))
    tick(3.0, w0=Observation(joined=True, progress=Progress(2, 1, True)),
         w1=Observation(joined=True, progress=Progress(1, 1, True), stopped=True))
    tick(5.0, w0=Observation(joined=True, progress=Progress(3, 1, True)),
         w1=Observation(joined=True, progress=Progress(1, 1, True), stopped=True))
    tick(6.0, w0=Observation(joined=True, progress=Progress(4, 2, False)),
         w1=Observation(joined=True, progress=Progress(2, 2, False)))
    tick(7.0, w0=Observation(returncode=0), w1=Observation(returncode=3))
    assert seen == set(WorkerState)
    assert {outcome: outcome.exit_status() for outcome in Outcome if outcome is not Outcome.INTERRUPTED} == {
        Outcome.SUCCEEDED: 0, Outcome.FAILED: 1, Outcome.JOIN_TIMEOUT: 124, Outcome.STALLED: 125,
        Outcome.PREEMPTED: 75, Outcome.LOST: 1, Outcome.STOPPED: 2}
    assert (Outcome.INTERRUPTED.exit_status(signal.SIGINT), Outcome.INTERRUPTED.exit_status(signal.SIGTERM)) == (130, 143)


REFUSED = ("tfstrategy refused OneDeviceStrategy under a multi-worker TF_CONFIG (2 workers, e.g. tfstrategy launch -n 2): "
           "it places everything on one device of this worker. Use tf.distribute.MirroredStrategy().")


def test_a_worker_the_hook_stopped_ends_the_job_with_its_one_line_exit_2_and_no_restart():
    """A refusal or a missing device repeats on every try: exit 2, the line once as the headline, never restarted."""
    def scenario(fleet, now, launcher):
        attempt = len(fleet.attempts) - 1
        if now > 1 + attempt * 10:
            fleet.at(attempt, 1).exit(2, lines=("2026-12-04 I tensorflow start-up", REFUSED))
        if now > 1.5 + attempt * 10:
            fleet.at(attempt, 0).exit(2, lines=(REFUSED,))

    result, err, fleet, _ = _run(scenario, max_restarts=3)
    assert (result.returncode, result.reason, result.restarts, len(fleet.attempts)) == (2, EndReason.STOPPED, 0, 1), err
    assert err.count(REFUSED) == 1, err
    assert f"tfstrategy launch: {REFUSED}" in err.splitlines()
    assert "as a consequence" not in err and "giving up" not in err and "last " not in err, err


def test_exit_2_without_a_stop_line_is_an_ordinary_failure_and_restarts():
    def scenario(fleet, now, launcher):
        attempt = len(fleet.attempts) - 1
        _joined_and_training(fleet, attempt)
        if attempt == 0 and now > 2:
            fleet.at(0, 1).exit(2, lines=("usage: train.py [-h]", "train.py: error: unrecognized arguments: --x"))
        if attempt == 1 and now > 4:
            for worker in fleet.attempts[1]:
                worker.exit(0)

    result, err, fleet, _ = _run(scenario, max_restarts=1)
    assert (result.returncode, result.restarts) == (0, 1), err
    assert "worker 1 exited with status 2" in err


def test_the_stop_line_is_recognised_only_with_exit_2_and_a_stop_prefix():
    from tfstrategy.worker_contract import stop_line

    assert stop_line(2, ("noise", REFUSED, "")) == REFUSED
    assert stop_line(2, ("tfstrategy stopped MirroredStrategy(devices=['/gpu:0']) at x.py:3: Received ...",)) \
        == "tfstrategy stopped MirroredStrategy(devices=['/gpu:0']) at x.py:3: Received ..."
    assert stop_line(1, (REFUSED,)) is None
    assert stop_line(2, ("tfstrategy: note ...", "ValueError: x")) is None
    # The scope audit's message is an exception the script sees, not a stop line.
    assert stop_line(2, ("tfstrategy stopped fit() before its first step (--audit stop):",)) is None


def test_a_stop_is_never_restarted_by_the_local_coordinator():
    from tfstrategy.launch.states import Outcome

    coordinator = LocalCoordinator(max_restarts=5)
    stopped = Failure(index=0, reason=REFUSED, status=2, outcome=Outcome.STOPPED)
    failed = Failure(index=0, reason="exited with status 1", status=1)
    assert (coordinator.decide(0, stopped).restart, coordinator.decide(0, failed).restart) == (False, True)
    assert stopped.headline() == REFUSED and stopped.report((failed,)) == REFUSED


def test_a_stop_first_seen_after_the_stall_threshold_is_named_as_a_stop_not_as_time_outside_the_step():
    """Found by the full suite on a loaded machine: the launcher first saw worker 1 stopped (SIGSTOP in a
    callback) 5 s after its last batch, when "outside its step for 5 s" already applied; it named that. The
    stop is confirmed a second later and named as what it is, and nothing is said in between."""
    from tfstrategy.launch.monitor import GroupMonitor, Observation, Policy
    from tfstrategy.launch.reports import Progress

    monitor = GroupMonitor([0, 1], Policy(join_timeout=60, heartbeat_timeout=10, stall_report=5), started=0.0)
    assert monitor.update(1.0, 1.0, {0: Observation(joined=True, progress=Progress(1, 8, True)),
                                     1: Observation(joined=True, progress=Progress(1, 8, False))}).all_joined
    waiting = Observation(joined=True, progress=Progress(2, 8, True))
    stopped = Observation(joined=True, progress=Progress(1, 8, False), stopped=True)
    first = monitor.update(6.5, 6.5, {0: waiting, 1: stopped})
    assert first.notes == [] and not first.dump_stacks
    then = monitor.update(7.6, 7.6, {0: waiting, 1: stopped})
    assert len(then.notes) == 1 and then.notes[0].startswith("stall: worker 1 is stopped"), then.notes
    assert "outside its step" not in then.notes[0] and then.dump_stacks
