"""Start and supervise a group of local MultiWorkerMirroredStrategy workers.

``tfstrategy launch -n N -- python train.py`` (in the spirit of ``torchrun
--standalone``): N processes of the same command, each with a ``TF_CONFIG``
naming free ports on 127.0.0.1 and the ``TFSTRATEGY_*`` variables of
:mod:`tfstrategy.multiworker.worker_protocol`. TensorFlow alone handles failures badly: a peer that
never starts leaves the others blocked in the strategy's constructor forever,
a dead peer surfaces as an ``UnavailableError`` seconds later on the survivors
only. The launcher therefore:

- prefixes every output line with ``[worker i]``;
- stops the whole group (SIGKILL: the survivors are stuck in collectives with a
  dead peer) as soon as one worker exits non-zero or dies, and reports the first
  failure with its last lines;
- fails the job, naming the laggards, when not every worker has joined within
  ``join_timeout`` seconds. A worker joins when its MultiWorkerMirroredStrategy
  exists (the start-up hook of :mod:`tfstrategy.launch.worker_hook` signals it,
  however the script created the strategy); for a program the hook cannot reach
  (not Python), when every worker's server port accepts connections. Once all
  have joined, the timeout no longer applies: only a failure (or a stall the
  collective timeout turns into one) ends a job, so a healthy job is never killed;
- with ``max_restarts``, restarts the whole group on fresh ports, so that
  per-worker BackupAndRestore state (:func:`tfstrategy.backup_callbacks`) resumes;
- on SIGINT/SIGTERM passes the signal on to every worker (a preempted worker
  saves and exits), SIGKILLs what is left after ``grace`` seconds, and returns;
- keeps draining the workers' output when its own reader goes away
  (``tfstrategy launch ... | head``), so the job neither stops nor hangs.

With ``--nnodes N`` (:mod:`tfstrategy.launch.nodes`, :mod:`tfstrategy.launch.rendezvous`)
every machine runs one launcher; node 0's hosts the rendezvous that forms each
attempt's cluster and relays the first failure, the restart decision and stops
to every node, so the rules above hold for the whole job across machines.

Each worker runs in its own process group so that stopping it also stops any
process it started, and so that a terminal's Ctrl-C reaches only the launcher,
which then stops the workers in order. The launcher is also the "subreaper" of
everything its workers start (Linux), so even a child that left the group with
``setsid`` is found and stopped when the job ends.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tfstrategy.errors import LaunchError
from tfstrategy.launch.nodes import MultiNode, describe_end, failure_from_event, secret_free_environment
from tfstrategy.launch.processes import (
    LOOPBACK,
    WorkerFailure,
    _describe_status,
    _exit_status,
    _is_listening,
    _own_children,
    _Worker,
    become_subreaper,
    failure_reason,
    free_ports,
)
from tfstrategy.launch.rendezvous import EventKind, JobEvent, NodeOptions, validate_node_options
from tfstrategy.launch.worker_hook import hook_environment, validate_audit_mode
from tfstrategy.settings import (
    ENV_BACKUP_DIR,
    ENV_JOIN_FILE,
    ENV_NODE_RANK,
    ENV_NUM_WORKERS,
    ENV_RESTART,
    ENV_WORKER_INDEX,
)

__all__ = ["JOIN_TIMEOUT_STATUS", "LaunchOptions", "validate_launch_options", "LaunchResult", "Launcher", "launch"]

#: Exit status of a job whose workers did not all join in time (as coreutils' ``timeout``).
JOIN_TIMEOUT_STATUS = 124
_POLL_SECONDS = 0.05


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """What to run and how to supervise it."""

    command: tuple[str, ...]
    num_workers: int
    max_restarts: int = 0
    backup_dir: Path | None = None
    join_timeout: float | None = 300.0
    #: Seconds workers get to exit after the launcher passes on SIGINT/SIGTERM.
    grace: float = 10.0
    #: What the workers' start-up hook does about variables outside the scope: warn, stop or off.
    audit: str = "warn"
    #: This machine's place in a multi-node job (``--nnodes``); ``None``: every worker here.
    nodes: NodeOptions | None = None


def validate_launch_options(options: LaunchOptions) -> LaunchOptions:
    """Check the options before anything starts; creates the backup directory.

    Raises:
        LaunchError: no command or one that cannot be run, fewer than one worker,
            a negative restart count, a timeout that is not a positive number,
            or a backup directory that cannot be created or written.
    """
    example = "tfstrategy launch -n 2 -- python train.py"
    if not options.command:
        raise LaunchError(f"Received no command to run; expected it after '--', e.g. {example}.")
    if options.num_workers < 1:
        raise LaunchError(f"Received -n {options.num_workers}; expected 1 or more workers, e.g. {example}.")
    if options.max_restarts < 0:
        raise LaunchError(f"Received --max-restarts {options.max_restarts}; expected 0 (never restart) or more.")
    timeout = options.join_timeout
    if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
        raise LaunchError(
            f"Received --timeout {timeout:g}; expected seconds > 0 for every worker to join, e.g. --timeout 120 "
            "(or 0 for no limit)."
        )
    if not math.isfinite(options.grace) or options.grace < 0:
        raise LaunchError(f"Received --grace {options.grace:g}; expected seconds >= 0, e.g. --grace 30.")
    try:
        validate_audit_mode(options.audit)
    except Exception as error:
        raise LaunchError(str(error)) from None
    _require_runnable(options.command[0], example)
    if options.nodes is not None:
        validate_node_options(options.nodes)
    if options.backup_dir is not None:
        _require_writable_directory(options.backup_dir)
    return options


def _require_runnable(program: str, example: str) -> None:
    found = shutil.which(program)
    if found is not None:
        return
    path = Path(program)
    if os.sep in program and path.is_file():
        raise LaunchError(
            f"Received the command {program!r}, a file that is not executable; expected a program, e.g. {example}. "
            f"Run it through its interpreter ('{sys.executable} {program}') or chmod +x it."
        )
    raise LaunchError(
        f"Received the command {program!r}, which is not an executable on PATH; "
        f"expected e.g. {example} (use '{sys.executable}' for this Python)."
    )


def _require_writable_directory(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise LaunchError(f"Received --backup-dir {directory}, which is a file; pass a directory (it is created).")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LaunchError(
            f"Received --backup-dir {directory}, which cannot be created ({error.strerror}); pass a directory "
            "you can write to."
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise LaunchError(f"Received --backup-dir {directory}, which is not writable; pass a directory you can write to.")


def worker_tf_config(ports: Sequence[int], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a local cluster on ``ports``."""
    return cluster_tf_config([f"{LOOPBACK}:{port}" for port in ports], index)


def cluster_tf_config(addresses: Sequence[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of the workers at ``addresses`` (``host:port``)."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


@dataclass(kw_only=True)
class LaunchResult:
    """How the job ended."""

    returncode: int
    restarts: int = 0
    failures: list[WorkerFailure] = field(default_factory=list)
    #: Seconds from noticing a failure to the new group's processes running.
    restart_seconds: list[float] = field(default_factory=list)
    #: Seconds from noticing a failure to every restarted worker having joined.
    rejoin_seconds: list[float] = field(default_factory=list)


class Launcher:
    """Runs one job: start the group, supervise it, restart it, stop it.

    Args:
        options: validated :class:`LaunchOptions`.
        env: base environment of the workers (``os.environ`` when omitted).
        out: where prefixed worker output goes.
        err: where the launcher's own messages go.
    """

    def __init__(self, options: LaunchOptions, *, env: Mapping[str, str] | None = None,
                 out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.options = validate_launch_options(options)
        self.env = dict(os.environ if env is None else env)
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self._lock = threading.Lock()
        self._signal: int | None = None
        self._workers: list[_Worker] = []
        self._said_output_lost = False
        self._subreaper = False
        self._nodes: MultiNode | None = None

    def _say(self, message: str) -> None:
        with self._lock:
            self.err.write(f"tfstrategy launch: {message}\n")
            self.err.flush()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signal = signum

    def run(self) -> LaunchResult:
        """Run the job to its end; returns its exit status and what happened."""
        run_dir = Path(tempfile.mkdtemp(prefix="tfstrategy-launch-"))
        backup_dir = self.options.backup_dir
        if backup_dir is None and self.options.max_restarts > 0:
            backup_dir = run_dir / "backup"
        installed = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                installed[signum] = signal.signal(signum, self._on_signal)
            self._subreaper = become_subreaper()
        try:
            if self.options.nodes is not None:
                self._nodes = MultiNode(self.options, say=self._say, interrupted=lambda: self._signal is not None)
            return self._supervise(run_dir, backup_dir)
        finally:
            self._stop_all()
            if self._nodes is not None:
                self._nodes.close(grace=self.options.grace)
            for signum, handler in installed.items():
                signal.signal(signum, handler)
            shutil.rmtree(run_dir, ignore_errors=True)

    def _start_group(self, run_dir: Path, backup_dir: Path | None, attempt: int) -> JobEvent | None:
        """Start this machine's workers; on several nodes, once node 0 sent the round's cluster.

        Returns:
            ``None`` once started; the event that ended the job instead (a node missing, a stop, node 0 lost).
        """
        count, first = self.options.num_workers, 0
        if self._nodes is None:
            ports = free_ports(count)
            addresses = [f"{LOOPBACK}:{port}" for port in ports]
        else:
            ports = self._nodes.free_ports(count)
            formed = self._nodes.form(attempt, ports)
            if formed is None or formed.kind is not EventKind.CLUSTER:
                return formed
            addresses, first = list(formed.data["workers"]), self._nodes.first_worker
        join_dir = run_dir / f"attempt-{attempt}"
        join_dir.mkdir()
        span = f" {first}" if count == 1 else f"s {first}..{first + count - 1}"
        where = "" if self._nodes is None else f" (worker{span} of {len(addresses)})"
        self._say(
            f"starting {count} worker(s){where} on " + ", ".join(addresses[first:first + count])
            + (f" (restart {attempt} of {self.options.max_restarts})" if attempt else "")
        )
        for local, port in enumerate(ports):
            index = first + local
            join_file = join_dir / f"worker-{index}.joined"
            env = {
                **hook_environment(audit=self.options.audit, summary=True, env=secret_free_environment(self.env)),
                "TF_CONFIG": cluster_tf_config(addresses, index),
                ENV_NUM_WORKERS: str(len(addresses)),
                ENV_WORKER_INDEX: str(index),
                ENV_RESTART: str(attempt),
                ENV_JOIN_FILE: str(join_file),
                # Line-by-line output, so prefixes and failure tails are current.
                "PYTHONUNBUFFERED": "1",
            }
            if self._nodes is not None:
                env[ENV_NODE_RANK] = str(self._nodes.rank)
            if backup_dir is not None:
                env[ENV_BACKUP_DIR] = str(backup_dir)
            try:
                worker = _Worker(index, self.options.command, env, port, join_file, self.out, self._lock)
            except OSError as error:
                raise LaunchError(
                    f"Received the command {self.options.command[0]!r}, which could not be started ({error.strerror}); "
                    "expected a program this user can run."
                ) from None
            self._workers.append(worker)
        return None

    def _supervise(self, run_dir: Path, backup_dir: Path | None) -> LaunchResult:
        result = LaunchResult(returncode=0)
        attempt = 0
        failed_at: float | None = None
        if self._nodes is not None:
            ended = self._nodes.connect(self.options.join_timeout)
            if ended is not None or self._signal is not None:
                return self._ended(ended, result)
            attempt = self._nodes.round
        while True:
            started = time.monotonic()
            ended = self._start_group(run_dir, backup_dir, attempt)
            if ended is not None or self._signal is not None:
                return self._ended(ended, result)
            if failed_at is not None:
                result.restart_seconds.append(time.monotonic() - failed_at)
            outcome = self._watch(started, failed_at, result)
            if outcome is None and self._signal is None and self._nodes is not None:
                outcome = self._nodes.finish(attempt)  # wait for every node's workers
                if outcome is not None and outcome.kind is EventKind.FINISHED:
                    return result
            if self._signal is not None or (isinstance(outcome, JobEvent) and outcome.kind is EventKind.STOP):
                return self._ended(outcome, result)
            if outcome is None:
                return result
            failed_at = time.monotonic()
            # No grace: the survivors are blocked in collectives with a dead peer and are
            # discarded anyway (measured: an MWMS worker outlived SIGTERM by a 5 s grace).
            self._stop_all(grace=0.0)
            if isinstance(outcome, WorkerFailure) and self._nodes is None:
                failure, restart = outcome, attempt < self.options.max_restarts
            else:
                # Node 0 decides for every node: the round's first failure, and restart or give up.
                verdict = None if self._nodes is None else self._nodes.verdict(attempt, outcome)
                if verdict is None or verdict.kind is not EventKind.FAILED:
                    return self._ended(verdict, result)
                failure, restart = failure_from_event(verdict), bool(verdict.data.get("restart"))
            result.failures.append(failure)
            whose = "every worker" if self._nodes is None else "this node's workers"
            self._say(f"{failure.report()}\nstopped {whose} {time.monotonic() - failed_at:.1f} s after the failure")
            if not restart:
                result.returncode = failure.status
                if self.options.max_restarts:
                    self._say(f"giving up after {attempt} restart(s)")
                return result
            attempt += 1
            result.restarts = attempt

    def _ended(self, event: JobEvent | None, result: LaunchResult) -> LaunchResult:
        """Stop for a signal (ours or another node's) or an event that ends the job; the launcher's result."""
        signum = self._signal
        if signum is not None and self._nodes is not None:
            self._nodes.request_stop(signum)
        elif signum is None and event is not None and event.kind is EventKind.STOP:
            signum = int(event.data.get("signal") or signal.SIGTERM)
            self._say(f"node {event.data.get('node')} received {signal.Signals(signum).name}: stopping this node's workers")
        if signum is None:
            result.returncode, message = describe_end(event, self.options)
            self._say(message)
            return result
        stopping = time.monotonic()
        # Pass the signal on (a preempted worker saves and exits), then SIGKILL after the grace.
        codes = self._stop_all(signum=signum)
        self._say(f"received {signal.Signals(signum).name}: passed it on; every worker stopped "
                  f"{time.monotonic() - stopping:.1f} s later")
        result.returncode = 128 + signum
        if len(set(codes)) == 1 and codes[0] > 0:
            # Every worker chose the same status (e.g. 75: saved, requeue me); pass that on to the scheduler.
            result.returncode = codes[0]
            self._say(f"every worker exited with status {codes[0]}; so does the launcher")
        return result

    def _watch(self, started: float, failed_at: float | None, result: LaunchResult) -> WorkerFailure | JobEvent | None:
        """Poll the group until it succeeds or is interrupted (``None``), fails, or does not join in time.

        On several nodes, also until node 0 relays another node's failure or a stop (the event).
        """
        all_joined = False
        next_port_check = 0.0
        while True:
            if self._signal is not None:
                return None
            event = None if self._nodes is None else self._nodes.poll()
            if event is not None:
                return event
            now = time.monotonic()
            self._report_lost_output()
            for worker in self._workers:
                if worker.joined_at is None and worker.join_file.exists():
                    worker.joined_at = now
            if not all_joined and now >= next_port_check:
                # A program the start-up hook cannot reach (not Python) signals nothing; its
                # TensorFlow servers accepting connections is the next best sign of a formed job.
                next_port_check = now + 0.5
                if all(worker.joined_at is not None or _is_listening(worker.port) for worker in self._workers):
                    for worker in self._workers:
                        worker.joined_at = worker.joined_at or now
            if not all_joined and all(worker.joined_at is not None for worker in self._workers):
                all_joined = True
                if failed_at is not None:
                    result.rejoin_seconds.append(now - failed_at)
                    self._say(f"all workers joined again {now - failed_at:.1f} s after the failure")
            codes = [worker.process.poll() for worker in self._workers]
            for worker, code in zip(self._workers, codes):
                if code is not None and code != 0:
                    lines = worker.last_lines()
                    reason = failure_reason(code, lines, worker.port, worker.joined_at is not None)
                    return WorkerFailure(index=worker.index, reason=reason, status=_exit_status(code), last_lines=lines)
            if all(code == 0 for code in codes):
                return None
            timeout = self.options.join_timeout
            # Only the wait for joining is bounded: a joined job runs as long as it is healthy.
            if not all_joined and timeout is not None and now - started > timeout:
                return self._join_timeout(timeout)
            time.sleep(_POLL_SECONDS)

    def _report_lost_output(self) -> None:
        lost = next((worker.output_lost for worker in self._workers if worker.output_lost is not None), None)
        if lost is not None and not self._said_output_lost:
            self._said_output_lost = True
            try:
                self._say(f"the reader of the workers' output went away ({type(lost).__name__}); the job goes on, "
                          "its output is discarded")
            except OSError:
                pass

    def _join_timeout(self, timeout: float) -> WorkerFailure:
        """Name the worker holding the job up: one that never started its server, else the first not joined."""
        missing = [worker for worker in self._workers if worker.joined_at is None]
        states = {}
        for worker in missing:
            code = worker.process.poll()
            if code is not None:
                states[worker.index] = f"{_describe_status(code)} before joining"
            elif Path(f"{worker.join_file}.starting").exists() or _is_listening(worker.port):
                states[worker.index] = f"is creating its strategy on {LOOPBACK}:{worker.port}, waiting for its peers"
            else:
                states[worker.index] = (f"never started creating its strategy ({LOOPBACK}:{worker.port} is not "
                                        "listening; is it stuck before tfstrategy.select()?)")
        culprit = next((w for w in missing if "waiting" not in states[w.index]), missing[0])
        others = "; ".join(f"worker {w.index} {states[w.index]}" for w in missing if w is not culprit)
        reason = (
            f"did not join within --timeout {timeout:g} s: it {states[culprit.index]}"
            + (f"; {others}" if others else "")
            + ". A worker joins when its MultiWorkerMirroredStrategy exists (Python workers signal it; other "
            "programs when every worker's port accepts connections); raise --timeout if start-up is slow"
        )
        return WorkerFailure(index=culprit.index, reason=reason, status=JOIN_TIMEOUT_STATUS, last_lines=culprit.last_lines())

    def _stop_all(self, grace: float | None = None, signum: int = signal.SIGTERM) -> list[int]:
        """Signal every worker's process group, SIGKILL what is left after ``grace`` seconds, reap all.

        Returns the workers' exit statuses (128+N for signal N).

        Descendants that left their worker's process group (``setsid``) were
        reparented to this launcher (the subreaper) and are stopped with it.
        """
        workers, self._workers = self._workers, []
        if not workers:
            return []
        grace = self.options.grace if grace is None else grace
        for worker in workers:
            if grace and worker.process.poll() is None:
                worker.signal_group(signum)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(worker.process.poll() is None for worker in workers):
            time.sleep(_POLL_SECONDS)
        for worker in workers:
            # Also reaches children a worker left behind after it exited itself.
            worker.signal_group(signal.SIGKILL)
            worker.process.wait()
        self._stop_orphans({worker.process.pid for worker in workers})
        for worker in workers:
            worker.close()
        return [_exit_status(worker.process.returncode) for worker in workers]

    def _stop_orphans(self, workers: set[int]) -> None:
        """SIGKILL and reap the descendants reparented to this launcher, until none is left."""
        if not self._subreaper:
            return
        for _ in range(50):
            orphans = _own_children(workers)
            if not orphans:
                return
            for pid in orphans:
                for kill, target in ((os.killpg, pid), (os.kill, pid)):
                    try:
                        kill(target, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
            for pid in orphans:
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass


def launch(
    command: Sequence[str],
    num_workers: int,
    *,
    max_restarts: int = 0,
    backup_dir: str | os.PathLike[str] | None = None,
    join_timeout: float | None = 300.0,
    audit: str = "warn",
    grace: float = 10.0,
    nodes: NodeOptions | None = None,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> LaunchResult:
    """Run ``command`` as ``num_workers`` local workers of one MultiWorkerMirroredStrategy job.

    Args:
        command: the program and its arguments, e.g. ``["python", "train.py"]``.
        num_workers: processes to start, each with its own ``TF_CONFIG``.
        max_restarts: times the whole group is restarted after a failure.
        backup_dir: base of the per-worker BackupAndRestore directories
            (a temporary one is used when restarts are allowed and none is given).
        join_timeout: seconds for every worker to join (``None``: no limit); a
            joined job is never stopped for taking long.
        audit: ``warn``, ``stop`` or ``off``: what each worker does before ``fit``
            when variables were made outside the model's strategy's scope.
        grace: seconds workers get to exit after SIGINT/SIGTERM is passed on.
        nodes: this machine's place in a job of several machines (``num_workers`` on each);
            ``None``: every worker on this machine.
        env: the workers' base environment (``os.environ`` when omitted).
        out: where ``[worker i]`` lines go (stdout); err: launcher messages (stderr).

    Returns:
        A :class:`LaunchResult`; ``returncode`` is 0 when every worker exited 0,
        the first failed worker's status (128+N for signal N), 124 when workers
        did not join in time, 130/143 after SIGINT/SIGTERM.

    Raises:
        LaunchError: invalid options (nothing is started).
    """
    options = LaunchOptions(
        command=tuple(command), num_workers=num_workers, max_restarts=max_restarts,
        backup_dir=None if backup_dir is None else Path(backup_dir), join_timeout=join_timeout,
        audit=audit, grace=grace, nodes=nodes,
    )
    return Launcher(options, env=env, out=out, err=err).run()
