"""Which worker holds a job up, and why: the causes of a stall the monitor (:mod:`tfstrategy.launch.monitor`) finds.

Pure functions of what the monitor last saw of each worker (:class:`WatchedWorker`) and the time: a worker
whose heartbeat stopped (stopped by a signal, frozen, or still tearing TensorFlow down after its script ended),
or, when every worker beats but no step advanced, the one its peers wait for (outside its step while they are
inside the next, or behind them in batches). Each cause is ``(worker, why, since)``; the monitor turns them into
state transitions, notes and a failure.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tfstrategy.contract.ledger import Ledger
from tfstrategy.contract.reports import ErrorRecord
from tfstrategy.launch.states import WorkerState
from tfstrategy.launch.ticks import Policy

__all__ = ["WatchedWorker", "Cause", "HEARTBEAT_STOPPED", "still_workers", "stuck_in_steps"]

#: How the reason of a frozen worker begins (its stacks are then asked of faulthandler, :data:`FROZEN_STACK_SIGNAL`).
HEARTBEAT_STOPPED = "has not beaten its heartbeat"


@dataclass
class WatchedWorker:
    """What the monitor knows of one worker: its state, progress, heartbeat, and why it stalled (if it did)."""

    index: int
    state: WorkerState = WorkerState.STARTING
    joined: bool = False
    listening: bool = False
    returncode: int | None = None
    ended_at: float = 0.0
    wall_ended: float = 0.0
    error: ErrorRecord | None = None
    heartbeat: int = -1
    beat_at: float = 0.0
    steps: int = -1
    in_step: bool = False
    steps_at: float = 0.0
    intervals: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=20))
    stopped_since: float | None = None
    #: When the launcher saw its script end (the exit handlers ran): the teardown follows.
    finishing_since: float | None = None
    stall: str | None = None
    stall_wall: float = 0.0
    left_early: str | None = None
    ledger: Ledger | None = None
    #: It signalled that it creates its strategy (the hook's ``.starting`` marker): it signals joining too.
    hooked: bool = False


#: A stall's cause: the worker, why (a phrase after "worker N"), and since when (the monitor's clock).
Cause = tuple[WatchedWorker, str, float]


def still_workers(tracked: Sequence[WatchedWorker], now: float, policy: Policy,
                  joined_here: Callable[[WatchedWorker], bool]) -> list[Cause]:
    """The workers whose heartbeat says they hold the job: stopped, past the teardown's time, or frozen."""
    found: list[Cause] = []
    for w in tracked:
        if w.stopped_since is not None and now - w.stopped_since > 1.0:
            found.append((w, "is stopped (state T: SIGSTOP, SIGTSTP or a debugger) and does not run", w.beat_at))
        elif w.finishing_since is not None:
            if now - w.finishing_since > policy.teardown_timeout:
                found.append((w, f"finished its script {now - w.finishing_since:.0f} s ago but has not exited: "
                              "stuck in TensorFlow's teardown (its training is over)", w.finishing_since))
        elif now - w.beat_at > policy.heartbeat_timeout and joined_here(w):
            found.append((w, f"{HEARTBEAT_STOPPED} for {now - w.beat_at:.0f} s: frozen (a C extension "
                          "holding Python's lock, or the machine swapping)", w.beat_at))
    return found


def stuck_in_steps(counted: Sequence[WatchedWorker], now: float, last_advance: float) -> list[Cause]:
    """When no step advanced for a stall's threshold and every worker beats: the one its peers wait for."""
    found: list[Cause] = []
    waiting = [w for w in counted if w.in_step]
    outside = [w for w in counted if not w.in_step]
    batch = max(w.steps for w in counted)
    if waiting and outside and batch == 0:
        pass  # no batch done yet: a worker still building its model or input is starting (the monitor says it)
    elif waiting and outside:
        names = ", ".join(str(w.index) for w in waiting)
        for w in outside:
            found.append((w, f"has been outside its step for {now - last_advance:.0f} s (in its own code: a "
                          f"callback, input, a busy loop) after batch {w.steps}, while worker(s) {names} wait "
                          "for it inside the next step's collectives", last_advance))
    elif waiting and all(w.steps >= 1 for w in counted):
        fewest = min(w.steps for w in counted)
        laggards = [w for w in counted if w.steps == fewest]
        blame = laggards if len(laggards) < len(counted) else []
        for w in blame or counted[:1]:
            what = (f"is stuck inside batch {w.steps + 1} while its peers passed it" if blame else
                    f"and every other worker have been inside batch {batch + 1} for {now - last_advance:.0f} s "
                    "with no progress (a stuck input pipeline or collective)")
            found.append((w, what, last_advance))
    return found
