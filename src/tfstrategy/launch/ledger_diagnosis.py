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

The straggler watch, which reads the same ledgers while the job runs, is :mod:`tfstrategy.launch.stragglers`.

Epochs and batches are said as Keras prints them (epoch 1 is the first). Nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tfstrategy.contract.bounds import TEXT, from_wire, to_wire
from tfstrategy.contract.ledger import FunctionTrace, Ledger

__all__ = ["WorkerView", "Diagnosis", "diagnose", "PREPARE_HINT", "view_to_wire", "view_from_wire"]

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


# --- helpers ----------------------------------------------------------------------------------------


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

#: The model weights a view carries at most (the first ones by ordinal: the first that differs names the cause).
WIRE_WEIGHTS = 64


def view_to_wire(view: WorkerView) -> dict[str, object]:
    """The part of ``view`` :func:`diagnose` needs, bounded, as a node sends it to node 0 (``--nnodes``).

    The ledger's fields go as each declares (:func:`tfstrategy.contract.bounds.to_wire`), its input wait as
    ``input_seconds`` (``extra``, where a custom loop's wait may be, stays here), with the planned steps and
    the last weights beside them. Its counterpart is :func:`view_from_wire`; the rendezvous checks every field
    on receipt (:mod:`tfstrategy.launch.rendezvous.wire`).
    """
    ledger = view.ledger
    data: dict[str, object] = {
        "index": view.index, "steps": max(view.steps, -1), "in_step": view.in_step,
        "returncode": view.returncode, "joined": view.joined, "joining": view.joining, "stopped": view.stopped,
        "error_type": None if view.error_type is None else view.error_type[:TEXT], "ledger": None}
    if ledger is None:
        return data
    weights = _weights(view)
    data["ledger"] = {
        **to_wire(replace(ledger, input_seconds=ledger.input_wait())),
        "epoch_steps": _planned(view),
        "weights": [[ordinal, name[:TEXT], shape[:TEXT]]
                    for ordinal, (name, shape) in sorted(weights.items())][:WIRE_WEIGHTS]}
    return data


def view_from_wire(data: Mapping[str, Any]) -> WorkerView:
    """The :class:`WorkerView` a node sent (``data`` as the rendezvous checked it: :func:`view_to_wire`'s form)."""
    record = data["ledger"]
    ledger = None
    if record is not None:
        extra: dict[str, object] = {"weights": {"last": [list(item) for item in record["weights"]]}}
        if record["epoch_steps"] is not None:
            extra["epoch_steps"] = record["epoch_steps"]
        ledger = from_wire(Ledger, record, extra=extra)
    return WorkerView(index=data["index"], ledger=ledger, steps=data["steps"], in_step=data["in_step"],
                      returncode=data["returncode"], joined=data["joined"], joining=data["joining"],
                      stopped=data["stopped"], error_type=data["error_type"])
