"""Timing a job's own steps, and the probes' calls.

:class:`StepTimes` times each execution of the train function (K steps), the
time between executions (Keras' loop, callbacks), and in a custom loop the time
spent waiting for ``next()``: two clock readings and an append per execution,
nothing that touches TensorFlow (Keras 3 itself converts the logs at every step
once any batch-end callback is present; measured free on the CPU:
benchmarks/README.md). The other functions time a probe's calls.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

#: Each probe aims at this many seconds (within its counts' bounds).
PROBE_SECONDS = 0.25


@dataclass
class StepTimes:
    """The job's own steps since the last report: per execution, its call, the gap before it, its steps."""

    calls: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    _begun: float | None = None
    _last_end: float | None = None
    _warm_up: bool = True
    #: Seconds of the longest untimed first execution (it traced): the probes' estimate of a fixed cost.
    warm_up_seconds: float = 0.0
    #: Free gauges read at each timed execution's begin and end (cumulative CPU seconds, and seconds the stack
    #: samples saw input and a ``tf.py_function`` run: :mod:`~tfstrategy.performance.sampler`), and their sums.
    gauges: Callable[[], tuple[float, float, float]] | None = None
    gauged: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _gauges_at_begin: tuple[float, float, float] | None = None
    #: Wall seconds of the epochs ended since the last report, and the steps in them (the traced one included).
    epoch_seconds: float = 0.0
    epoch_steps: int = 0
    _epoch_begun: float | None = None
    _epoch_steps: int = 0

    def epoch_begins(self) -> None:
        self._epoch_begun, self._epoch_steps = time.perf_counter(), 0

    def epoch_ends(self) -> None:
        """An epoch (or a custom loop's pass) ended: its wall time and steps count towards the epochs' rate."""
        if self._epoch_begun is not None:
            self.epoch_seconds += time.perf_counter() - self._epoch_begun
            self.epoch_steps += self._epoch_steps
        self._epoch_begun, self._epoch_steps = None, 0

    def new_run(self, warm_up: bool = True) -> None:
        """A new ``fit`` (or loop); with ``warm_up`` its first execution traces, so it is not timed."""
        self._warm_up, self._begun, self._last_end = warm_up, None, None

    def pause(self) -> None:
        """An epoch's end: the time until the next execution (validation, epoch callbacks) is not a step's."""
        self._begun, self._last_end = None, None

    def begin(self, at: float | None = None, *, after_wait: bool = False) -> None:
        """An execution begins (``at``: when); ``after_wait``: the time since the last one was a timed wait, no gap."""
        self._begun = time.perf_counter() if at is None else at
        if after_wait:
            self._last_end = self._begun
        self._gauges_at_begin = self.gauges() if self.gauges is not None and not self._warm_up else None

    def end(self, steps: int, wait: float | None = None) -> None:
        now = time.perf_counter()
        begun, last_end = self._begun, self._last_end
        self._begun, self._last_end = None, now
        if begun is None or steps < 1:
            return
        self._epoch_steps += steps
        at_begin, self._gauges_at_begin = self._gauges_at_begin, None
        if self._warm_up:
            self._warm_up = False
            self.warm_up_seconds = max(self.warm_up_seconds, now - begun)
            return
        self.calls.append(now - begun)
        self.gaps.append(begun - last_end if last_end is not None else 0.0)
        self.steps.append(steps)
        if wait is not None:
            self.waits.append(wait)
        if at_begin is not None and self.gauges is not None:
            for index, (before, after) in enumerate(zip(at_begin, self.gauges())):
                self.gauged[index] += after - before

    def per_step(self) -> tuple[float | None, float | None, float | None]:
        """The gauges' (CPU, input, ``py_function``) seconds per timed step, or ``None`` without gauges."""
        steps = self.timed_steps()
        if self.gauges is None or steps == 0:
            return None, None, None
        cpu, input_, py_function = (value / steps for value in self.gauged)
        return cpu, input_, py_function

    def timed_steps(self) -> int:
        return sum(self.steps)

    def seconds(self) -> float:
        return sum(self.calls) + sum(self.gaps) + sum(self.waits)

    def clear(self) -> None:
        for timings in (self.calls, self.gaps, self.waits, self.steps):
            timings.clear()
        self.gauged = [0.0, 0.0, 0.0]
        self.epoch_seconds, self.epoch_steps = 0.0, 0


def probe_count(seconds_each: float, low: int, high: int, aim: float = PROBE_SECONDS) -> int:
    """How many calls of ``seconds_each`` make a probe of ``aim`` seconds, within ``low`` and ``high``."""
    if seconds_each <= 0:
        return high
    return max(low, min(high, math.ceil(aim / seconds_each)))


def median_seconds(call: Callable[[], object], count: int) -> float:
    """The median seconds of ``count`` calls (after one untimed call)."""
    call()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mean_seconds(call: Callable[[], object], count: int) -> float:
    """Mean seconds of ``count`` calls (after one untimed call): a rate, so what a prefetch buffer held when the
    timing began is spread over all of them instead of making the median. A count, not a duration: on several
    workers a distributed iterator's ``next`` can be a collective, which every worker must call as often."""
    call()
    start = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - start) / count


def alternating(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call's ``rounds`` calls, one of each per round, the order swapped each round."""
    for call in calls.values():
        call()  # a new function, or a new input signature, traces at its first call
    order = list(calls)
    timed: dict[str, list[float]] = {name: [] for name in order}
    for round_ in range(rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            calls[name]()
            timed[name].append(time.perf_counter() - start)
    return timed


#: A probe's fixed cost (making a distributed iterator, releasing one, tracing the all-reduce) as a share of the
#: traced first execution of the job's train function. Measured on 2 workers of examples/train.py (2 shared
#: cores): a 4 s traced first execution; two iterators made in 0.8 s, released in 1.2 s, the all-reduce's two
#: functions traced and timed in 0.7 s.
SETUP_SHARE = 1 / 3
#: ... and at least this many seconds.
SETUP_FLOOR = 0.05


@dataclass(frozen=True, kw_only=True)
class ProbePlan:
    """Which probes run, how many calls each makes, and what they may cost: the budget, agreed by every worker."""

    #: Seconds the probes may take: ``share`` of the ``trained`` seconds.
    budget: float
    share: float
    trained: float
    #: Calls of each train-function probe, batches of the input probe, rounds of the all-reduce probe.
    executions: int
    input_batches: int
    reduce_rounds: int
    input: bool
    reduction: bool
    larger_k: bool
    #: The probes' estimated cost, and why each probe left out was.
    estimate: float = 0.0
    skipped: dict[str, str] = field(default_factory=dict)
    #: The share of ``trained`` every wanted probe would take (what would let them all run), if any was left out.
    needed_share: float | None = None


def plan_probes(*, trained: float, share: float, step: float, steps_per_execution: int = 1, setup: float = 0.0,
                input_setups: int = 3, input_wanted: bool = True, reduction_wanted: bool = False,
                larger_k_wanted: bool = False) -> ProbePlan:
    """The probes that fit in ``share`` of ``trained`` seconds, most telling first: input, reduction, larger K.

    Pure, and fed with figures every worker agreed on, so every worker runs the same probes (their collectives
    must match). Each probe's estimated cost is its calls at the job's ``step`` plus its fixed costs, ``setup``
    each (``input_setups`` for the input probes: two iterators made and released; one for the all-reduce and
    for the larger K), a fixed cost being :data:`SETUP_SHARE` of ``setup``, the seconds of the job's traced first
    execution. A probe that would take the probes past the budget is left out, and says so.
    """
    budget = max(share * trained, 0.0)
    call = step * steps_per_execution
    setup = max(setup * SETUP_SHARE, SETUP_FLOOR)

    def counts_and_costs(aim: float) -> tuple[int, int, int, dict[str, float]]:
        executions = probe_count(call, 3, 20, aim)
        input_batches = probe_count(step, 3, 50, aim)
        reduce_rounds = probe_count(step, 3, 20, aim)
        return executions, input_batches, reduce_rounds, {
            "input": input_setups * setup + 2 * (executions + 1) * call + (input_batches + 1) * step,
            "reduction": setup + 2 * (reduce_rounds + 1) * step,
            "larger K": setup + (executions + 1) * call,
        }

    # About six timed series share the budget.
    executions, input_batches, reduce_rounds, costs = counts_and_costs(min(PROBE_SECONDS, budget / 6))
    wanted = {"input": input_wanted, "reduction": reduction_wanted, "larger K": larger_k_wanted}
    chosen: dict[str, bool] = {}
    skipped: dict[str, str] = {}
    spent = 0.0
    for name, cost in costs.items():
        wanted["larger K"] = larger_k_wanted and chosen.get("input", False)  # it times against the cached step
        chosen[name] = wanted[name] and spent + cost <= budget
        if chosen[name]:
            spent += cost
        elif wanted[name]:
            before = f" after the {spent:.2g} s planned for the probes before it" if spent else ""
            skipped[name] = (f"would cost about {cost:.2g} s{before}, past the probes' budget of {budget:.2g} s "
                             f"({share:.0%} of the {trained:.3g} s trained)")
    needed = None
    if skipped and trained > 0:
        # Every wanted probe at its largest counts (a larger share buys longer probes): what would let them all run.
        largest = counts_and_costs(PROBE_SECONDS)[3]
        wanted["larger K"] = larger_k_wanted and input_wanted
        needed = sum(cost for name, cost in largest.items() if wanted[name]) / trained
    return ProbePlan(budget=budget, share=share, trained=trained, executions=executions, input_batches=input_batches,
                     reduce_rounds=reduce_rounds, input=chosen["input"], reduction=chosen["reduction"],
                     larger_k=chosen["larger K"], estimate=spent, skipped=skipped, needed_share=needed)
