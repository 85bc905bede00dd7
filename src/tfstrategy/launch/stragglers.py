"""The straggler watch: names, while the job runs, a worker persistently slower than its peers (a warning).

In a synchronous job every worker's step takes the same wall time (the fast ones wait for the slow
one inside the collectives), so a straggler shows in what it does on its own: the time TensorFlow
runs its Python functions (``tf.py_function``/``tf.numpy_function``), the time it waits for its
input, or the CPU its step burns, which its waiting peers do not spend. The launcher feeds
:class:`StragglerWatch` every worker's latest ledger each tick; node 0 of ``--nnodes`` feeds it the
other nodes' views too. Pure: nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from tfstrategy.contract.ledger import Ledger
from tfstrategy.launch.ledger_diagnosis import Diagnosis

__all__ = ["CPU_OVER_WAIT", "StragglerWatch"]


@dataclass
class _Readings:
    written: float = -1.0
    #: How each of the worker's last timed readings was slow, and what it said (``None``: it was not), the oldest
    #: first.
    slow: deque[tuple[str, str] | None] = field(default_factory=deque)

    def cause(self) -> str:
        """What the latest reading of the way most slow readings found said (of two as frequent, the later's): one
        noisy reading does not name the cause."""
        found = [reading for reading in self.slow if reading is not None]
        counts = Counter(way for way, _ in found)
        return next(said for way, said in reversed(found) if counts[way] == max(counts.values()))


#: A slower py_function or input wait is the cause unless the worker's extra CPU is over this many times its
#: extra seconds (then the CPU is, and the function or input merely waits behind it).
CPU_OVER_WAIT = 2.0


@dataclass
class StragglerWatch:
    """Names, once, a worker whose py_function time, input wait or CPU per step stays above its peers'.

    Feed it every worker's latest ledger each tick (:meth:`update`); a reading is a ledger newly
    written. A worker is slow in a reading when what it does on its own per step (its time in a
    ``tf.py_function``, else its input wait, else its CPU) is at least ``ratio`` times its peers' median, and the difference is at least
    ``share`` of the step (and ``floor`` seconds): jitter on a healthy job stays below. It is named
    once ``needed`` of its last ``readings`` timed readings were slow. A reading without step timing
    (its window saw no step: an epoch's end, an evaluation, a checkpoint; or no peer's is known yet)
    is no evidence either way, and one fast reading now and then (the end of an epoch, where every
    worker does the same work) does not hide a straggler, while a worker slow only every other
    reading (noise) is never named. It is named for what most of its slow readings found (its input, a
    ``py_function``, its CPU), not for the last one's: under load a reading now and then finds another.
    """

    ratio: float = 1.5
    readings: int = 10
    needed: int = 8
    share: float = 0.1
    floor: float = 0.005
    _seen: dict[int, _Readings] = field(default_factory=dict)
    _named: set[int] = field(default_factory=set)

    def update(self, ledgers: dict[int, Ledger | None]) -> list[Diagnosis]:
        """The stragglers found by this tick's ledgers (each worker named at most once)."""
        found = []
        current = {index: ledger for index, ledger in ledgers.items() if ledger is not None}
        for index, ledger in current.items():
            readings = self._seen.setdefault(index, _Readings(slow=deque(maxlen=self.readings)))
            if ledger.time == readings.written or len(current) < 2:
                continue
            readings.written = ledger.time
            peers = [other for other_index, other in current.items() if other_index != index]
            if not _timed(ledger, peers):
                continue
            slow = _slower(ledger, peers, self.ratio, self.share, self.floor)
            readings.slow.append(slow)
            count = sum(reading is not None for reading in readings.slow)
            if slow is not None and count >= self.needed and index not in self._named:
                self._named.add(index)
                found.append(Diagnosis("straggler", index, f"worker {index} is a straggler: {readings.cause()}", (
                    f"slow in {count} of its last {len(readings.slow)} readings; its peers wait for it "
                    "inside every step's collectives, so the whole job runs at its pace",)))
        return found


def _timed(ledger: Ledger, peers: Sequence[Ledger]) -> bool:
    """Whether ``ledger`` is a reading the watch can judge: its window and a peer's timed some steps."""
    return (ledger.step_seconds is not None and ledger.step_seconds > 0
            and any(peer.step_seconds is not None and peer.step_seconds > 0 for peer in peers))


def _slower(ledger: Ledger, peers: Sequence[Ledger], ratio: float, share: float,
            floor: float) -> tuple[str, str] | None:
    """How ``ledger``'s worker is slower than its peers (the way, and what to say), or ``None``: in its
    ``py_function`` s, else its input wait, else its CPU per step (a slow ``py_function`` burns CPU too: it is
    named for what it is), else its own part of the step.

    A ``py_function`` or an input wait that is slower by far less than the worker's extra CPU (under
    :data:`CPU_OVER_WAIT` times it) is not the cause: something else on the worker burns the CPU, and the
    function waits behind it (measured: a thread burning CPU beside a ``numpy_function`` that sleeps made the
    sleep 1.5x its peers', while the worker's CPU per step was 7x).
    """
    step = ledger.step_seconds
    if step is None or step <= 0:
        return None
    margin = max(share * step, floor)
    slower: dict[str, tuple[float, str]] = {}  # measure: (seconds above the peers' median, what to say)
    for name, measure, say in (("py_function", _py_function_time, _say_py_function), ("input", Ledger.input_wait, _say_input),
                               ("cpu", _cpu_seconds, _say_cpu)):
        mine, theirs = measure(ledger), [value for value in map(measure, peers) if value is not None]
        if mine is not None and theirs:
            typical = statistics.median(theirs)
            if mine >= ratio * typical and mine - typical >= margin:
                slower[name] = (mine - typical, say(ledger, mine, typical))
    own = next((name for name in ("py_function", "input") if name in slower), None)
    cpu = slower.get("cpu")
    if own is not None and (cpu is None or cpu[0] <= CPU_OVER_WAIT * slower[own][0]):
        return own, slower[own][1]
    if cpu is not None:
        return "cpu", cpu[1]
    # Where the ledger times a worker's own part of the step (peers' waits apart), the step itself.
    times = [peer.step_seconds for peer in peers if peer.step_seconds is not None]
    usual = statistics.median(times) if times else None
    if usual is not None and step >= ratio * usual and step - usual >= max(share * usual, floor):
        return "step-time", f"its steps take {step / max(usual, 1e-3):.1f}x its peers' time ({step:.2f} s against {usual:.2f} s)"
    return None


def _say_py_function(ledger: Ledger, mine: float, typical: float) -> str:
    where = _function_place(ledger.py_function)
    return (f"it spends {mine:.2f} s a step in a tf.py_function/numpy_function{f' ({where})' if where else ''}, "
            f"{mine / max(typical, 1e-3):.1f}x its peers' (in its input's map or its step: TensorFlow runs it in "
            "Python, one call at a time; make it faster, or write it with TensorFlow ops)")


def _say_input(ledger: Ledger, mine: float, typical: float) -> str:
    return (f"it waits {mine:.2f} s a step for its input, {mine / max(typical, 1e-3):.1f}x its peers' "
            "(a slower input pipeline or host: more parallel reads, prefetch, or a cache)")


def _say_cpu(ledger: Ledger, mine: float, typical: float) -> str:
    return (f"its steps take {mine / max(typical, 1e-3):.1f}x its peers' CPU ({mine:.2f} s a step against "
            f"{typical:.2f} s: a slower or busier host, or more work on this worker)")


def _function_place(place: str) -> str:
    """``decode at train.py:12`` from a ledger's ``/path/train.py:12 in decode`` (``""`` for none)."""
    where, _, name = place.rpartition(" in ")
    if not where:
        return ""
    path, _, line = where.rpartition(":")
    return f"{name} at {os.path.basename(path)}:{line}"


# --- helpers ----------------------------------------------------------------------------------------


def _py_function_time(ledger: Ledger) -> float | None:
    """Seconds a step spends in the user's ``tf.py_function``/``tf.numpy_function`` (``None``: not timed)."""
    return ledger.py_function_seconds


def _cpu_seconds(ledger: Ledger) -> float | None:
    """CPU seconds the worker's process spends a step (every thread: its input's, its step's, any other)."""
    return ledger.cpu_seconds
