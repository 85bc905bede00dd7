"""The launcher's vocabulary: worker and group states, why a run ended, its exit statuses.

Pure values (no process, no clock): :mod:`tfstrategy.launch.monitor` moves workers and
the group through these states from what it observes, and
:class:`~tfstrategy.launch.supervisor.Launcher` acts on them. torchrun's agent has the same
shape (``WorkerState``, ``RunResult``); ours adds the states a TensorFlow job needs to tell
apart: joining (the strategy's constructor waits for every peer) and stalled (alive, not
advancing while its peers wait in a collective).

Exit statuses, for schedulers (Slurm ``--requeue``, Kubernetes ``podFailurePolicy``):

======  ==========================================================================
status  meaning
======  ==========================================================================
0       every worker exited 0
1       a worker failed (its own status and signal are in the report)
75      preempted: every worker saved and exited 75 (EX_TEMPFAIL): requeue the job
124     not every worker (or node) joined within ``--timeout``
125     a worker stalled: alive but not advancing past ``--stall-timeout``
128+N   the launcher itself received signal N (130 Ctrl-C, 143 SIGTERM) and stopped the job
2       invalid options (nothing started)
======  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "WorkerState", "GroupState", "EndReason", "RunResult", "Failure",
    "EXIT_SUCCESS", "EXIT_FAILURE", "EXIT_PREEMPTED", "EXIT_JOIN_TIMEOUT", "EXIT_STALL", "signal_status",
]

EXIT_SUCCESS = 0
EXIT_FAILURE = 1
EXIT_INVALID = 2
#: What a preempted worker exits with (EX_TEMPFAIL), and the launcher when every worker did.
EXIT_PREEMPTED = 75
#: As coreutils' ``timeout``.
EXIT_JOIN_TIMEOUT = 124
EXIT_STALL = 125


def signal_status(signum: int) -> int:
    """The shell's status for a process ended by signal ``signum`` (128+N)."""
    return 128 + signum


class WorkerState(str, Enum):
    """Where one worker stands. Terminal: succeeded, failed, stopped."""

    STARTING = "starting"  # the process runs; it has not begun creating its strategy
    JOINING = "joining"  # creating its MultiWorkerMirroredStrategy, waiting for its peers
    RUNNING = "running"  # its strategy exists (or its port accepts connections)
    STALLED = "stalled"  # alive, but not advancing while its peers wait
    SUCCEEDED = "succeeded"  # exited 0
    FAILED = "failed"  # exited non-zero or died of a signal the launcher did not send
    STOPPING = "stopping"  # the launcher signalled it
    STOPPED = "stopped"  # ended after the launcher signalled it

    @property
    def ended(self) -> bool:
        return self in (WorkerState.SUCCEEDED, WorkerState.FAILED, WorkerState.STOPPED)


class GroupState(str, Enum):
    """Where this machine's group of workers (one attempt) stands."""

    STARTING = "starting"  # not every worker has joined
    RUNNING = "running"  # every worker joined
    STALLED = "stalled"  # a stall was reported; the group fails past the second threshold
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"


class EndReason(str, Enum):
    """Why a run (or one attempt of it) ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a worker failed (possibly on another node)
    JOIN_TIMEOUT = "join-timeout"  # a worker or node did not join in time
    STALLED = "stalled"
    INTERRUPTED = "interrupted"  # the launcher (or another node's) received SIGINT/SIGTERM
    PREEMPTED = "preempted"  # every worker exited 75
    LOST = "lost"  # the connection to node 0 broke


@dataclass(frozen=True, kw_only=True)
class Failure:
    """One worker's failure, as the report shows it.

    ``time`` is the wall-clock second of the root event (the worker's recorded error,
    else when the launcher saw it end), so failures on several workers and nodes can
    be ordered; ``consequential`` marks TensorFlow's errors that only echo a peer's
    failure ("Collective ops is aborted by", ``UnavailableError``, ``CancelledError``).
    """

    index: int | None
    reason: str
    status: int
    time: float = 0.0
    consequential: bool = False
    last_lines: tuple[str, ...] = ()
    #: The node of a multi-node job (``None`` on one machine).
    node: int | None = None
    #: Where this worker's output is kept (``--log-dir``), if anywhere.
    logs: tuple[str, ...] = ()
    #: The launcher's exit status if this failure ends the job.
    exit_status: int = EXIT_FAILURE

    @property
    def who(self) -> str:
        worker = f"worker {self.index}"
        if self.node is None:
            return worker
        return f"node {self.node}'s launcher" if self.index is None else f"node {self.node} {worker}"

    def headline(self) -> str:
        return f"{self.who} {self.reason}"

    def report(self, consequences: tuple[Failure, ...] = ()) -> str:
        """The failure, its consequences on the peers, its last lines and where its logs are."""
        lines = [self.headline()]
        for other in consequences:
            lines.append(f"  then, as a consequence: {other.headline()}")
        if self.last_lines:
            lines.append(f"last {len(self.last_lines)} line(s) of {self.who}:")
            lines.extend(f"  | {line}" for line in self.last_lines)
        if self.logs:
            lines.append(f"full output of {self.who}: {', '.join(self.logs)}")
        return "\n".join(lines)


@dataclass(kw_only=True)
class RunResult:
    """How a run ended: its exit status, why, and what happened on the way."""

    returncode: int
    reason: EndReason = EndReason.SUCCEEDED
    restarts: int = 0
    #: The root cause of each failed attempt (in order), the peers' consequences apart.
    failures: list[Failure] = field(default_factory=list)
    #: Seconds from noticing a failure to the new group's processes running.
    restart_seconds: list[float] = field(default_factory=list)
    #: Seconds from noticing a failure to every restarted worker having joined.
    rejoin_seconds: list[float] = field(default_factory=list)
    #: Seconds from a worker's last progress to the launcher reporting its stall.
    stall_seconds: list[float] = field(default_factory=list)
