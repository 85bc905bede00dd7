"""Why a synchronous job hangs or aborts, from the workers' ledgers: one line naming the worker and the reason.

Pure: the launcher hands :func:`diagnose` what it knows of every worker (:class:`WorkerView`: its
ledger, its live progress, its process state) when a worker stalls, an attempt fails or times out,
and prints the :class:`Diagnosis` before what it saw itself. The causes, in the order checked (the
first that fits wins, each one a cause no stack shows):

- a worker exited (any status) before joining: the job cannot form;
- a worker is stopped (SIGSTOP, a debugger): its peers wait for it;
- the workers built different models: a weight differs (its broadcast, before any trace, never meets);
- the shards are uneven: one worker ran out of data a batch before its peers;
- the workers traced different train functions: their collectives never meet;
- the shards are uneven: one worker plans fewer steps in the epoch than its peers (Keras knows it).

:class:`StragglerWatch` reads the ledgers while the job runs and names, once, a worker whose time in
a ``tf.py_function``/``tf.numpy_function``, input wait or CPU per step is persistently above its
peers' (a warning: the job goes on). In a synchronous job every worker's step takes the same wall
time (the fast ones wait for the slow one inside the collectives), so a straggler shows in what it
does on its own: the time TensorFlow runs its Python functions, the time it waits for its input, or
the CPU its step burns, which its waiting peers do not spend.

Epochs and batches are said as Keras prints them (epoch 1 is the first). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfstrategy.launch.ledger import FunctionTrace, Ledger

__all__ = ["WorkerView", "Diagnosis", "diagnose", "StragglerWatch", "PREPARE_HINT", "view_to_wire", "view_from_wire"]

PREPARE_HINT = "batch with drop_remainder=True, or use tfstrategy.prepare_dataset"


@dataclass(frozen=True, kw_only=True)
class WorkerView:
    """What the launcher knows of one worker when it asks for a diagnosis."""

    index: int
    ledger: Ledger | None = None
    #: Batches done and whether it is inside one (the progress file; -1: no progress file).
    steps: int = -1
    in_step: bool = False
    #: Its exit status as Popen gives it (``None``: alive).
    returncode: int | None = None
    joined: bool = False
    #: Creating its strategy (``<join file>.starting``) or joined: it waits for the others to form the job.
    joining: bool = False
    #: State T in ``/proc/PID/stat``.
    stopped: bool = False
    #: The type of the uncaught exception it recorded, if any (``ValueError``), and the whole of it
    #: (``ValueError: bad flag (at train.py:7 in main)``).
    error_type: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Diagnosis:
    """The cause of a hang or an abort: one line naming the worker and the reason, then the evidence."""

    #: ``early-exit``, ``stopped``, ``different-models``, ``different-functions``, ``uneven-shards`` or ``straggler``.
    cause: str
    #: The worker named (``None`` when it names several).
    index: int | None
    headline: str
    evidence: tuple[str, ...] = ()

    def lines(self) -> tuple[str, ...]:
        """The headline, then each piece of evidence."""
        return (self.headline, *self.evidence)


def diagnose(views: Sequence[WorkerView], *, peers_elsewhere: bool = False) -> Diagnosis | None:
    """The cause the ledgers and states show, or ``None`` (no cause the launcher can name: say what it saw).

    ``peers_elsewhere``: the job has workers on other nodes (``--nnodes``), which wait for every worker
    here to form the job with them, though the views do not show them.
    """
    if peers_elsewhere:
        found = _early_exit(views, peers_elsewhere=True)
        if found is not None:
            return found
    for check in (_early_exit, _stopped, _different_models, _ran_out_unevenly, _different_functions, _uneven_plans):
        found = check(views)
        if found is not None:
            return found
    return None


# --- the causes -------------------------------------------------------------------------------------


def _early_exit(views: Sequence[WorkerView], *, peers_elsewhere: bool = False) -> Diagnosis | None:
    """A worker that ended before joining while a peer (here, or on another node) waits to form the job with it."""
    waiting = [v for v in views if v.returncode is None and (v.joined or v.joining)]
    gone = [v for v in views if v.returncode is not None and not v.joined]
    if not (waiting or peers_elsewhere) or not gone:
        return None
    worker = gone[0]
    what = (f"raised {worker.error_type}" if worker.error_type else
            f"exited {worker.returncode}" if worker.returncode is not None and worker.returncode >= 0 else
            f"was killed by signal {-(worker.returncode or 0)}")
    evidence = [f"worker {worker.index}'s error: {worker.error}"] if worker.error else []
    evidence += [f"worker {v.index} {'joined' if v.joined else 'is creating its strategy'} and waits for it"
                 for v in waiting]
    if peers_elsewhere:
        evidence.append("the workers on the other nodes wait for it to create its strategy (--nnodes)")
    if worker.ledger is not None and worker.ledger.frame:
        evidence.append(f"worker {worker.index}'s last frame in your code: {worker.ledger.frame}")
    evidence.append("every worker must create the same MultiWorkerMirroredStrategy and train together")
    return Diagnosis("early-exit", worker.index, f"worker {worker.index} {what} before joining: the job cannot form",
                     tuple(evidence))


def _stopped(views: Sequence[WorkerView]) -> Diagnosis | None:
    """A live worker the kernel stopped (SIGSTOP, SIGTSTP, a debugger's breakpoint)."""
    worker = next((v for v in views if v.stopped and v.returncode is None), None)
    if worker is None:
        return None
    steps = _steps_done(worker)
    after = f" after step {steps}" if steps >= 0 else ""
    evidence = []
    if worker.ledger is not None and worker.ledger.frame:
        evidence.append(f"worker {worker.index}'s last frame in your code: {worker.ledger.frame}")
    peers = [v for v in views if v is not worker and v.returncode is None]
    evidence += [f"worker {v.index} is {'inside' if v.in_step else 'after'} step {max(v.steps, 0) + v.in_step}"
                 for v in peers if v.steps >= 0]
    evidence.append("resume it with 'kill -CONT <pid>' (or continue it in the debugger)")
    return Diagnosis("stopped", worker.index,
                     f"worker {worker.index} is stopped (SIGSTOP or a debugger){after}; its peers wait for it",
                     tuple(evidence))


def _different_functions(views: Sequence[WorkerView]) -> Diagnosis | None:
    """Two workers whose n-th traced function of one kind differs: their collectives never meet."""
    ledgers = [(v.index, v.ledger) for v in views if v.ledger is not None and v.ledger.functions]
    for (first, mine), (second, theirs) in zip(ledgers, ledgers[1:]):
        for kind in _kinds(mine.functions):
            pairs = zip(_of_kind(mine.functions, kind), _of_kind(theirs.functions, kind))
            for a, b in pairs:
                if a.fingerprint == b.fingerprint:
                    continue
                evidence = (f"worker {first}: {_describe(a)}", f"worker {second}: {_describe(b)}",
                            "their collectives never meet: every worker must build the same model and train "
                            "function (look for code that depends on the worker's index or on its data)")
                what = "train functions" if kind == "train" else f"{kind} functions"
                return Diagnosis("different-functions", None,
                                 f"workers {first} and {second} traced different {what} (step {a.step + 1})", evidence)
    return None


def _different_models(views: Sequence[WorkerView]) -> Diagnosis | None:
    """Two workers whose n-th model weight differs in name or shape: its broadcast (at creation) never meets."""
    built = [(v.index, weights) for v in views if (weights := _weights(v))]
    for (first, mine), (second, theirs) in zip(built, built[1:]):
        for ordinal in sorted(mine.keys() & theirs.keys()):
            if mine[ordinal] == theirs[ordinal]:
                continue
            (name, shape), (other_name, other_shape) = mine[ordinal], theirs[ordinal]
            what = (f"weight {ordinal} is {name} {shape} on worker {first} and {other_name} {other_shape} on worker "
                    f"{second}")
            return Diagnosis("different-models", None, f"workers {first} and {second} built different models: {what}", (
                f"worker {first}: {_weights_line(mine)}", f"worker {second}: {_weights_line(theirs)}",
                "each weight is broadcast from worker 0 when it is created: every worker must build the same "
                "model (look for code that depends on the worker's index, its host or its data)"))
    return None


def _ran_out_unevenly(views: Sequence[WorkerView]) -> Diagnosis | None:
    """A worker whose data ran out a batch (or more) short of a peer's.

    Checked before the functions: a shorter last batch on one worker may trace its step again, which is
    a consequence of the uneven shards, not the cause.
    """
    for worker in views:
        ledger = worker.ledger
        if ledger is None or not ledger.end_of_data:
            continue
        epoch, begun = ledger.end_of_data[-1]
        done = ledger.steps if ledger.epoch == epoch else max(begun - 1, 0)
        # A peer whose data ran out in the same batch ended its epoch with it (the normal end without steps_per_epoch).
        ahead = [(v, _batches_in(v, epoch)) for v in views if v is not worker
                 and not (v.ledger is not None and (epoch, begun) in v.ledger.end_of_data)]
        ahead = [(v, batches) for v, batches in ahead
                 if batches > done + 1 or (batches > done and (v.in_step or v.returncode is not None))]
        ran_out = [(v, begun_there) for v in views if v is not worker and v.ledger is not None
                   for e, begun_there in v.ledger.end_of_data[-1:] if e == epoch and begun_there > begun]
        if ran_out and not ahead:
            peer, later = ran_out[0]
            return Diagnosis(
                "uneven-shards", worker.index,
                f"worker {worker.index} ran out of data after {begun - 1} batch(es) of epoch {epoch + 1}, worker "
                f"{peer.index} after {later - 1}: the shards differ by {_batches(later - begun)} ({PREPARE_HINT})",
                _plan_evidence(views, epoch))
        if ahead:
            peer, batches = ahead[0]
            waits = "waits" if peer.returncode is None else "was"
            return Diagnosis(
                "uneven-shards", worker.index,
                f"worker {worker.index} ran out of data after {done} batch(es) of epoch {epoch + 1} while worker "
                f"{peer.index} {waits} in batch {batches}: the shards differ by {_batches(batches - done)} "
                f"({PREPARE_HINT})",
                _plan_evidence(views, epoch) + ("a worker whose data ends leaves its peers inside a collective "
                                                "that waits for it",))
    return None


def _uneven_plans(views: Sequence[WorkerView]) -> Diagnosis | None:
    """Workers in one epoch whose planned steps differ (Keras knows it): the one with fewer runs out first."""
    plans = [(v, _planned(v)) for v in views]
    known = [(v, steps) for v, steps in plans if steps is not None and v.ledger is not None]
    epochs = {v.ledger.epoch for v, _ in known if v.ledger is not None}
    if len(known) < 2 or len(epochs) != 1 or len({steps for _, steps in known}) < 2:
        return None
    short, fewest = min(known, key=lambda item: item[1])
    peer, most = max(known, key=lambda item: item[1])
    epoch = epochs.pop()
    return Diagnosis(
        "uneven-shards", short.index,
        f"worker {short.index} plans {fewest} batch(es) in epoch {epoch + 1} while worker {peer.index} plans "
        f"{most}: the shards differ by {_batches(most - fewest)} ({PREPARE_HINT})",
        _plan_evidence(views, epoch))


# --- stragglers -------------------------------------------------------------------------------------


@dataclass
class _Readings:
    written: float = -1.0
    #: Whether each of the worker's last timed readings was slow, the oldest first.
    slow: deque[bool] = field(default_factory=deque)


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
    reading (noise) is never named.
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
            readings.slow.append(slow is not None)
            if slow is not None and sum(readings.slow) >= self.needed and index not in self._named:
                self._named.add(index)
                found.append(Diagnosis("straggler", index, f"worker {index} is a straggler: {slow}", (
                    f"slow in {sum(readings.slow)} of its last {len(readings.slow)} readings; its peers wait for it "
                    "inside every step's collectives, so the whole job runs at its pace",)))
        return found


def _timed(ledger: Ledger, peers: Sequence[Ledger]) -> bool:
    """Whether ``ledger`` is a reading the watch can judge: its window and a peer's timed some steps."""
    return (ledger.step_seconds is not None and ledger.step_seconds > 0
            and any(peer.step_seconds is not None and peer.step_seconds > 0 for peer in peers))


def _slower(ledger: Ledger, peers: Sequence[Ledger], ratio: float, share: float, floor: float) -> str | None:
    """How ``ledger``'s worker is slower than its peers, or ``None``: in its ``py_function`` s, else its input
    wait, else its CPU per step (a slow ``py_function`` burns CPU too: it is named for what it is).

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
    for name, measure, say in (("py_function", _py_function_time, _say_py_function), ("input", _input_wait, _say_input),
                               ("cpu", _cpu_seconds, _say_cpu)):
        mine, theirs = measure(ledger), [value for value in map(measure, peers) if value is not None]
        if mine is not None and theirs:
            typical = statistics.median(theirs)
            if mine >= ratio * typical and mine - typical >= margin:
                slower[name] = (mine - typical, say(ledger, mine, typical))
    own = slower.get("py_function") or slower.get("input")
    cpu = slower.get("cpu")
    if own is not None and (cpu is None or cpu[0] <= CPU_OVER_WAIT * own[0]):
        return own[1]
    if cpu is not None:
        return cpu[1]
    # Where the ledger times a worker's own part of the step (peers' waits apart), the step itself.
    times = [peer.step_seconds for peer in peers if peer.step_seconds is not None]
    usual = statistics.median(times) if times else None
    if usual is not None and step >= ratio * usual and step - usual >= max(share * usual, floor):
        return f"its steps take {step / max(usual, 1e-3):.1f}x its peers' time ({step:.2f} s against {usual:.2f} s)"
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


def _input_wait(ledger: Ledger) -> float | None:
    """Seconds a step spends waiting for its input (the ledger's field, else the worker's ``outside_seconds``)."""
    if ledger.input_seconds is not None:
        return ledger.input_seconds
    value = ledger.extra.get("outside_seconds")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _weights(view: WorkerView) -> dict[int, tuple[str, str]]:
    """The last model weights ``view``'s worker created, by ordinal: ``{3: ("dense/kernel", "(4, 8)")}``."""
    record = None if view.ledger is None else view.ledger.extra.get("weights")
    last = record.get("last") if isinstance(record, dict) else None
    if not isinstance(last, list):
        return {}
    return {int(item[0]): (str(item[1]), str(item[2])) for item in last
            if isinstance(item, list) and len(item) == 3 and isinstance(item[0], int)}


def _weights_line(weights: dict[int, tuple[str, str]]) -> str:
    return ", ".join(f"{ordinal}: {name} {shape}" for ordinal, (name, shape) in sorted(weights.items()))


def _planned(view: WorkerView) -> int | None:
    value = None if view.ledger is None else view.ledger.extra.get("epoch_steps")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _steps_done(view: WorkerView) -> int:
    if view.steps >= 0:
        return view.steps
    return view.ledger.total_steps if view.ledger is not None else -1


def _batches_in(view: WorkerView, epoch: int) -> int:
    """The batches ``view``'s worker has begun in ``epoch`` (0 when it is not there)."""
    ledger = view.ledger
    if ledger is None:
        return 0
    if ledger.epoch == epoch:
        return ledger.batches
    return 0


def _plan_evidence(views: Sequence[WorkerView], epoch: int) -> tuple[str, ...]:
    lines = []
    for view in views:
        ledger = view.ledger
        if ledger is None:
            continue
        planned = _planned(view) if ledger.epoch == epoch else None
        ran_out = [f"{begun}" for e, begun in ledger.end_of_data if e == epoch]
        lines.append(f"worker {view.index}: epoch {ledger.epoch + 1}, {ledger.batches} batch(es) begun, "
                     f"{ledger.steps} done" + (f", {planned} planned" if planned else "")
                     + (f", data ran out in batch {ran_out[-1]}" if ran_out else ""))
    return tuple(lines)


def _batches(count: int) -> str:
    return "one batch" if count == 1 else f"{count} batches"


def _kinds(functions: Sequence[FunctionTrace]) -> list[str]:
    return list(dict.fromkeys(trace.kind for trace in functions))


def _of_kind(functions: Sequence[FunctionTrace], kind: str) -> list[FunctionTrace]:
    return [trace for trace in functions if trace.kind == kind]


def _describe(trace: FunctionTrace) -> str:
    parts = [trace.summary or f"{trace.kind} function"]
    if trace.collectives is not None:
        parts.append(f"{trace.collectives} collective(s) a step")
    return ", ".join(parts) + f" [fingerprint {trace.fingerprint}]"


# --- a worker's view between nodes (--nnodes) --------------------------------------------------------

#: What one view on the wire carries at most: functions, end-of-data events, weights, characters of text.
WIRE_FUNCTIONS, WIRE_ENDS, WIRE_WEIGHTS, WIRE_TEXT = 8, 8, 64, 300
#: The largest per-step seconds and wall-clock second a view carries (a ledger's larger or odd values are sent as unknown).
WIRE_STEP_SECONDS, WIRE_WALL = 1e6, 1e11


def view_to_wire(view: WorkerView) -> dict[str, object]:
    """The part of ``view`` :func:`diagnose` needs, bounded, as a node sends it to node 0 (``--nnodes``).

    Its counterpart is :func:`view_from_wire`; the rendezvous checks every field on receipt
    (:mod:`tfstrategy.launch.rendezvous.wire`).
    """
    ledger = view.ledger
    data: dict[str, object] = {
        "index": view.index, "steps": max(view.steps, -1), "in_step": view.in_step,
        "returncode": view.returncode, "joined": view.joined, "joining": view.joining, "stopped": view.stopped,
        "error_type": None if view.error_type is None else view.error_type[:WIRE_TEXT], "ledger": None}
    if ledger is None:
        return data
    weights = _weights(view)
    planned = _planned(view)
    data["ledger"] = {
        "epoch": max(ledger.epoch, -1), "batches": max(ledger.batches, 0), "steps": max(ledger.steps, 0),
        "total_steps": max(ledger.total_steps, 0), "frame": ledger.frame[:WIRE_TEXT],
        "end_of_data": [[max(e, 0), max(b, 0)] for e, b in ledger.end_of_data][-WIRE_ENDS:],
        "functions": [{"kind": t.kind[:20], "fingerprint": t.fingerprint[:64], "collectives": t.collectives,
                       "epoch": max(t.epoch, 0), "step": max(t.step, 0), "summary": t.summary[:WIRE_TEXT]}
                      for t in ledger.functions][-WIRE_FUNCTIONS:],
        "epoch_steps": planned,
        "weights": [[ordinal, name[:WIRE_TEXT], shape[:WIRE_TEXT]]
                    for ordinal, (name, shape) in sorted(weights.items())][:WIRE_WEIGHTS],
        # What StragglerWatch reads, so that node 0 can watch every worker of the job.
        "time": _bounded(ledger.time, WIRE_WALL) or 0.0,
        "step_seconds": _bounded(ledger.step_seconds, WIRE_STEP_SECONDS),
        "input_seconds": _bounded(_input_wait(ledger), WIRE_STEP_SECONDS),
        "cpu_seconds": _bounded(ledger.cpu_seconds, WIRE_STEP_SECONDS),
        "py_function_seconds": _bounded(ledger.py_function_seconds, WIRE_STEP_SECONDS),
        "py_function": ledger.py_function[-WIRE_TEXT:]}
    return data


def _bounded(value: object, high: float) -> float | None:
    """``value`` as a float when it is a finite number 0..``high`` (a worker's file may hold anything), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= high else None


def view_from_wire(data: Mapping[str, Any]) -> WorkerView:
    """The :class:`WorkerView` a node sent (``data`` as the rendezvous checked it: :func:`view_to_wire`'s form)."""
    record = data["ledger"]
    ledger = None
    if record is not None:
        extra: dict[str, object] = {"weights": {"last": [list(item) for item in record["weights"]]}}
        if record["epoch_steps"] is not None:
            extra["epoch_steps"] = record["epoch_steps"]
        ledger = Ledger(epoch=record["epoch"], batches=record["batches"], steps=record["steps"],
                        total_steps=record["total_steps"], frame=record["frame"],
                        end_of_data=tuple((e, b) for e, b in record["end_of_data"]),
                        functions=tuple(FunctionTrace(**trace) for trace in record["functions"]), extra=extra,
                        time=record["time"], step_seconds=record["step_seconds"],
                        input_seconds=record["input_seconds"], cpu_seconds=record["cpu_seconds"],
                        py_function_seconds=record["py_function_seconds"], py_function=record["py_function"])
    return WorkerView(index=data["index"], ledger=ledger, steps=data["steps"], in_step=data["in_step"],
                      returncode=data["returncode"], joined=data["joined"], joining=data["joining"],
                      stopped=data["stopped"], error_type=data["error_type"])
