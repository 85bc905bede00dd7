"""Words for what happened to a worker: its status, its error, and whether that error is a consequence.

Pure functions of what the launcher observed (statuses, output lines, error records), so the
headline of every fault is tested without a process. A TensorFlow worker whose peer died fails
too, with errors that only echo the peer ("Collective ops is aborted by: ...",
``UnavailableError``, ``CancelledError``): :func:`is_consequence` recognises them, and
:func:`root_cause` puts the earliest real failure first and those echoes after it.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from tfstrategy.contract.exits import shell_status
from tfstrategy.contract.reports import ErrorRecord
from tfstrategy.launch.states import Failure
from tfstrategy.multiworker.file_races import PREFIX as SHARED_PATH

__all__ = ["describe_status", "exit_status", "exception_line", "failure_reason", "is_consequence", "root_cause"]

LOOPBACK = "127.0.0.1"

#: The last line of a Python traceback: ``ValueError: ...``, ``module.Error: ...``, ``KeyboardInterrupt``.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::.*)?$")
#: What TensorFlow (gRPC) prints when a worker's port is taken.
_PORT_IN_USE = re.compile(r"Could not start gRPC server|[Aa]ddress already in use|Failed to add port")
#: TensorFlow's errors that only report that a peer failed or went away.
_CONSEQUENCE_TYPES = re.compile(r"(?:^|\.)(?:UnavailableError|CancelledError|AbortedError)$")
_CONSEQUENCE_TEXT = re.compile(
    r"Collective ops is aborted by|could be from a previous operation|failed to connect to all addresses|"
    r"Socket closed|Connection reset by peer|peer(?:s)? (?:is|are) (?:down|unavailable)|"
    r"DeadlineExceeded.*[Cc]ollective|[Cc]ollective.*(?:timed out|deadline)", re.IGNORECASE,
)
_OOM_HINT = ("; tfstrategy did not send it: the kernel's OOM killer sends SIGKILL when memory runs out "
             "(check 'dmesg' or 'journalctl -k'; lower the batch size or run fewer workers per machine)")


def describe_status(returncode: int) -> str:
    """``exited with status N`` or ``was killed by SIGNAME`` (``returncode`` as Popen gives it)."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def exit_status(returncode: int) -> int:
    """The shell's status of a Popen return code (128+N for signal N)."""
    return shell_status(returncode)


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


def is_consequence(record: ErrorRecord | None, lines: Sequence[str] = ()) -> bool:
    """Whether a worker's error only echoes a peer's failure (TensorFlow's collective and RPC errors)."""
    if record is not None:
        return bool(_CONSEQUENCE_TYPES.search(record.type) or _CONSEQUENCE_TEXT.search(record.message))
    last = exception_line(lines)
    if last is None:
        return False
    kind = last.split(":", 1)[0]
    return bool(_CONSEQUENCE_TYPES.search(kind) or _CONSEQUENCE_TEXT.search(last))


def failure_reason(returncode: int, lines: Sequence[str], port: int | None, joined: bool,
                   record: ErrorRecord | None = None, *, signalled_by_us: bool = False) -> str:
    """The headline of a failed worker: status or signal, its error (recorded, else read from its output)."""
    reason = describe_status(returncode) + ("" if joined else " before joining")
    if record is not None:
        reason += f": {record.describe()}"
    elif (exception := exception_line(lines)) is not None:
        reason += f": {exception}"
    # A worker's own diagnosis of two workers writing one path (printed after its traceback).
    shared = next((line.strip() for line in reversed(lines) if line.strip().startswith(SHARED_PATH)), None)
    if shared is not None:
        reason += "; " + shared.removeprefix("tfstrategy: ")
    if returncode == -signal.SIGKILL and not signalled_by_us:
        reason += _OOM_HINT
    if port is not None and any(_PORT_IN_USE.search(line) for line in lines):
        reason += (f"; TensorFlow could not serve on its port {LOOPBACK}:{port}, which another process holds. "
                   "Stop that process, or restart the job to get new free ports")
    return reason


def root_cause(failures: Sequence[Failure]) -> tuple[Failure, tuple[Failure, ...]]:
    """The earliest failure that is not a consequence (else the earliest of all), and the others in time order.

    Raises:
        ValueError: no failures.
    """
    if not failures:
        raise ValueError("root_cause() needs at least one failure")
    ordered = sorted(failures, key=lambda failure: failure.time)
    causes = [failure for failure in ordered if not failure.consequential]
    cause = causes[0] if causes else ordered[0]
    return cause, tuple(failure for failure in ordered if failure is not cause)
