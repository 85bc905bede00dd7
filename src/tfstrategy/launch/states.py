"""The launcher's vocabulary: worker states, and one :class:`Outcome` from the monitor to the exit status.

Pure values (no process, no clock): :mod:`tfstrategy.launch.monitor` moves workers through
:class:`WorkerState` from what it observes and ends an attempt with an :class:`Outcome` (and the
:class:`Failure` that caused it); the coordinator relays outcomes between nodes; and
:class:`~tfstrategy.launch.supervisor.Launcher` ends the run with one, whose exit status is
:meth:`Outcome.exit_status`. torchrun's agent has the same shape (``WorkerState``,
``RunResult``); ours adds the states a TensorFlow job needs to tell apart: joining (the
strategy's constructor waits for every peer) and stalled (alive, not advancing while its peers
wait in a collective).

Exit statuses, for schedulers (Slurm ``--requeue``, Kubernetes ``podFailurePolicy``): each outcome's
is in the one table of the worker-launcher contract, :data:`tfstrategy.contract.exits.EXIT_STATUSES`
(``tfstrategy launch --help`` lists it); :meth:`Outcome.exit_status` reads it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import Enum

# The exit statuses moved to the contract; their names stay importable here.
from tfstrategy.contract.exits import EXIT_FAILURE as EXIT_FAILURE
from tfstrategy.contract.exits import EXIT_INVALID as EXIT_INVALID
from tfstrategy.contract.exits import EXIT_JOIN_TIMEOUT as EXIT_JOIN_TIMEOUT
from tfstrategy.contract.exits import EXIT_PREEMPTED as EXIT_PREEMPTED
from tfstrategy.contract.exits import EXIT_STALL as EXIT_STALL
from tfstrategy.contract.exits import EXIT_SUCCESS as EXIT_SUCCESS
from tfstrategy.contract.exits import signal_status as signal_status
from tfstrategy.contract.exits import status_of_outcome

__all__ = [
    "WorkerState", "Outcome", "EndReason", "RunResult", "Failure",
    "EXIT_SUCCESS", "EXIT_FAILURE", "EXIT_INVALID", "EXIT_PREEMPTED", "EXIT_JOIN_TIMEOUT", "EXIT_STALL", "signal_status",
]


class WorkerState(str, Enum):
    """Where one worker stands. Terminal: succeeded, failed (the launcher stops the live ones when the attempt ends)."""

    STARTING = "starting"  # the process runs; it has not begun creating its strategy
    JOINING = "joining"  # creating its MultiWorkerMirroredStrategy, waiting for its peers
    RUNNING = "running"  # its strategy exists (or its port accepts connections)
    STALLED = "stalled"  # alive, but not advancing while its peers wait
    SUCCEEDED = "succeeded"  # exited 0
    FAILED = "failed"  # exited non-zero or died of a signal

    @property
    def ended(self) -> bool:
        return self in (WorkerState.SUCCEEDED, WorkerState.FAILED)


class Outcome(str, Enum):
    """How an attempt, a failure or the whole run ends; each has its exit status."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a worker failed (possibly on another node)
    JOIN_TIMEOUT = "join-timeout"  # a worker or node did not join in time
    STALLED = "stalled"  # a worker made no progress past --stall-timeout
    PREEMPTED = "preempted"  # every worker saved and exited EXIT_PREEMPTED
    INTERRUPTED = "interrupted"  # the launcher (or another node's) received SIGINT/SIGTERM
    LOST = "lost"  # the connection to node 0 broke
    STOPPED = "stopped"  # a worker stopped the job with one line (a user error: refused, missing device)

    def exit_status(self, signum: int | None = None) -> int:
        """The launcher's exit status for this outcome (``signum``: the signal that interrupted it)."""
        if self is Outcome.INTERRUPTED:
            return signal_status(signum if signum is not None else signal.SIGTERM)
        return status_of_outcome(self.value).code

    @property
    def restartable(self) -> bool:
        """Whether ``--max-restarts`` may start the group again: not after a user error, which would repeat."""
        return self is not Outcome.STOPPED


#: The name of :class:`Outcome` in tfstrategy 0.2 (removed in 0.4).
EndReason = Outcome


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
    #: How the job ends if this failure ends it.
    outcome: Outcome = Outcome.FAILED
    #: The cause the workers' ledgers show (:mod:`tfstrategy.launch.ledger_diagnosis`): its headline, then its
    #: evidence; empty when the launcher could only say what it saw (``reason``).
    diagnosis: tuple[str, ...] = ()
    #: It died of a signal with no exception of its own (SIGKILL, the OOM killer, its device or machine gone),
    #: the failure ``-n MIN:MAX`` goes on without; an error in the script fails the job (the others would meet it too).
    killed: bool = False
    #: This node's workers as node 0 needs them to diagnose across nodes (``--nnodes``; the wire form of
    #: :func:`tfstrategy.launch.ledger_diagnosis.view_to_wire`); not part of the report.
    views: tuple[dict[str, object], ...] = field(default=(), compare=False, repr=False)

    @property
    def exit_status(self) -> int:
        """The launcher's exit status if this failure ends the job."""
        return self.outcome.exit_status()

    @property
    def who(self) -> str:
        worker = f"worker {self.index}"
        if self.node is None:
            return worker
        return f"node {self.node}'s launcher" if self.index is None else f"node {self.node} {worker}"

    def headline(self) -> str:
        """The diagnosis' one line (naming the worker and the reason) if there is one, else what the launcher saw.

        A worker's stop line is its own headline, the same whichever worker said it first.
        """
        if self.outcome is Outcome.STOPPED:
            return self.reason
        if self.diagnosis:
            return self.diagnosis[0] if self.node is None else f"node {self.node}: {self.diagnosis[0]}"
        return f"{self.who} {self.reason}"

    def as_dict(self) -> dict[str, object]:
        """The failure as plain JSON values (``--log-dir``'s ``failure.json``)."""
        return {"worker": self.index, "node": self.node, "headline": self.headline(), "reason": self.reason,
                "diagnosis": list(self.diagnosis), "status": self.status, "outcome": self.outcome.value,
                "exit_status": self.exit_status, "time": self.time, "consequential": self.consequential,
                "last_lines": list(self.last_lines), "logs": list(self.logs)}

    def report(self, consequences: tuple[Failure, ...] = (), *, shown: bool = False) -> str:
        """The failure (its diagnosis and evidence first), the peers' failures after it, its last lines and logs.

        A peer's failure is said to be a consequence only when it is ``consequential`` (its error echoes
        a lost peer); any other is ``also:``.

        A worker's stop line is the whole report (and where its logs are): the peers stopped with it.
        ``shown``: the worker's lines are on the console already (live), so the report points at them (and at its
        logs) instead of repeating them.
        """
        lines = [self.headline()]
        if self.outcome is Outcome.STOPPED:
            return "\n".join([*lines, *([f"full output of {self.who}: {', '.join(self.logs)}"] if self.logs else [])])
        if self.diagnosis:
            lines.extend(f"  {line}" for line in self.diagnosis[1:])
            lines.append(f"  what the launcher saw: {self.who} {self.reason}")
        for other in consequences:
            # A consequence only on evidence: its error echoes a lost peer. Another worker's own error
            # (every worker raising the same KeyError by itself) is not caused by this one.
            lines.append(f"  {'then, as a consequence' if other.consequential else 'also'}: {other.headline()}")
        if self.last_lines and shown and not self.logs:
            lines.append(f"the output of {self.who} is above (its [worker {self.index}] lines)")
        elif self.last_lines and not shown:
            lines.append(f"last {len(self.last_lines)} line(s) of {self.who}:")
            lines.extend(f"  | {line}" for line in self.last_lines)
        if self.logs:
            lines.append(f"full output of {self.who}: {', '.join(self.logs)}")
        return "\n".join(lines)


@dataclass(kw_only=True)
class RunResult:
    """How a run ended: its exit status, why, and what happened on the way."""

    returncode: int = EXIT_SUCCESS
    reason: Outcome = Outcome.SUCCEEDED
    restarts: int = 0
    #: Replacements started for lost workers (``-n MIN:MAX``); each used one of ``--max-restarts`` too.
    replacements: int = 0
    #: This machine's workers in the last group started (fewer than ``-n`` after a worker lost under ``-n MIN:MAX``).
    workers: int = 0
    #: The root cause of each failed attempt (in order), the peers' consequences apart.
    failures: list[Failure] = field(default_factory=list)
    #: Seconds from noticing a failure to the new group's processes running.
    restart_seconds: list[float] = field(default_factory=list)
    #: Seconds from noticing a failure to every restarted worker having joined.
    rejoin_seconds: list[float] = field(default_factory=list)
    #: Seconds from a worker's last progress to the launcher reporting its stall.
    stall_seconds: list[float] = field(default_factory=list)
    #: An elastic job's re-formations (:func:`tfstrategy.launch.elastic.reformation_record`), in order.
    reformations: list[dict[str, object]] = field(default_factory=list)
    #: Seconds from a re-formation to every worker of the re-formed group having joined.
    reform_seconds: list[float] = field(default_factory=list)

    def end(self, outcome: Outcome, signum: int | None = None) -> RunResult:
        """End the run with ``outcome``: its reason, and the exit status that follows from it."""
        self.reason, self.returncode = outcome, outcome.exit_status(signum)
        return self
