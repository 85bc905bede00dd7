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
- fails the job, naming the laggards, when not every worker has joined (see
  :mod:`tfstrategy.multiworker.worker_protocol`) within ``join_timeout`` seconds;
- with ``max_restarts``, restarts the whole group on fresh ports, so that
  per-worker BackupAndRestore state (:func:`tfstrategy.backup_callbacks`) resumes;
- on SIGINT/SIGTERM stops every worker, and their children (SIGTERM, then SIGKILL
  after ``grace`` seconds), before returning.

Each worker runs in its own process group so that stopping it also stops any
process it started, and so that a terminal's Ctrl-C reaches only the launcher,
which then stops the workers in order.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tfstrategy.errors import LaunchError
from tfstrategy.settings import (
    ENV_BACKUP_DIR,
    ENV_JOIN_FILE,
    ENV_NUM_WORKERS,
    ENV_RESTART,
    ENV_WORKER_INDEX,
)

LOOPBACK = "127.0.0.1"
#: Exit status of a job whose workers did not all join in time (as coreutils' ``timeout``).
JOIN_TIMEOUT_STATUS = 124
#: Lines of a failed worker's output repeated in the failure report.
TAIL_LINES = 15
_POLL_SECONDS = 0.05


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """What to run and how to supervise it."""

    command: tuple[str, ...]
    num_workers: int
    max_restarts: int = 0
    backup_dir: Path | None = None
    join_timeout: float | None = 300.0
    grace: float = 2.0


def validate_launch_options(options: LaunchOptions) -> LaunchOptions:
    """Check the options before anything starts.

    Raises:
        LaunchError: no command, fewer than one worker, a negative restart
            count, a non-positive timeout, or a backup path that is a file.
    """
    example = "tfstrategy launch -n 2 -- python train.py"
    if not options.command:
        raise LaunchError(f"Received no command to run; expected it after '--', e.g. {example}.")
    if options.num_workers < 1:
        raise LaunchError(f"Received -n {options.num_workers}; expected 1 or more workers, e.g. {example}.")
    if options.max_restarts < 0:
        raise LaunchError(f"Received --max-restarts {options.max_restarts}; expected 0 (never restart) or more.")
    if options.join_timeout is not None and options.join_timeout <= 0:
        raise LaunchError(
            f"Received --timeout {options.join_timeout:g}; expected seconds > 0 for every worker to join, e.g. --timeout 120."
        )
    if options.backup_dir is not None and options.backup_dir.exists() and not options.backup_dir.is_dir():
        raise LaunchError(f"Received --backup-dir {options.backup_dir}, which is a file; pass a directory (it is created).")
    if shutil.which(options.command[0]) is None and not Path(options.command[0]).is_file():
        raise LaunchError(
            f"Received the command {options.command[0]!r}, which is not an executable on PATH; "
            f"expected e.g. {example} (use '{sys.executable}' for this Python)."
        )
    return options


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now.

    All sockets are held until every port is chosen so the kernel cannot hand
    out the same port twice; another process may still take one before a
    worker binds it, which then fails that worker with a clear error.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def worker_tf_config(ports: Sequence[int], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a local cluster on ``ports``."""
    return json.dumps({"cluster": {"worker": [f"{LOOPBACK}:{port}" for port in ports]}, "task": {"type": "worker", "index": index}})


def _is_listening(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def _port_taken(port: int) -> bool:
    """Whether some process holds ``port`` (so a worker could not bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def _describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclass(kw_only=True)
class WorkerFailure:
    """Why the job (or one attempt of it) stopped."""

    index: int
    reason: str
    status: int
    last_lines: tuple[str, ...] = ()

    def report(self) -> str:
        """The failure and the worker's last lines, for the terminal."""
        lines = [f"worker {self.index} {self.reason}"]
        if self.last_lines:
            lines.append(f"last {len(self.last_lines)} line(s) of worker {self.index}:")
            lines.extend(f"  | {line}" for line in self.last_lines)
        return "\n".join(lines)


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


class _Worker:
    """One worker process, its output pump and its recent lines."""

    def __init__(self, index: int, command: Sequence[str], env: Mapping[str, str], port: int, join_file: Path,
                 out: TextIO, lock: threading.Lock) -> None:
        self.index, self.port, self.join_file = index, port, join_file
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.process = subprocess.Popen(
            list(command), env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.joined_at: float | None = None
        self._pump = threading.Thread(target=self._copy_output, args=(out, lock), daemon=True)
        self._pump.start()

    def _copy_output(self, out: TextIO, lock: threading.Lock) -> None:
        stdout = self.process.stdout
        if stdout is None:  # only when started without stdout=PIPE, which this class never does
            return
        for raw in iter(stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            with lock:
                out.write(f"[worker {self.index}] {line}\n")
                out.flush()

    def last_lines(self) -> tuple[str, ...]:
        # Let the pump drain what the process wrote before dying; a child that
        # inherited the pipe may keep it open, hence the bound.
        self._pump.join(timeout=1.0)
        return tuple(self.tail)

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        self._pump.join(timeout=1.0)
        if self.process.stdout is not None:
            self.process.stdout.close()


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
        try:
            return self._supervise(run_dir, backup_dir)
        finally:
            self._stop_all()
            for signum, handler in installed.items():
                signal.signal(signum, handler)
            shutil.rmtree(run_dir, ignore_errors=True)

    def _start_group(self, run_dir: Path, backup_dir: Path | None, attempt: int) -> None:
        ports = free_ports(self.options.num_workers)
        join_dir = run_dir / f"attempt-{attempt}"
        join_dir.mkdir()
        self._say(
            f"starting {self.options.num_workers} worker(s) on "
            + ", ".join(f"{LOOPBACK}:{port}" for port in ports)
            + (f" (restart {attempt} of {self.options.max_restarts})" if attempt else "")
        )
        for index, port in enumerate(ports):
            join_file = join_dir / f"worker-{index}.joined"
            env = {
                **self.env,
                "TF_CONFIG": worker_tf_config(ports, index),
                ENV_NUM_WORKERS: str(self.options.num_workers),
                ENV_WORKER_INDEX: str(index),
                ENV_RESTART: str(attempt),
                ENV_JOIN_FILE: str(join_file),
                # Line-by-line output, so prefixes and failure tails are current.
                "PYTHONUNBUFFERED": "1",
            }
            if backup_dir is not None:
                env[ENV_BACKUP_DIR] = str(backup_dir)
            self._workers.append(_Worker(index, self.options.command, env, port, join_file, self.out, self._lock))

    def _supervise(self, run_dir: Path, backup_dir: Path | None) -> LaunchResult:
        result = LaunchResult(returncode=0)
        attempt = 0
        failed_at: float | None = None
        while True:
            started = time.monotonic()
            self._start_group(run_dir, backup_dir, attempt)
            if failed_at is not None:
                result.restart_seconds.append(time.monotonic() - failed_at)
            failure = self._watch(started, failed_at, result)
            if self._signal is not None:
                stopping = time.monotonic()
                self._stop_all()
                self._say(f"received {signal.Signals(self._signal).name}: stopped every worker in "
                          f"{time.monotonic() - stopping:.1f} s")
                result.returncode = 128 + self._signal
                return result
            if failure is None:
                return result
            failed_at = time.monotonic()
            result.failures.append(failure)
            # No grace: the survivors are blocked in collectives with a dead peer and are
            # discarded anyway (measured: an MWMS worker outlived SIGTERM by a 5 s grace).
            self._stop_all(grace=0.0)
            self._say(f"{failure.report()}\nstopped every worker {time.monotonic() - failed_at:.1f} s after the failure")
            if attempt >= self.options.max_restarts:
                result.returncode = failure.status
                if self.options.max_restarts:
                    self._say(f"giving up after {attempt} restart(s)")
                return result
            attempt += 1
            result.restarts = attempt

    def _watch(self, started: float, failed_at: float | None, result: LaunchResult) -> WorkerFailure | None:
        """Poll the group until it succeeds or is interrupted (``None``), fails or times out."""
        all_joined = False
        while True:
            if self._signal is not None:
                return None
            now = time.monotonic()
            for worker in self._workers:
                if worker.joined_at is None and worker.join_file.exists():
                    worker.joined_at = now
            if not all_joined and all(worker.joined_at is not None for worker in self._workers):
                all_joined = True
                if failed_at is not None:
                    result.rejoin_seconds.append(now - failed_at)
                    self._say(f"all workers joined again {now - failed_at:.1f} s after the failure")
            codes = [worker.process.poll() for worker in self._workers]
            for worker, code in zip(self._workers, codes):
                if code is not None and code != 0:
                    reason = _describe_status(code)
                    if worker.joined_at is None and _port_taken(worker.port):
                        reason += (f" before joining; its port {LOOPBACK}:{worker.port} is held by another process "
                                   "(TensorFlow then says 'Could not start gRPC server'). "
                                   "Stop that process, or restart the job to get new free ports")
                    return WorkerFailure(index=worker.index, reason=reason, status=_exit_status(code),
                                         last_lines=worker.last_lines())
            if all(code == 0 for code in codes):
                return None
            timeout = self.options.join_timeout
            if not all_joined and timeout is not None and now - started > timeout:
                return self._join_timeout(timeout)
            time.sleep(_POLL_SECONDS)

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
            + ". A worker joins when tfstrategy.select() has created its strategy (a script that creates it itself "
            "calls tfstrategy.signal_joined() afterwards); raise --timeout if start-up is slow"
        )
        return WorkerFailure(index=culprit.index, reason=reason, status=JOIN_TIMEOUT_STATUS, last_lines=culprit.last_lines())

    def _stop_all(self, grace: float | None = None) -> None:
        """SIGTERM every worker's process group, SIGKILL what is left after ``grace`` seconds, reap all."""
        workers, self._workers = self._workers, []
        if not workers:
            return
        grace = self.options.grace if grace is None else grace
        for worker in workers:
            if grace and worker.process.poll() is None:
                worker.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(worker.process.poll() is None for worker in workers):
            time.sleep(_POLL_SECONDS)
        for worker in workers:
            # Also reaches children a worker left behind after it exited itself.
            worker.signal_group(signal.SIGKILL)
            worker.process.wait()
            worker.close()


def launch(
    command: Sequence[str],
    num_workers: int,
    *,
    max_restarts: int = 0,
    backup_dir: str | os.PathLike[str] | None = None,
    join_timeout: float | None = 300.0,
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
        join_timeout: seconds for every worker to join (``None``: no limit).
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
    )
    return Launcher(options, env=env, out=out, err=err).run()
