"""The processes of a worker group: starting, watching, describing and stopping them.

The launcher's side that touches processes (:mod:`tfstrategy.launch.supervisor`
decides what to do with them): each worker runs in its own process group with
an output pump that prefixes its lines and keeps its last ones; a failure is
described from its status and output; the launcher becomes the subreaper of
everything its workers start.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

__all__ = ["LOOPBACK", "free_ports", "failure_reason", "become_subreaper", "WorkerFailure"]

LOOPBACK = "127.0.0.1"
#: Lines of a failed worker's output repeated in the failure report.
TAIL_LINES = 15


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports free on ``host`` (127.0.0.1 by default) right now.

    All sockets are held until every port is chosen so the kernel cannot hand
    out the same port twice; another process may still take one before a
    worker binds it, which then fails that worker with a clear error.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _is_listening(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
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


#: The last line of a Python traceback: ``ValueError: ...``, ``module.Error: ...``, ``KeyboardInterrupt``.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::.*)?$")
#: What TensorFlow (gRPC) prints when a worker's port is taken.
_PORT_IN_USE = re.compile(r"Could not start gRPC server|[Aa]ddress already in use|Failed to add port")


def exception_line(lines: Sequence[str]) -> str | None:
    """The last line of the last Python traceback in ``lines``, if any."""
    after_traceback = False
    found = None
    for line in lines:
        if line.startswith("Traceback (most recent call last)"):
            after_traceback = True
        elif after_traceback and _EXCEPTION_LINE.match(line.strip()):
            found = line.strip()
    return found


def failure_reason(returncode: int, lines: Sequence[str], port: int, joined: bool) -> str:
    """The headline of a failed worker: status or signal, the exception, and a port conflict only if seen."""
    reason = _describe_status(returncode) + ("" if joined else " before joining")
    exception = exception_line(lines)
    if exception:
        reason += f": {exception}"
    if any(_PORT_IN_USE.search(line) for line in lines):
        reason += (f"; TensorFlow could not serve on its port {LOOPBACK}:{port}, which another process holds. "
                   "Stop that process, or restart the job to get new free ports")
    return reason


def become_subreaper() -> bool:
    """Make orphaned descendants children of this process (Linux), so none escapes the job's end."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _own_children(exclude: set[int]) -> list[int]:
    """Live processes whose parent is this process (orphans reparented to the subreaper), minus ``exclude``."""
    me, children = os.getpid(), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            children.append(int(entry))
    return children


@dataclass(kw_only=True)
class WorkerFailure:
    """Why the job (or one attempt of it) stopped."""

    index: int | None
    reason: str
    status: int
    last_lines: tuple[str, ...] = ()
    #: The node of a multi-node job the failure happened on (``None`` on one machine).
    node: int | None = None

    @property
    def who(self) -> str:
        worker = f"worker {self.index}"
        if self.node is None:
            return worker
        return f"node {self.node}'s launcher" if self.index is None else f"node {self.node} {worker}"

    def report(self) -> str:
        """The failure and the worker's last lines, for the terminal."""
        lines = [f"{self.who} {self.reason}"]
        if self.last_lines:
            lines.append(f"last {len(self.last_lines)} line(s) of {self.who}:")
            lines.extend(f"  | {line}" for line in self.last_lines)
        return "\n".join(lines)


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
        self.output_lost: OSError | None = None
        self._pump = threading.Thread(target=self._copy_output, args=(out, lock), daemon=True)
        self._pump.start()

    def _copy_output(self, out: TextIO, lock: threading.Lock) -> None:
        stdout = self.process.stdout
        if stdout is None:  # only when started without stdout=PIPE, which this class never does
            return
        for raw in iter(stdout.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            if self.output_lost is not None:
                continue  # keep draining: a worker blocked on a full pipe would stall the whole job
            with lock:
                try:
                    out.write(f"[worker {self.index}] {line}\n")
                    out.flush()
                except (BrokenPipeError, ValueError, OSError) as error:  # the reader went away (| head)
                    self.output_lost = error if isinstance(error, OSError) else BrokenPipeError(str(error))

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
        # A descendant may still hold the pipe open; closing it under the reading
        # thread would block until that descendant exits, so leave it to the pump.
        if self.process.stdout is not None and not self._pump.is_alive():
            self.process.stdout.close()


