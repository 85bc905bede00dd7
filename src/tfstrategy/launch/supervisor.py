"""Start and supervise a group of MultiWorkerMirroredStrategy workers: one monitor loop over named states.

``tfstrategy launch -n N -- python train.py`` (in the spirit of ``torchrun``): N processes of the
same command, each with a ``TF_CONFIG`` naming free ports and the ``TFSTRATEGY_*`` variables of
:mod:`tfstrategy.multiworker.worker_protocol`. TensorFlow alone handles failures badly: a peer
that never starts blocks the others in the strategy's constructor forever, a dead peer surfaces
seconds later as an ``UnavailableError`` on the survivors, a stopped one only when the collective
timeout fires. The :class:`Launcher` therefore runs one loop: each tick it observes every worker
(:class:`~tfstrategy.launch.processes.WorkerHandle`), lets the pure
:class:`~tfstrategy.launch.monitor.GroupMonitor` turn that into state transitions, and acts on its
:class:`~tfstrategy.launch.monitor.Decision`:

- on the attempt's root cause (the earliest real failure; peers' echoes of it are shown as
  consequences), stop the group at once and report it with its last lines and log files;
- on a join timeout, name the worker holding the job up; on a stall, name the stuck worker and
  ask every worker for its Python stack, then fail past ``--stall-timeout``;
- with ``max_restarts``, restart the whole group on fresh ports (every worker resumes from the newest committed backup step);
- on SIGINT/SIGTERM, pass the signal on, SIGKILL what is left after ``grace`` seconds, exit 128+N
  (75 when every worker saved and exited 75).

What lies beyond this machine is a :class:`~tfstrategy.launch.coordinator.Coordinator`: local,
or node 0's rendezvous (``--nnodes``). Nothing outlives the launcher: every worker holds its
lifeline and the reaper stops the job if the launcher dies (:mod:`tfstrategy.launch.processes`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from tfstrategy.contract.exits import EXIT_JOIN_TIMEOUT, EXIT_PREEMPTED
from tfstrategy.contract.files import worker_files
from tfstrategy.errors import LaunchError
from tfstrategy.launch.console import Console, starting_line, stopped_line
from tfstrategy.launch.coordinator import Coordinator, Event, LocalCoordinator, Reformation, Vacancy
from tfstrategy.launch.elastic import pipeline_line, planned_steps, reformation_line, reformation_record, steps_line
from tfstrategy.launch.monitor import Decision, GroupMonitor
from tfstrategy.launch.nodes import RendezvousCoordinator, secret_free_environment
from tfstrategy.launch.options import (
    LaunchOptions,
    cluster_tf_config,
    policy_of,
    validate_launch_options,
    worker_settings,
    worker_spec,
    worker_tf_config,
)
from tfstrategy.launch.processes import (
    Lifeline,
    LocalProcess,
    WorkerHandle,
    WorkerSpec,
    become_subreaper,
    stop_orphans,
    stop_workers,
)
from tfstrategy.launch.replacement import Replacements
from tfstrategy.launch.run_log import keep_failure, keep_reformation
from tfstrategy.launch.states import Failure, Outcome, RunResult
from tfstrategy.worker_contract import WorkerContract, WorkerSettings

__all__ = [
    "JOIN_TIMEOUT_STATUS", "LaunchOptions", "validate_launch_options", "LaunchResult", "RunResult", "Launcher",
    "worker_tf_config", "cluster_tf_config",
]

JOIN_TIMEOUT_STATUS = EXIT_JOIN_TIMEOUT
#: The name of :class:`RunResult` in tfstrategy 0.2.
LaunchResult = RunResult
_POLL_SECONDS = 0.1
#: How often a node of several sends node 0 its workers' views (when they changed).
_SHARE_SECONDS = 1.0

Spawn = Callable[[WorkerSpec], WorkerHandle]


class Launcher:
    """Runs one job: start the group, supervise it, restart it, stop it.

    Args:
        options: validated :class:`LaunchOptions`.
        env: base environment of the workers (``os.environ`` when omitted).
        out: where the workers' prefixed stdout lines go.
        err: where their prefixed stderr lines and the launcher's own messages go.
        spawn: starts one worker (default: a real process); tests pass fakes.
        coordinator: the job beyond this machine (default: local, or the rendezvous with ``--nnodes``).
        clock, wall, sleep: monotonic time, wall-clock time, and waiting (tests pass a fake clock).
    """

    def __init__(self, options: LaunchOptions, *, env: Mapping[str, str] | None = None,
                 out: TextIO | None = None, err: TextIO | None = None, spawn: Spawn | None = None,
                 coordinator: Coordinator | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.options = validate_launch_options(options)
        self.env = dict(os.environ if env is None else env)
        self.settings()  # a setting the environment contradicts fails here, before anything starts
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self._lock = threading.Lock()
        self._console = Console(self.out, self._lock, err=self.err, view=self.options.console_view)
        self._spawn, self._coordinator = spawn, coordinator
        self._clock, self._wall, self._sleep = clock, wall, sleep
        self._signal: int | None = None
        self._workers: list[WorkerHandle] = []
        #: This machine's workers in the current round (fewer after a worker lost under ``-n MIN:MAX``).
        self._count = self.options.num_workers
        self._said_output_lost = False
        self._subreaper = False
        self._lifeline: Lifeline | None = None
        self._started = False
        self._replacements = Replacements(spawn=self._spawn_replacement, say=self._say, clock=clock, sleep=sleep,
                                          join_timeout=self.options.join_timeout,
                                          max_restarts=self.options.max_restarts)
        #: The workers of the current group (every node's), and what the group before a re-formation planned (its
        #: workers, its steps an epoch), until the re-formed group's plan is compared with it.
        self._group = 0
        self._planned: tuple[int, int] | None = None
        self._said_pipeline = False
        self._run_dir, self._settings = Path(), WorkerSettings()
        self.tag = uuid.uuid4().hex

    def settings(self, backup_dir: Path | None = None) -> WorkerSettings:
        """What every worker is told besides its place (:func:`~tfstrategy.launch.options.worker_settings`)."""
        options = self.options if backup_dir is None else dataclasses.replace(self.options, backup_dir=backup_dir)
        return worker_settings(options, self.env)

    def _say(self, message: str) -> None:
        self._console.say(self.err, f"tfstrategy launch: {message}")  # below the live progress line, if any

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signal = signum

    def run(self) -> RunResult:
        """Run the job to its end; returns its exit status and why it ended."""
        run_dir = Path(tempfile.mkdtemp(prefix="tfstrategy-launch-"))
        backup_dir = self.options.backup_dir
        if backup_dir is None and self.options.max_restarts > 0:
            backup_dir = run_dir / "backup"
        installed = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                installed[signum] = signal.signal(signum, self._on_signal)
            if self._spawn is None:
                self._subreaper = become_subreaper()
        if self._spawn is None:
            self._lifeline = Lifeline(self.tag)
            lifeline = self._lifeline
            self._spawn = lambda spec: LocalProcess(spec, self._console, lifeline)
        coordinator = self._coordinator
        try:
            if coordinator is None:
                if self.options.nodes is None:
                    coordinator = LocalCoordinator(self.options.max_restarts, self.options.port_range,
                                                   workers=self._count, min_workers=self.options.min_workers)
                else:
                    coordinator = RendezvousCoordinator(self.options, say=self._say,
                                                        interrupted=lambda: self._signal is not None)
            self._coordinator = coordinator
            return self._supervise(coordinator, run_dir, self.settings(backup_dir))
        finally:
            self._release(coordinator)
            for signum, handler in installed.items():
                signal.signal(signum, handler)
            shutil.rmtree(run_dir, ignore_errors=True)

    def _release(self, coordinator: Coordinator | None) -> None:
        """Leave nothing behind, whatever fails on the way: workers, the coordinator, the reaper, orphans."""
        try:
            self._replacements.drop()
            self._stop(grace=0.0)
            self._console.settle()
        finally:
            try:
                if coordinator is not None:
                    coordinator.close(grace=self.options.grace)
            finally:
                if self._lifeline is not None:
                    self._lifeline.close()  # the reaper exits (or is killed) and is reaped here
                if self._subreaper and self._started:
                    stop_orphans(set())  # what the workers' children left after their groups were stopped

    # --- one attempt ------------------------------------------------------------------------------

    def _start(self, coordinator: Coordinator, run_dir: Path, settings: WorkerSettings,
               attempt: int, restarts: int) -> GroupMonitor | Event:
        """Start this machine's workers for ``attempt`` once the coordinator formed its cluster."""
        count = self._count
        formed = coordinator.form(attempt, coordinator.ports(count))
        if isinstance(formed, Event):
            return formed
        addresses, first = list(formed.addresses), formed.first
        self._group = len(addresses)
        ports = {first + local: int(address.rsplit(":", 1)[1])
                 for local, address in enumerate(addresses[first:first + count])}
        attempt_dir = run_dir / f"attempt-{attempt}"
        attempt_dir.mkdir(exist_ok=True)  # a replacement for this round may have made it
        self._say(starting_line(addresses, first, count, several_nodes=coordinator.rank is not None,
                                restart=(restarts, self.options.max_restarts)))
        log_dir = self.options.attempt_log_dir(attempt)
        if log_dir is not None:  # a run of its own (--run-id): a second run never overwrites the first's files
            self._say(f"run {self.options.run_id}: each worker's output goes to {log_dir}/worker-<i>/stdout.log and "
                      "stderr.log" + (" (and to the console)" if self.options.tee else ""))
        for index, port in ports.items():
            waiting = self._replacements.adopt(attempt, index)  # a replacement waits in this cluster already
            self._workers.append(waiting or self._spawn_worker(coordinator, attempt_dir, settings, attempt, index,
                                                               port, addresses))
        self._replacements.drop()  # one for another round: that cluster is gone
        handles = {worker.index: worker for worker in self._workers}
        return GroupMonitor(list(ports), policy_of(self.options), started=self._clock(),
                            lines=lambda index: handles[index].last_lines(), ports=ports,
                            peers_elsewhere=len(addresses) > count)

    def _spawn_worker(self, coordinator: Coordinator, attempt_dir: Path, settings: WorkerSettings, attempt: int,
                      index: int, port: int, addresses: Sequence[str]) -> WorkerHandle:
        """Start worker ``index`` of ``attempt``'s cluster ``addresses`` (its files in ``attempt_dir``)."""
        files = worker_files(attempt_dir, index)
        contract = WorkerContract(
            index=index, num_workers=len(addresses), restart=attempt, join_file=files.join_file,
            error_file=files.error_file, progress_file=files.progress_file, launcher_pid=os.getpid(),
            lifeline_fd=None if self._lifeline is None else self._lifeline.read_fd, job_tag=self.tag,
            node_rank=coordinator.rank, settings=settings)
        spec = worker_spec(self.options, contract, files, addresses, port, env=secret_free_environment(self.env))
        spawn = self._spawn
        if spawn is None:
            raise RuntimeError("Launcher._start() runs only inside run()")
        self._started = True
        try:
            return spawn(spec)
        except OSError as error:
            raise LaunchError(
                f"Received the command {self.options.command[0]!r}, which could not be started ({error.strerror}); "
                "expected a program this user can run."
            ) from None

    def _spawn_replacement(self, vacancy: Vacancy) -> WorkerHandle:
        """Start the replacement for ``vacancy``, with files of its own: should the group fail first, the round's
        number is a restart's, whose worker must not read this one's join file."""
        attempt_dir = self._run_dir / f"attempt-{vacancy.round}" / f"replacement-{vacancy.restart}"
        attempt_dir.mkdir(parents=True)
        address = vacancy.cluster.addresses[vacancy.index]
        coordinator = self._coordinator
        if coordinator is None:
            raise RuntimeError("Launcher._spawn_replacement() runs only inside run()")
        return self._spawn_worker(coordinator, attempt_dir, self._settings, vacancy.round, vacancy.index,
                                  int(address.rsplit(":", 1)[1]), vacancy.cluster.addresses)

    def _shown_live(self, failure: Failure, local: Sequence[int], rank: int | None) -> bool:
        """Whether ``failure``'s worker is one of this machine's whose lines reached the console."""
        here = failure.node is None or failure.node == rank
        return (here and failure.index is not None and failure.index in local and self.options.on_console(failure.index)
                and self._console.lost is None)

    def _watch(self, coordinator: Coordinator, attempt: int, monitor: GroupMonitor, failed_at: float | None,
               reformed_at: float | None, result: RunResult) -> Decision | Event | None:
        """The monitor loop: until the attempt ends here (a decision), elsewhere (an event), or a signal (``None``)."""
        shared: tuple[tuple[dict[str, Any], ...], float] = ((), -_SHARE_SECONDS)
        while True:
            if self._signal is not None:
                return None
            event = coordinator.poll()
            if event is not None:
                return event
            self._report_lost_output()
            seen = {worker.index: worker.observe() for worker in self._workers}
            now = self._clock()
            elsewhere = coordinator.remote_views(coordinator.round) if monitor.peers_elsewhere else ()
            decision = monitor.update(now, self._wall(), seen, elsewhere=elsewhere)
            if monitor.peers_elsewhere and now - shared[1] >= _SHARE_SECONDS:
                views = monitor.wire_views()
                if views != shared[0]:  # node 0 diagnoses across nodes with them, should another node fail
                    coordinator.share(coordinator.round, views)
                shared = (views, now)
            for note in decision.notes:
                self._say(note)
            if self._planned is not None and (steps := planned_steps(monitor.ledgers())) is not None:
                line, self._planned = steps_line(self._planned, self._group, steps), None
                if line is not None:
                    self._say(line)
            if decision.dump_stacks:
                for worker in self._workers:
                    worker.dump_stacks(frozen=worker.index in decision.frozen)
            if decision.all_joined and failed_at is not None:
                result.rejoin_seconds.append(now - failed_at)
                self._say(f"all workers joined again {now - failed_at:.1f} s after the failure")
            elif decision.all_joined and reformed_at is not None:
                result.reform_seconds.append(now - reformed_at)
                self._say(f"the re-formed group's workers all joined {now - reformed_at:.1f} s after the re-formation")
            if decision.outcome is not None:
                result.stall_seconds.extend(monitor.stall_seconds)
                return decision
            taken = self._replacements.tend(coordinator, attempt, result, take=monitor.training)
            if taken is not None:
                return taken
            self._sleep(_POLL_SECONDS)

    # --- the job ----------------------------------------------------------------------------------

    def _supervise(self, coordinator: Coordinator, run_dir: Path, settings: WorkerSettings) -> RunResult:
        result = RunResult()
        self._run_dir, self._settings = run_dir, settings
        ended = coordinator.connect()
        if ended is not None or self._signal is not None:
            return self._ended(ended, result)
        attempt, failed_at, reformed_at = coordinator.round, None, None
        restarts = 0  # the counted ones: a re-formation of an elastic job is not one
        while True:
            # A replacement of a lost worker (-n MIN:MAX) uses one of --max-restarts too: numbered with them.
            used = restarts + result.replacements if failed_at is not None else 0
            started = self._start(coordinator, run_dir, settings, attempt, used)
            if isinstance(started, Event) and started.reform is not None and self._signal is None:
                attempt, failed_at, reformed_at = self._reform(started.reform, result, None), None, self._clock()
                continue
            if isinstance(started, Event) or self._signal is not None:
                return self._ended(started if isinstance(started, Event) else None, result)
            result.workers = self._count
            if failed_at is not None:
                result.restart_seconds.append(self._clock() - failed_at)
            decision = self._watch(coordinator, attempt, started, failed_at, reformed_at, result)
            reformed_at = None
            if not (isinstance(decision, Event) and decision.reform is not None
                    and decision.reform.joined_worker is not None):
                self._replacements.drop()  # the round it waits for will not come
            if decision is None or self._signal is not None:
                return self._ended(None, result)
            failed_at = self._clock()
            consequences: tuple[Failure, ...] = ()
            if isinstance(decision, Event):
                event = decision
            elif decision.outcome is Outcome.SUCCEEDED:
                event = coordinator.finish(attempt)  # every node's workers (at once on one machine)
                if event.outcome is Outcome.SUCCEEDED:
                    return result.end(Outcome.SUCCEEDED)
            else:
                if decision.failure is None:  # every outcome but SUCCEEDED carries one
                    raise RuntimeError(f"the monitor ended an attempt ({decision.outcome}) without a failure")
                local = dataclasses.replace(self._with_output(decision.failure), views=started.wire_views())
                # No grace: the survivors are blocked in collectives with a dead peer and are
                # discarded anyway (measured: an MWMS worker outlived SIGTERM by a 5 s grace).
                self._stop(grace=0.0)
                consequences = decision.consequences
                event = coordinator.decide(attempt, local)
                if event.failure != local and event.failure is not None:
                    consequences = (local, *consequences)  # node 0 chose another node's failure
            lost_here = event.reform is not None and event.reform.lost_worker is not None
            if event.reform is not None and event.failure is not None and lost_here and self._signal is None:
                self._report(coordinator, attempt, started, event.failure, consequences, failed_at)
            if event.reform is not None and self._signal is None:
                attempt, failed_at, reformed_at = self._reform(event.reform, result, started), None, self._clock()
                continue
            if self._signal is not None or event.failure is None:
                return self._ended(event, result)
            failure = event.failure
            result.failures.append(failure)
            self._report(coordinator, attempt, started, failure, consequences, failed_at)
            if not event.restart:
                if self.options.max_restarts and failure.outcome.restartable:
                    replaced = f" and {result.replacements} replacement(s) of lost workers" if result.replacements else ""
                    self._say(f"giving up after {restarts} restart(s){replaced}")
                return result.end(failure.outcome)
            attempt += 1
            restarts += 1
            result.restarts = restarts
            self._count = self.options.num_workers  # a restart is the group as launched

    def _report(self, coordinator: Coordinator, attempt: int, started: GroupMonitor, failure: Failure,
                consequences: tuple[Failure, ...], failed_at: float) -> None:
        """Stop the workers left, then say the attempt's failure and keep it (``--log-dir``)."""
        self._stop(grace=0.0)
        self._console.settle()  # the workers' held lines above the report, not after it
        where = self.options.attempt_log_dir(attempt)  # with --log-dir: failure.txt as reported, failure.json
        if where is not None and (trouble := keep_failure(where, attempt, failure, consequences)) is not None:
            self._say(trouble)
        whose = "every worker" if coordinator.rank is None else "this node's workers"
        if failure.outcome is Outcome.STOPPED:  # the worker's one line, once: its peers stopped with it
            self._say(failure.report())
        else:
            # The worker's last lines once: live on the console, else in the report.
            shown = self._shown_live(failure, list(started.workers), coordinator.rank)
            self._say(f"{failure.report(consequences, shown=shown)}\nstopped {whose} "
                      f"{self._clock() - failed_at:.1f} s after the failure")

    def _reform(self, reform: Reformation, result: RunResult, monitor: GroupMonitor | None) -> int:
        """Stop this machine's workers for an elastic re-formation, say it in one line, keep its record; its round.

        From the old group's ledgers (``monitor``), once: a line if its workers read data of their own, which makes
        the global batches depend on the group's size; and its steps an epoch, to compare with the new group's.
        """
        stopping = self._clock()
        if reform.graceful:  # they stop at one agreed step (the preemption callback), then exit 75
            self._console.stopping()
            self._stop(grace=self.options.grace, signum=signal.SIGTERM)
            self._console.resuming()
        else:  # a peer is gone: the survivors are blocked in collectives with it
            self._stop(grace=0.0)
        self._console.settle()
        if reform.workers is not None:
            self._count = reform.workers
        record = reformation_record(reform, self.options, self._wall(), self._clock() - stopping)
        result.reformations.append(record)
        self._say(reformation_line(reform, self.options.num_workers, record.get("step")))
        ledgers = [] if monitor is None else monitor.ledgers()
        pipeline = pipeline_line(ledgers)
        if pipeline is not None and not self._said_pipeline:
            self._said_pipeline = True
            self._say(pipeline)
        planned = planned_steps(ledgers)
        if planned is not None:
            self._planned = (self._group, planned)
        run_log_dir = self.options.run_log_dir
        if run_log_dir is not None and (trouble := keep_reformation(run_log_dir, record)) is not None:
            self._say(trouble)
        return reform.round

    def _with_output(self, failure: Failure) -> Failure:
        """``failure`` with its worker's last lines and log files."""
        worker = next((w for w in self._workers if w.index == failure.index), None)
        if worker is None:
            return failure
        return dataclasses.replace(failure, last_lines=worker.last_lines(), logs=worker.logs)

    def _ended(self, event: Event | None, result: RunResult) -> RunResult:
        """Stop for a signal (ours or another node's) or an event that ends the job; the launcher's result."""
        signum = self._signal
        coordinator = self._coordinator
        if signum == signal.SIGTERM and coordinator is not None and coordinator.leave(signum):
            return self._leave(result)
        if signum is not None and coordinator is not None:
            coordinator.stop(signum)
        elif signum is None and event is not None and event.outcome is Outcome.INTERRUPTED and event.signum is not None:
            signum = event.signum
            self._say(f"node {event.node} received {signal.Signals(signum).name}: stopping this node's workers")
        if signum is None:
            if event is not None and event.failure is not None:  # e.g. a node broke the protocol while forming
                result.failures.append(event.failure)
                self._say(event.failure.report())
                return result.end(event.failure.outcome)
            self._say(event.message if event is not None and event.message else
                      "the job ended before this node's workers started")
            return result.end(Outcome.FAILED if event is None or event.outcome is Outcome.SUCCEEDED else event.outcome)
        stopping = self._clock()
        self._console.stopping()  # the workers' dying output goes to the log files only (unless --debug)
        indices = [worker.index for worker in self._workers]
        # Pass the signal on (a preempted worker saves and exits), then SIGKILL after the grace.
        codes = self._stop(signum=signum)
        self._say(f"received {signal.Signals(signum).name}: passed it on; every worker stopped "
                  f"{self._clock() - stopping:.1f} s later")
        for index, code in zip(indices, codes):
            self._say(stopped_line(index, code, signum, self.options.grace))
        if codes and all(code == EXIT_PREEMPTED for code in codes):
            # Every worker saved and asked to be requeued; pass that on to the scheduler.
            self._say(f"every worker exited with status {EXIT_PREEMPTED} (preempted, saved); so does the launcher")
            return result.end(Outcome.PREEMPTED)
        return result.end(Outcome.INTERRUPTED, signum)

    def _leave(self, result: RunResult) -> RunResult:
        """SIGTERM in an elastic job: the others re-form without this node; its workers stop at the step they agree on."""
        stopping = self._clock()
        self._console.stopping()
        codes = self._stop(grace=self.options.grace, signum=signal.SIGTERM)
        self._say(f"received SIGTERM: this node left the job, which goes on without it; its workers stopped "
                  f"{self._clock() - stopping:.1f} s later (exit status {', '.join(map(str, codes)) or 'none'}); "
                  f"exit status {EXIT_PREEMPTED}: start it again to take it back")
        return result.end(Outcome.PREEMPTED)

    def _report_lost_output(self) -> None:
        lost = next((worker.output_lost() for worker in self._workers if worker.output_lost() is not None), None)
        if lost is not None and not self._said_output_lost:
            self._said_output_lost = True
            self._say(f"the reader of the workers' output went away ({type(lost).__name__}); the job goes on, "
                      "its output is discarded")

    def _stop(self, grace: float | None = None, signum: int = signal.SIGTERM) -> list[int]:
        """Stop every worker (signal, grace, SIGKILL) and what they started; their exit statuses."""
        workers, self._workers = self._workers, []
        if not workers:
            return []
        codes = stop_workers(workers, grace=self.options.grace if grace is None else grace, signum=signum,
                             clock=self._clock, sleep=self._sleep)
        if self._subreaper:
            exclude = {worker.pid for worker in workers}
            waiting = self._replacements.pid()
            if waiting is not None:  # it waits for the next round: not an orphan
                exclude.add(waiting)
            if self._lifeline is not None:
                exclude.add(self._lifeline.pid)
            stop_orphans(exclude)
        for worker in workers:
            worker.close()
        return codes
