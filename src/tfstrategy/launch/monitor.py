"""The launcher's one monitor loop body: observations in, state transitions and a decision out.

Pure: it starts, signals and reads nothing. Each tick the supervisor hands it what it saw of
every worker (:class:`Observation`: exit status, join files, progress, error record) and the
time; :meth:`GroupMonitor.update` moves each worker through
:class:`~tfstrategy.launch.states.WorkerState` and returns a :class:`Decision`: go on
(maybe with things to say and stacks to dump), or end the attempt with a root cause. The
transitions (ARCHITECTURE.md has the table):

- starting -> joining (``<join file>.starting``) -> running (join file, or every port listening);
- running -> stalled: no heartbeat for ``heartbeat_timeout`` (stopped, frozen; once its script
  ended, the heartbeat stops in the teardown: stalled only past ``teardown_timeout``), or outside its
  step while a peer waits inside one, with no progress for ``max(stall_report, stall_factor x
  step time)``; stalled -> running when it advances again. Before any batch is done, every worker
  inside its first batch (or not yet begun it) for 3 thresholds is said once, with stacks, and not
  failed (tracing, and a slow start on a loaded machine, may take that long), unless the ledgers show
  different train functions or models: then it is a stall;
- any -> succeeded / failed on exit. A worker that exits 0 while a peer waits for it is a failure
  at once: "left the job early". Before it joined, every peer creating its strategy or past it
  waits (the job can never form); after, a peer inside a step past the ones it ran. A peer
  inside the last step the worker ran is finishing it, not waiting.

The attempt ends with an :class:`~tfstrategy.launch.states.Outcome`: succeeded when every
worker did; else the root cause's (failed, preempted; a failure that only echoes a peer's waits
up to ``settle`` seconds for the real one; a cause the ledgers name waits until each live worker's
ledger shows it as of the failure, a second and a half at most); join timeout; stalled past ``stall_timeout``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Mapping, Sequence

from tfstrategy.contract.exits import EXIT_PREEMPTED, shell_status
from tfstrategy.contract.ledger import Ledger, shows_by
from tfstrategy.launch.diagnosis import describe_status, failure_reason, is_consequence, root_cause
from tfstrategy.launch.ledger_diagnosis import (
    Diagnosis,
    WorkerView,
    diagnose,
    view_from_wire,
    view_to_wire,
)
from tfstrategy.launch.stalls import HEARTBEAT_STOPPED, WatchedWorker, still_workers, stuck_in_steps
from tfstrategy.launch.states import Failure, Outcome, WorkerState
from tfstrategy.launch.stragglers import StragglerWatch
from tfstrategy.launch.ticks import Decision, Observation, Policy
from tfstrategy.worker_contract import stop_line

__all__ = ["Policy", "Observation", "Decision", "GroupMonitor"]

#: Diagnoses whose workers wait for collectives that never meet: no longer tracing, a stall.
NEVER_MEET = frozenset({"different-functions", "different-models"})

#: Every worker inside the first batch this many stall thresholds long is said (tracing takes long).
FIRST_BATCH_FACTOR = 3


class GroupMonitor:
    """One attempt of one machine's workers, as states.

    Args:
        indices: the workers' global indices.
        policy: the thresholds.
        started: the monotonic second the group started.
        lines: a worker's last output lines (for headlines read from output).
        ports: the workers' TensorFlow ports (to name a port conflict), by index.
        peers_elsewhere: the job has workers on other nodes (``--nnodes``): they wait for every worker
            here to join, so one that ends before joining ends the job, though no worker here waits.
    """

    def __init__(self, indices: Sequence[int], policy: Policy, *, started: float,
                 lines: Callable[[int], Sequence[str]] = lambda index: (),
                 ports: dict[int, int] | None = None, peers_elsewhere: bool = False) -> None:
        self.policy, self.started = policy, started
        self.peers_elsewhere = peers_elsewhere
        self.workers = {index: WatchedWorker(index) for index in indices}
        for worker in self.workers.values():
            worker.beat_at = worker.steps_at = started
        self._lines, self._ports = lines, ports or {}
        self.all_joined = False
        self._first_failure_at: float | None = None
        #: The wall time a failure was first seen (a worker's exit or its recorded error).
        self._failure_seen_at: float | None = None
        #: Seconds from the last progress to each stall's report.
        self.stall_seconds: list[float] = []
        self._first_batch_said = False
        self._stragglers = StragglerWatch()
        #: Workers on other nodes last seen stopped (said once a stop: :meth:`_watch_remote_stops`).
        self._remote_stops: set[int] = set()

    # --- observations -> worker states ------------------------------------------------------------

    def update(self, now: float, wall: float, seen: dict[int, Observation], *,
               elsewhere: Sequence[Mapping[str, object]] | None = None) -> Decision:
        """One tick: apply what was seen at monotonic ``now`` (wall clock ``wall``); what to do.

        ``elsewhere``: on node 0 of several (``--nnodes``), the other nodes' latest worker views (as
        :func:`~tfstrategy.launch.ledger_diagnosis.view_to_wire` sends them), so that one watch over every
        worker of the job names a straggler; ``None`` on another node, which leaves that watch to node 0.
        """
        decision = Decision()
        for index, observation in seen.items():
            self._observe(self.workers[index], observation, now, wall, decision)
        if not self.all_joined and self._every_worker_joined():
            self.all_joined, decision.all_joined = True, True
            for worker in self.workers.values():
                if worker.state in (WorkerState.STARTING, WorkerState.JOINING):
                    worker.joined, worker.state = True, WorkerState.RUNNING
        self._early_exits(now, decision)
        ended = self._ending(now, wall)
        if ended is not None:
            decision.outcome, decision.failure, decision.consequences = ended
            return decision
        if not self.all_joined:
            timeout = self.policy.join_timeout
            if timeout is not None and now - self.started > timeout:
                decision.failure = self._diagnosed(self._join_timeout(timeout, wall))
                decision.outcome = decision.failure.outcome
            return decision
        remote = None if elsewhere is None else [view_from_wire(view) for view in elsewhere]
        self._watch_remote_stops(remote or (), decision)  # first: a stop elsewhere is the cause of a stall here
        self._stalls(now, wall, decision)
        self._watch_stragglers(remote, decision)
        return decision

    def _watch_stragglers(self, elsewhere: Sequence[WorkerView] | None, decision: Decision) -> None:
        """Warn of a straggler among the running workers here and, on node 0, on the other nodes."""
        if self.peers_elsewhere and elsewhere is None:
            return  # node 0 watches every worker of the job: each warning is said once
        ledgers = {w.index: w.ledger for w in self._alive()}
        for view in elsewhere or ():
            if view.returncode is None and view.index not in ledgers:
                ledgers[view.index] = view.ledger
        for found in self._stragglers.update(ledgers):
            decision.notes.append("warning: " + "\n  ".join(found.lines()) + "\n  the job goes on")

    def _watch_remote_stops(self, elsewhere: Sequence[WorkerView], decision: Decision) -> None:
        """On node 0 of several: say at once that a worker on another node is stopped (its node's launcher sees
        it, and shares it in its views), rather than when TensorFlow's heartbeat aborts a peer 10 s or more later.
        Said once a stop; the stopped worker's node fails the job at its ``--stall-timeout``."""
        stopped = {view.index: view for view in elsewhere if view.stopped and view.returncode is None}
        for index in sorted(stopped.keys() - self._remote_stops):
            node = index // max(len(self.workers), 1)  # node R runs workers R*K .. R*K+K-1
            decision.notes.append(f"stall: node {node}: worker {index} is stopped (SIGSTOP or a debugger) after step "
                                  f"{stopped[index].steps}; its peers wait for it (said by node {node}'s launcher)")
        self._remote_stops = set(stopped)

    def diagnosis(self) -> Diagnosis | None:
        """The cause the workers' ledgers and states show (:func:`~tfstrategy.launch.ledger_diagnosis.diagnose`)."""
        return diagnose(self.views(), peers_elsewhere=self.peers_elsewhere)

    def wire_views(self) -> tuple[dict[str, object], ...]:
        """Every worker's view as this node sends it to node 0, to diagnose across nodes (``--nnodes``)."""
        return tuple(view_to_wire(view) for view in self.views())

    def views(self) -> list[WorkerView]:
        """What :func:`~tfstrategy.launch.ledger_diagnosis.diagnose` reads of every worker here."""
        return [
            WorkerView(index=w.index, ledger=w.ledger, steps=w.steps, in_step=w.in_step and not w.state.ended,
                       returncode=w.returncode, joined=w.joined, joining=w.state is WorkerState.JOINING,
                       stopped=w.stopped_since is not None and not w.state.ended,
                       error_type=None if w.error is None else w.error.type.rsplit(".", 1)[-1],
                       error=None if w.error is None else w.error.describe())
            for w in self.workers.values()]

    def ledgers(self) -> list[Ledger | None]:
        """Every worker's latest ledger here (``None``: none read yet)."""
        return [worker.ledger for worker in self.workers.values()]

    @property
    def training(self) -> bool:
        """Every worker joined and has finished a batch in this attempt (past loading a backup): the group trains."""
        return self.all_joined and all(w.steps >= 1 for w in self.workers.values())

    def _every_worker_joined(self) -> bool:
        workers = list(self.workers.values())
        if all(w.joined or w.state is WorkerState.SUCCEEDED for w in workers) and any(w.joined for w in workers):
            return True
        # A program the start-up hook cannot reach (not Python) signals nothing; every TensorFlow
        # server accepting connections is the next best sign of a formed job. A hooked worker's server
        # listens while its strategy waits for peers (on another node, perhaps): only its join file counts.
        return all(w.joined or (w.listening and not w.state.ended and not w.hooked) for w in workers)

    def _observe(self, worker: WatchedWorker, seen: Observation, now: float, wall: float, decision: Decision) -> None:
        if worker.state.ended:
            return
        worker.error = seen.error or worker.error
        worker.ledger = seen.ledger or worker.ledger
        worker.listening = worker.listening or seen.listening
        worker.hooked = worker.hooked or seen.starting
        if seen.joined and not worker.joined:
            worker.joined, worker.state = True, WorkerState.RUNNING
        elif (seen.starting or seen.listening) and worker.state is WorkerState.STARTING:
            worker.state = WorkerState.JOINING
        if seen.progress is not None:
            if seen.progress.heartbeat != worker.heartbeat:
                worker.heartbeat, worker.beat_at = seen.progress.heartbeat, now
            if seen.progress.steps != worker.steps:
                if worker.steps >= 0 and seen.progress.steps > worker.steps:
                    worker.intervals.append((now - worker.steps_at) / (seen.progress.steps - worker.steps))
                worker.steps, worker.steps_at = seen.progress.steps, now
                if worker.stall is not None:
                    decision.notes.append(f"worker {worker.index} advances again (batch {worker.steps})")
                    worker.stall = None
                    worker.state = WorkerState.RUNNING
            worker.in_step = seen.progress.in_step
            if seen.progress.finishing and worker.finishing_since is None:
                worker.finishing_since = now
        worker.stopped_since = (worker.stopped_since or now) if seen.stopped else None
        if seen.returncode is not None:
            worker.returncode, worker.ended_at, worker.wall_ended = seen.returncode, now, wall
            worker.state = WorkerState.SUCCEEDED if seen.returncode == 0 else WorkerState.FAILED
            if seen.returncode != 0 and self._first_failure_at is None:
                self._first_failure_at = now

    # --- how an attempt ends ----------------------------------------------------------------------

    def _alive(self) -> list[WatchedWorker]:
        return [w for w in self.workers.values() if not w.state.ended]

    def _early_exits(self, now: float, decision: Decision) -> None:
        """A worker that exited 0 while a peer waits for it has left the job early: a root cause."""
        alive = self._alive()
        for worker in self.workers.values():
            if worker.state is not WorkerState.SUCCEEDED or worker.left_early:
                continue
            # Inside a step the exited worker also ran (fewer batches done than it) is a peer finishing
            # that step, not one waiting: the exited worker took part in each of its collectives.
            # Before joining, every peer creating its strategy or past it waits: the job can never form.
            waiting = [w for w in alive if (not worker.joined and (w.joined or w.state is WorkerState.JOINING))
                       or (w.in_step and worker.joined and w.steps >= worker.steps)]
            # A peer that failed after it with an error that only echoes a lost peer was waiting for it too.
            waiting += [w for w in self.workers.values() if w.state is WorkerState.FAILED
                        and w.ended_at >= worker.ended_at and is_consequence(w.error, self._lines(w.index))]
            # A worker that never imported TensorFlow keeps no ledger: a smoke test (`python -c
            # "print(...)"` on every node) is not a training worker that failed to join.
            elsewhere = self.peers_elsewhere and not worker.joined and worker.ledger is not None
            if not waiting and not elsewhere:
                continue
            names = ", ".join(str(w.index) for w in waiting)
            if not waiting:
                worker.left_early = ("exited with status 0 before joining, while the workers on the other nodes wait "
                                     "for it to create its strategy: the job cannot form (its script ended without "
                                     "creating a MultiWorkerMirroredStrategy; every worker must run the same training)")
            elif not worker.joined:
                worker.left_early = (f"exited with status 0 before joining, while worker(s) {names} wait for it to "
                                     "create its strategy: its script ended without creating a "
                                     "MultiWorkerMirroredStrategy (every worker must run the same training)")
            else:
                batches = f" after {worker.steps} batch(es)" if worker.steps >= 0 else ""
                worker.left_early = (f"exited with status 0{batches} while worker(s) {names} still wait for it inside "
                                     "a step: it left the job early (every worker must run the same number of steps)")
            if self._first_failure_at is None:
                self._first_failure_at = now

    def _failure(self, worker: WatchedWorker) -> Failure:
        if worker.left_early:
            return Failure(index=worker.index, reason=worker.left_early, status=0, time=worker.wall_ended)
        code = worker.returncode if worker.returncode is not None else 1
        lines = tuple(self._lines(worker.index))
        stopped = stop_line(code, lines)
        if stopped is not None:  # the hook's one line on a user error: the headline as it is, never restarted
            return Failure(index=worker.index, reason=stopped, status=code, time=worker.wall_ended,
                           outcome=Outcome.STOPPED)
        reason = failure_reason(code, lines, self._ports.get(worker.index), worker.joined, worker.error)
        when = min(worker.error.time, worker.wall_ended) if worker.error is not None else worker.wall_ended
        return Failure(index=worker.index, reason=reason, status=shell_status(code), time=when,
                       consequential=is_consequence(worker.error, lines), killed=code < 0 and worker.error is None)

    def _ending(self, now: float, wall: float) -> tuple[Outcome, Failure | None, tuple[Failure, ...]] | None:
        workers = list(self.workers.values())
        if all(w.state is WorkerState.SUCCEEDED for w in workers) and not any(w.left_early for w in workers):
            return Outcome.SUCCEEDED, None, ()
        failed = [w for w in workers if w.state is WorkerState.FAILED or w.left_early]
        # A live worker that recorded an uncaught exception is about to die of it (its process may
        # take seconds to exit): a root cause now, unless the error only echoes a peer's.
        raising = [w for w in self._alive() if w.error is not None and not is_consequence(w.error)]
        if not failed and not raising:
            return None
        failures = [self._failure(w) for w in failed] + [
            Failure(index=w.index, reason=f"raised {w.error.describe()} ({'' if w.joined else 'before joining; '}"
                                          "its process is exiting)", status=1, time=w.error.time)
            for w in raising if w.error is not None]
        # A peer's failure while a worker is stalled (TensorFlow's own heartbeats or collective timeout
        # gave up on it) is an echo of the stall: the stall is the root cause.
        failures += [Failure(index=w.index, reason=f"stalled: it {w.stall}", status=Outcome.STALLED.exit_status(),
                             time=w.stall_wall, outcome=Outcome.STALLED)
                     for w in self._alive() if w.stall is not None and failed]
        cause, consequences = root_cause(failures)
        if self._failure_seen_at is None:
            self._failure_seen_at = wall
        found = self.diagnosis()
        if found is not None and self._ledgers_behind(wall):
            return None  # the evidence would quote a live worker as it was up to a second before the failure
        if found is not None:  # the ledgers name the cause: it is the root, whoever failed first
            named = next((f for f in failures if f.index == found.index), cause)
            cause = dataclasses.replace(named, diagnosis=found.lines(), consequential=False)
            consequences = tuple(sorted((f for f in failures if f is not named), key=lambda f: f.time))
        first = self._first_failure_at if self._first_failure_at is not None else now
        if cause.consequential and now - first < self.policy.settle:
            return None  # the real failure is probably about to show (its process is still exiting)
        if all(w.returncode == EXIT_PREEMPTED for w in workers):
            cause = Failure(index=None, reason=f"every worker exited with status {EXIT_PREEMPTED} (preempted: saved, requeue me)",
                            status=EXIT_PREEMPTED, time=cause.time, outcome=Outcome.PREEMPTED)
        if cause.consequential:
            cause = dataclasses.replace(cause, reason=cause.reason + " (a consequence of a failure elsewhere: no "
                                        "worker here failed first; on several nodes, see the other nodes' reports)")
        return cause.outcome, cause, consequences

    def _ledgers_behind(self, wall: float) -> bool:
        """A live worker's ledger, written before the failure, may still show it as of the failure.

        A worker writes its ledger at most once a second: a peer waiting in its 8th batch when worker 1 aborted was
        quoted "1 batch begun, 0 done" (CI, stop 52) from its write of a second before. Its next write comes by
        :func:`~tfstrategy.contract.ledger.shows_by` (same machine, same clock), or nothing had changed.
        """
        failed = self._failure_seen_at if self._failure_seen_at is not None else wall
        return any(w.ledger is not None and w.ledger.time < failed
                   and wall < shows_by(w.ledger.time, failed) + self.policy.ledger_read for w in self._alive())

    def _diagnosed(self, failure: Failure) -> Failure:
        """``failure`` with the cause the ledgers show, if any (its worker named: the diagnosed one)."""
        found = self.diagnosis()
        if found is None:
            return failure
        index = failure.index if found.index is None else found.index
        return dataclasses.replace(failure, index=index, diagnosis=found.lines())

    def _join_timeout(self, timeout: float, wall: float) -> Failure:
        """Name the worker holding the job up: one that never started joining, else the first not joined."""
        missing = [w for w in self.workers.values() if not w.joined and w.state is not WorkerState.SUCCEEDED]
        missing = missing or [w for w in self.workers.values() if not w.joined]
        port = self._ports.get

        def state(w: WatchedWorker) -> str:
            if w.returncode is not None:
                return f"{describe_status(w.returncode)} before joining"
            if w.state is WorkerState.JOINING:
                where = f" on 127.0.0.1:{port(w.index)}" if port(w.index) else ""
                return f"is creating its strategy{where}, waiting for its peers"
            where = f" (127.0.0.1:{port(w.index)} is not listening" if port(w.index) else " ("
            return f"never started creating its strategy{where}; is it stuck before tfstrategy.select()?)"

        culprit = next((w for w in missing if w.state is not WorkerState.JOINING), missing[0])
        others = "; ".join(f"worker {w.index} {state(w)}" for w in missing if w is not culprit)
        reason = (
            f"did not join within --timeout {timeout:g} s: it {state(culprit)}" + (f"; {others}" if others else "")
            + ". A worker joins when its MultiWorkerMirroredStrategy exists (Python workers signal it; other "
            "programs when every worker's port accepts connections); raise --timeout if start-up is slow"
        )
        # Every worker here creates its strategy: the one that never joined is on another node (its report
        # is the root cause; this one echoes it).
        elsewhere = self.peers_elsewhere and culprit.state is WorkerState.JOINING
        if elsewhere:
            reason += "; the worker it waits for is on another node (see that node's report)"
        return Failure(index=culprit.index, reason=reason, status=Outcome.JOIN_TIMEOUT.exit_status(), time=wall,
                       outcome=Outcome.JOIN_TIMEOUT, consequential=elsewhere)

    # --- stalls -----------------------------------------------------------------------------------

    def _first_batch(self, now: float, wall: float, decision: Decision, counted: list[WatchedWorker], since: float,
                     threshold: float) -> None:
        """Every worker inside its first batch, or not yet begun it, for long: said once, with stacks.

        The first batch traces and compiles the step, which may take minutes on a large model, so
        nobody is blamed and nothing is stopped. But workers whose ledgers show different train
        functions or models wait there forever for collectives that never meet: that is a stall,
        which fails the job at ``--stall-timeout`` (TensorFlow has no collective timeout by default).
        """
        waited = now - since
        if self._first_batch_said or waited <= FIRST_BATCH_FACTOR * threshold:
            return
        if not all(w.steps == 0 for w in counted) or not any(w.in_step for w in counted):
            return
        self._first_batch_said = True
        decision.dump_stacks = True
        found = self.diagnosis()
        if found is not None:
            decision.notes.append("stall: " + "\n  ".join(found.lines()) + f"\n  what the launcher saw: every worker "
                                  f"has been inside its first batch for {waited:.0f} s; every worker's Python stack "
                                  "follows in its output")
            if found.cause in NEVER_MEET:
                named = next((w for w in counted if w.index == found.index), counted[0])
                named.stall = f"waits inside its first batch for collectives that never meet ({found.headline})"
                named.state, named.stall_wall = WorkerState.STALLED, wall - waited
                self.stall_seconds.append(waited)
            return
        later = [str(w.index) for w in counted if not w.in_step]
        if later:  # a peer slower to start (a loaded machine, a large input pipeline), or stuck before fit
            decision.notes.append(
                f"worker(s) {', '.join(later)} have not begun their first batch {waited:.0f} s after the others "
                "began theirs: still building the model or its input, or stuck before training; every worker's "
                "Python stack follows in its output")
            return
        decision.notes.append(
            f"every worker has been inside its first batch for {waited:.0f} s: still tracing a large step, or "
            "waiting in collectives that never meet (workers that built different train functions); every "
            "worker's Python stack follows in its output (the same function on every worker is the first check)")

    def step_seconds(self) -> float | None:
        """The median time of a batch over the workers' recent batches (``None`` before one finished)."""
        intervals = [value for w in self.workers.values() for value in w.intervals]
        return statistics.median(intervals) if intervals else None

    def stall_threshold(self) -> float:
        step = self.step_seconds()
        return max(self.policy.stall_report, self.policy.stall_factor * step) if step else self.policy.stall_report

    @staticmethod
    def _joined_here(worker: WatchedWorker) -> bool:
        """Whether ``worker``'s heartbeat should beat: not while it creates its strategy.

        TensorFlow holds Python's lock while a strategy waits for its peers (on other nodes, under
        ``--nnodes``): a still heartbeat then is expected, and the join timeout covers that wait.
        """
        return worker.joined or not worker.hooked

    def _stalls(self, now: float, wall: float, decision: Decision) -> None:
        alive = self._alive()
        tracked = [w for w in alive if w.heartbeat >= 0]
        if not tracked:
            return  # no worker reports progress (not Python, or no hook): TensorFlow's heartbeats (or a set timeout) decide
        found = still_workers(tracked, now, self.policy, self._joined_here)
        decision.frozen.update(w.index for w, why, _ in found if why.startswith(HEARTBEAT_STOPPED))
        threshold = self.stall_threshold()
        counted = [w for w in tracked if w.steps >= 0]
        last_advance = max((w.steps_at for w in counted), default=now)
        # A worker seen stopped, here (named once sure, a second on) or on another node (its launcher times it
        # out), is the cause of every wait: no stall guessed from the steps meanwhile would blame the right one.
        stopping = any(w.stopped_since is not None for w in tracked) or bool(self._remote_stops)
        if not found and not stopping and counted and len(counted) == len(tracked) and now - last_advance > threshold:
            found.extend(stuck_in_steps(counted, now, last_advance))
        if not found and not stopping and counted and len(counted) == len(tracked):
            self._first_batch(now, wall, decision, counted, last_advance, threshold)
        for w, why, since in found:
            if w.stall is None:
                w.stall, w.state, w.stall_wall = why, WorkerState.STALLED, wall - (now - since)
                self.stall_seconds.append(now - since)
                decision.dump_stacks = True
                limit = self.policy.stall_timeout
                then = (f"; the job fails if it does not advance within {max(limit, threshold) - (now - since):.0f} s"
                        if limit is not None else "")
                saw = (f"worker {w.index} {why} (found {now - since:.1f} s after its last progress); every worker's "
                       f"Python stack follows in its output{then}")
                found_cause = self.diagnosis()
                if found_cause is None:
                    decision.notes.append(f"stall: {saw}")
                else:
                    decision.notes.append("stall: " + "\n  ".join(found_cause.lines())
                                          + f"\n  what the launcher saw: {saw}")
        limit = self.policy.stall_timeout
        stalled = [w for w in alive if w.stall is not None]
        if limit is None or not stalled:
            return
        for w in stalled:
            since = w.beat_at if now - w.beat_at > self.policy.heartbeat_timeout or w.stopped_since else last_advance
            if w.finishing_since is not None and not w.stopped_since:
                since = w.finishing_since
            if now - since > max(limit, threshold):
                decision.outcome = Outcome.STALLED
                decision.failure = self._diagnosed(Failure(
                    index=w.index, time=wall, status=Outcome.STALLED.exit_status(), outcome=Outcome.STALLED,
                    reason=f"stalled: it {w.stall}; no progress for {now - since:.0f} s (--stall-timeout "
                           f"{limit:g} s). Its Python stack is in its output above",
                ))
                return

