"""The processes of a worker group behind a small interface: start, observe, signal, stop.

:class:`WorkerHandle` is all the supervisor knows of a worker; :class:`LocalProcess` is the real
one (the launcher's policy tests use fakes that start nothing). A real worker runs in its own
process group and session, with its output pumped (:mod:`tfstrategy.launch.output`), the
files of :mod:`tfstrategy.contract.reports` beside its join file, and the launcher's lifeline:
the read end of a pipe whose end-of-file tells the worker's hook that the launcher is gone,
and the :mod:`tfstrategy.launch.reaper` that stops everything of the job if the launcher dies.
The launcher is also the subreaper of what its workers start (Linux), so a child that left its
worker's group with ``setsid`` is found and stopped at the job's end.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from tfstrategy.contract.files import starting_file
from tfstrategy.contract.ledger import Ledger, ledger_path, read_ledger
from tfstrategy.contract.reports import read_error, read_progress
from tfstrategy.errors import LaunchError
from tfstrategy.launch import reaper as reaper_script
from tfstrategy.launch.diagnosis import LOOPBACK, describe_status, exception_line, exit_status, failure_reason
from tfstrategy.launch.monitor import Observation
from tfstrategy.launch.output import Console, Pump, Tail
from tfstrategy.settings import ENV_LAUNCH_SECRET
from tfstrategy.worker_contract import FROZEN_STACK_SIGNAL, STACK_SIGNAL

__all__ = [
    "LOOPBACK", "free_ports", "become_subreaper", "WorkerSpec", "WorkerHandle", "LocalProcess", "Lifeline",
    "stop_workers", "describe_status", "exception_line", "exit_status", "failure_reason",
]

#: The order ports of a ``--port-range`` are tried in: a generator of the launcher's own, not Python's shared one,
#: which a notebook that calls ``tfstrategy.launch()`` may have seeded (two notebooks seeded alike would try the
#: same ports, and the draws would change the notebook's own random numbers).
_PORTS = random.Random()


def free_ports(count: int, host: str = LOOPBACK, port_range: tuple[int, int] | None = None) -> list[int]:
    """``count`` distinct TCP ports free on ``host`` (127.0.0.1 by default) right now.

    Without ``port_range`` the kernel picks them from its ephemeral range; with ``(low, high)``
    they are taken from ``low..high`` in random order (so two jobs sharing a range rarely try the
    same ports), each one free on every address, since TensorFlow's servers listen on all of them.
    All sockets are held until every port is chosen so none is handed out twice; another process
    may still take one before a worker binds it, which then fails that worker with a clear error.

    Raises:
        LaunchError: fewer than ``count`` ports of ``port_range`` are free.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        if port_range is None:
            for _ in range(count):
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.bind((host, 0))
                sockets.append(sock)
        else:
            low, high = port_range
            candidates = _PORTS.sample(range(low, high + 1), high - low + 1)
            while candidates and len(sockets) < count:
                sock = socket.socket(family, socket.SOCK_STREAM)
                # As TensorFlow's gRPC server binds: a port whose last worker's connections linger in TIME_WAIT
                # is free for it (an elastic job re-forms on the same --port-range at once); a listener is not.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind(("::" if family == socket.AF_INET6 else "", candidates.pop()))
                except OSError:
                    sock.close()
                    continue
                sockets.append(sock)
            if len(sockets) < count:
                raise LaunchError(
                    f"Received --port-range {low}-{high}, in which {len(sockets)} port(s) are free; expected "
                    f"{count} free ports for this machine's workers. Widen the range or stop what holds its ports."
                )
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def is_listening(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants children of this process (Linux), so none escapes the job's end."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(36, 1, 0, 0, 0) == 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def own_children(exclude: set[int], *, zombies: bool = False) -> list[int]:
    """Processes whose parent is this process (orphans reparented to the subreaper), minus ``exclude``; live ones
    only unless ``zombies``."""
    me, children = os.getpid(), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and (zombies or fields[0] != "Z"):
            children.append(int(entry))
    return children


def _is_stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """Everything needed to start one worker."""

    index: int
    command: tuple[str, ...]
    env: Mapping[str, str]
    port: int
    join_file: Path
    error_file: Path
    progress_file: Path
    #: ``stdout.log``, ``stderr.log`` (``--log-dir``), or ``None``: no files.
    logs: tuple[Path, Path] | None = None
    #: Whether this worker's lines go to the console.
    console: bool = True


class WorkerHandle(Protocol):
    """What the supervisor needs of a worker (a process, or a test's fake)."""

    index: int
    port: int
    pid: int
    logs: tuple[str, ...]

    def poll(self) -> int | None: ...

    def observe(self) -> Observation: ...

    def signal_group(self, signum: int) -> None: ...

    def dump_stacks(self, *, frozen: bool = False) -> None: ...

    def wait(self) -> int: ...

    def last_lines(self) -> tuple[str, ...]: ...

    def output_lost(self) -> OSError | None: ...

    def close(self) -> None: ...


class Lifeline:
    """The pipe every worker holds the read end of, and the reaper that acts if the launcher dies."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.read_fd, self._write_fd = os.pipe()
        self._reaper: subprocess.Popen[bytes] | None = None
        try:
            self._reaper = subprocess.Popen(
                [sys.executable, "-I", "-S", str(Path(reaper_script.__file__)), tag], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                env={key: value for key, value in os.environ.items() if key != ENV_LAUNCH_SECRET},  # it needs no secret
            )
        except OSError:
            self._reaper = None  # the workers' hooks and PR_SET_PDEATHSIG still end them

    @property
    def pid(self) -> int:
        return -1 if self._reaper is None else self._reaper.pid

    def watch(self, pgid: int) -> None:
        if self._reaper is not None and self._reaper.stdin is not None:
            try:
                self._reaper.stdin.write(f"pgid {pgid}\n".encode())
                self._reaper.stdin.flush()
            except OSError:
                pass

    def close(self) -> None:
        """The launcher ends the job itself: release the reaper and the pipe."""
        if self._reaper is not None and self._reaper.stdin is not None:
            try:
                self._reaper.stdin.write(b"done\n")
                self._reaper.stdin.close()
            except OSError:
                pass
            try:
                self._reaper.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
        for fd in (self.read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class LocalProcess:
    """One worker process: its pumps, tail, files and process group.

    Raises:
        OSError: the command could not be started.
    """

    def __init__(self, spec: WorkerSpec, console: Console, lifeline: Lifeline | None) -> None:
        self.spec, self.index, self.port = spec, spec.index, spec.port
        self.logs = tuple(str(path) for path in spec.logs) if spec.logs else ()
        self.tail = Tail()
        self._console = console
        self._next_port_check = 0.0
        self._drained = False
        self._listening = False
        self._ledger_file = ledger_path(spec.progress_file)
        self._ledger: tuple[int, Ledger | None] = (-1, None)
        env = dict(spec.env)
        fds: tuple[int, ...] = ()
        if lifeline is not None:
            fds = (lifeline.read_fd,)
        # Two pipes, so the worker's stderr reaches the launcher's stderr (and its stdout, stdout).
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            self.process = subprocess.Popen(
                list(spec.command), env=env, stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                start_new_session=True, pass_fds=fds,
            )
        except OSError:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            raise
        self.pid = self.process.pid
        os.close(out_w)
        os.close(err_w)
        if lifeline is not None:
            lifeline.watch(self.process.pid)
        show = console if spec.console else None
        prefix = f"[worker {spec.index}] "
        logs: tuple[BinaryIO | None, BinaryIO | None] = (None, None)
        if spec.logs:
            for path in spec.logs:
                path.parent.mkdir(parents=True, exist_ok=True)
            logs = (open(spec.logs[0], "ab"), open(spec.logs[1], "ab"))  # noqa: SIM115 (the pump closes them)
        if spec.console:
            console.register(spec.index, streams=2)
        self._exited = False
        self._pumps = [Pump(out_r, prefix=prefix, console=show, log=logs[0], tail=self.tail, index=spec.index),
                       Pump(err_r, prefix=prefix, console=show, log=logs[1], tail=self.tail, index=spec.index, err=True)]

    def poll(self) -> int | None:
        return self.process.poll()

    def observe(self) -> Observation:
        code = self.process.poll()
        if code is not None and not self._exited:
            self._exited = True
            self._console.ended(self.index, exit_status(code))  # a peer's errors about it are noise if 0
        joined = self.spec.join_file.exists()
        starting = starting_file(self.spec.join_file).exists()
        now = time.monotonic()
        listening = self._listening
        if not joined and not listening and code is None and now >= self._next_port_check:
            # A program the start-up hook cannot reach (not Python) signals nothing; its
            # TensorFlow server accepting connections is the next best sign (see the monitor).
            self._next_port_check = now + 0.5
            listening = self._listening = is_listening(self.port)
        return Observation(
            returncode=code, starting=starting, joined=joined, listening=listening,
            progress=read_progress(self.spec.progress_file),
            error=read_error(self.spec.error_file) if code is not None or self.spec.error_file.exists() else None,
            stopped=code is None and _is_stopped(self.process.pid),
            ledger=self._read_ledger(),
        )

    def _read_ledger(self) -> Ledger | None:
        """The worker's ledger, read again only when the worker replaced it."""
        try:
            changed = os.stat(self._ledger_file).st_mtime_ns
        except OSError:
            return self._ledger[1]
        if changed != self._ledger[0]:
            self._ledger = (changed, read_ledger(self._ledger_file) or self._ledger[1])
        return self._ledger[1]

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def dump_stacks(self, *, frozen: bool = False) -> None:
        """Ask the worker's hook for every thread's stack (only a hooked Python worker, which handles it);
        a ``frozen`` one through faulthandler's handler, which needs no thread of Python's to run."""
        if self.process.poll() is None and self.spec.progress_file.exists():
            try:
                os.kill(self.process.pid, FROZEN_STACK_SIGNAL if frozen else STACK_SIGNAL)
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self) -> int:
        return self.process.wait()

    def last_lines(self) -> tuple[str, ...]:
        # Let the pumps drain what the process wrote before dying (once); a child that
        # inherited the pipe may keep it open, hence the bound.
        if not self._drained and self.process.poll() is not None:
            self._drained = True
            for pump in self._pumps:
                pump.join(timeout=1.0)
        return self.tail.lines()

    def output_lost(self) -> OSError | None:
        return self._console.lost

    def close(self) -> None:
        for pump in self._pumps:
            pump.join(timeout=1.0)


def stop_workers(workers: Sequence[WorkerHandle], *, grace: float, signum: int = signal.SIGTERM,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Signal every worker's process group, SIGKILL what is left after ``grace`` seconds, reap all.

    Returns:
        The workers' exit statuses (128+N for signal N).
    """
    if grace:
        for worker in workers:
            if worker.poll() is None:
                worker.signal_group(signum)
    deadline = clock() + grace
    while clock() < deadline and any(worker.poll() is None for worker in workers):
        sleep(0.05)
    for worker in workers:
        worker.signal_group(signal.SIGKILL)  # also reaches children a worker left behind after it exited
    return [exit_status(worker.wait()) for worker in workers]


def stop_orphans(workers: set[int]) -> None:
    """SIGKILL and reap the descendants reparented to this launcher (the subreaper), until none is left.

    Those that already died (a worker's child killed with its process group) are reaped too, so
    no zombie of the job outlives it in the launcher's process.
    """
    for pid in own_children(workers, zombies=True):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    for _ in range(50):
        orphans = own_children(workers)
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
