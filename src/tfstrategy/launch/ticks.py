"""What the group monitor (:mod:`.monitor`) takes in and gives out at each tick: its thresholds, one
worker's observation, and the supervisor's decision."""

from __future__ import annotations

from dataclasses import dataclass, field

from tfstrategy.contract.ledger import Ledger
from tfstrategy.contract.reports import ErrorRecord, Progress
from tfstrategy.launch.states import Failure, Outcome

__all__ = ["Policy", "Observation", "Decision"]


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The thresholds of supervision (seconds)."""

    join_timeout: float | None = 300.0
    #: Floor of the no-progress time before a stall is reported (scaled up by ``stall_factor`` x step time).
    stall_report: float = 30.0
    stall_factor: float = 20.0
    #: No progress for this long fails the group (``None``: report stalls, never fail for one).
    stall_timeout: float | None = 120.0
    #: A live worker whose heartbeat stopped this long is stalled (stopped or frozen).
    heartbeat_timeout: float = 10.0
    #: A worker whose script ended (its heartbeat then stops while TensorFlow tears down, slowly on a loaded
    #: machine) but which has not exited this long is stalled: stuck in the teardown.
    teardown_timeout: float = 60.0
    #: How long a failure that only echoes a peer's waits for the real one to show.
    settle: float = 3.0
    #: A diagnosis at a failure waits for each live worker's ledger to show it as of the failure
    #: (:func:`~tfstrategy.contract.ledger.shows_by`), and this much more for a slow sample and the launcher's read.
    ledger_read: float = 0.25


@dataclass(frozen=True)
class Observation:
    """What the launcher saw of one worker at one tick."""

    returncode: int | None = None
    starting: bool = False
    joined: bool = False
    progress: Progress | None = None
    error: ErrorRecord | None = None
    #: The process is stopped (``T`` in ``/proc/PID/stat``: SIGSTOP, a debugger).
    stopped: bool = False
    #: Its TensorFlow server's port accepts connections (how a program without the hook joins).
    listening: bool = False
    #: Its ledger as last written (:mod:`tfstrategy.contract.ledger`), if it keeps one.
    ledger: Ledger | None = None


@dataclass
class Decision:
    """What the supervisor does after a tick."""

    #: How the attempt ends (``None``: it goes on); every outcome but ``SUCCEEDED`` comes with its ``failure``.
    outcome: Outcome | None = None
    failure: Failure | None = None
    consequences: tuple[Failure, ...] = ()
    notes: list[str] = field(default_factory=list)
    #: Ask every worker for its Python stacks (a stall was just found).
    dump_stacks: bool = False
    #: The workers among them found frozen (their heartbeat stopped), asked with faulthandler's own handler.
    frozen: set[int] = field(default_factory=set)
    #: Every worker joined on this tick.
    all_joined: bool = False
