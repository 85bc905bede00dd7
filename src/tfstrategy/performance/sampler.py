"""The report's free gauges: the process's CPU time, and what stack samples saw TensorFlow run of the user's code.

Read at each timed execution's begin and end (:class:`~tfstrategy.performance.timing.StepTimes`), they cost
two clock readings and two attribute reads; what they add up to is what :mod:`~tfstrategy.performance.evidence`
concludes from when the probes do not run. The samples are the worker's ledger's under ``tfstrategy launch``
(its heartbeat already takes them and shares its counter: :mod:`tfstrategy.stacks`); elsewhere (``tfstrategy run``, a
script's own callback) a :class:`StackSampler` of the report's takes them while ``fit`` runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tfstrategy.contract.reports import sample_pause
from tfstrategy.stacks import TensorFlowRuns, UsersCodeSeconds, shared_counter, tensorflow_runs_users_code

#: Seconds between the report's own samples on average (20 a second: a few microseconds each, when no ledger samples;
#: each pause drawn around it, :func:`~tfstrategy.contract.reports.sample_pause`).
SAMPLE_SECONDS = 0.05

#: Cumulative (CPU seconds, seconds input ran, seconds a ``tf.py_function`` ran).
Gauges = Callable[[], tuple[float, float, float]]


class StackSampler(UsersCodeSeconds):
    """A thread that samples every thread's stack and adds up the seconds it saw the user's input and
    ``tf.py_function`` s run (the ledger keeper's counting, :class:`~tfstrategy.stacks.UsersCodeSeconds`,
    for a process that keeps no ledger)."""

    def __init__(self, *, interval: float = SAMPLE_SECONDS,
                 runs: Callable[[], TensorFlowRuns] = tensorflow_runs_users_code,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(runs)
        self.interval, self._clock = interval, clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """One sample: the time since the last counts as input, or ``py_function`` time, by what runs now."""
        self._sample_users_code(self._clock())

    def _loop(self) -> None:
        while not self._stop.wait(sample_pause(self.interval)):
            self.sample()

    def start(self) -> None:
        """Sample in a daemon thread until :meth:`stop` (a no-op if it already runs)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._sampled_at = None
        self._thread = threading.Thread(target=self._loop, name="tfstrategy-profile-samples", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (waits for the thread: at most one pause, one and a half intervals)."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2 * self.interval + 1.0)

    def gauges(self) -> tuple[float, float, float]:
        return time.process_time(), self.input_seconds, self.py_function_seconds


def ledger_gauges() -> Gauges | None:
    """The live ledger's gauges (under ``tfstrategy launch``, where the heartbeat samples), or ``None``."""
    counter = shared_counter()
    if counter is None:
        return None
    return lambda: (time.process_time(), counter.input_seconds, counter.py_function_seconds)
