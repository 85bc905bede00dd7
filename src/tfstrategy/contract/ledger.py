"""A worker's ledger: what it trained, as its launcher reads it to explain a hang or an abort.

Both sides of the file live here, so they cannot drift apart. The worker (the start-up hook's
``ledger`` step, or :func:`tfstrategy.select`) keeps one :class:`Ledger` in memory; its heartbeat
thread writes it as JSON next to the progress file (:func:`~tfstrategy.contract.files.ledger_path`) when it
changed, never from inside a step. The launcher reads every worker's ledger when a worker stalls, aborts or
times out, compares them and names the worker and the reason
(:mod:`tfstrategy.launch.ledger_diagnosis`).

Nothing here imports TensorFlow (it moved here from ``tfstrategy.launch.ledger``, which still
re-exports its names).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tfstrategy.contract.bounds import Count, Last, Local, Nested, Pair, StepSeconds, Text, WallClock, on_wire
from tfstrategy.contract.files import ledger_path
from tfstrategy.contract.reports import LONGEST_HEARTBEAT_SECONDS

__all__ = ["Ledger", "FunctionTrace", "WRITE_SECONDS", "ledger_path", "read_ledger", "shows_by", "write_ledger"]

#: The worker writes its ledger at most once per this many seconds (plus once at exit), when it changed.
WRITE_SECONDS = 1.0


def shows_by(written: float, moment: float) -> float:
    """The wall time by which a ledger last written at ``written`` shows its worker as of ``moment`` (later).

    The heartbeat samples at least every :data:`~tfstrategy.contract.reports.LONGEST_HEARTBEAT_SECONDS` and writes
    what changed, once :data:`WRITE_SECONDS` have passed since its last write; a ledger not written again by then had
    not changed.
    """
    return max(written + WRITE_SECONDS, moment) + LONGEST_HEARTBEAT_SECONDS


#: 2: ``py_function_seconds`` and ``py_function`` (a ``py_function`` was input in 1).
_VERSION = 2


@dataclass(frozen=True, kw_only=True)
class FunctionTrace:
    """One traced train/eval function, enough to tell two workers' functions apart."""

    #: ``train``, ``test`` or ``predict`` (Keras), or ``custom`` (a ``strategy.run`` loop).
    kind: str = field(metadata=on_wire(Text(20)))
    #: A short hash of what the function computes (its variables' shapes and dtypes, its ops).
    fingerprint: str = field(metadata=on_wire(Text(64)))
    #: The collectives one call of it issues (all-reduces, all-gathers), where TensorFlow exposes them.
    collectives: int | None = field(default=None, metadata=on_wire(Count(optional=True)))
    #: The epoch and step at which it was traced.
    epoch: int = field(default=0, metadata=on_wire(Count()))
    step: int = field(default=0, metadata=on_wire(Count()))
    #: A few words a user recognises: ``"Sequential: 3 variables, 2 all-reduces"``.
    summary: str = field(default="", metadata=on_wire(Text()))


@dataclass(frozen=True, kw_only=True)
class Ledger:
    """One worker's account of its training, as last written.

    Each field declares, once, what of it crosses the wire between nodes (``on_wire``:
    :mod:`tfstrategy.contract.bounds`); the views a node sends node 0 and their checks derive from that.
    """

    #: The epoch in progress (0-based; -1 before the first).
    epoch: int = field(default=-1, metadata=on_wire(Count(low=-1)))
    #: Batches begun and steps ended in that epoch, and in all epochs.
    batches: int = field(default=0, metadata=on_wire(Count()))
    steps: int = field(default=0, metadata=on_wire(Count()))
    total_steps: int = field(default=0, metadata=on_wire(Count()))
    #: ``(epoch, batches)`` each time the data ran out inside a begun batch (the last few).
    end_of_data: tuple[tuple[int, int], ...] = field(default=(), metadata=on_wire(Last(8, Pair(Count(), Count()))))
    #: The functions traced, in order (the last few).
    functions: tuple[FunctionTrace, ...] = field(default=(), metadata=on_wire(Last(8, Nested(FunctionTrace))))
    #: ``file:line in function`` of the deepest frame in the user's code on the main thread.
    frame: str = field(default="", metadata=on_wire(Text()))
    #: Mean seconds per recent step, and the part of it spent waiting for input (``None``: unknown; between
    #: nodes, :meth:`input_wait`, since ``extra`` stays on the worker's node).
    step_seconds: float | None = field(default=None, metadata=on_wire(StepSeconds()))
    input_seconds: float | None = field(default=None, metadata=on_wire(StepSeconds()))
    #: Process CPU seconds per recent step (a worker waiting in a collective spends little).
    cpu_seconds: float | None = field(default=None, metadata=on_wire(StepSeconds()))
    #: Seconds per recent step TensorFlow ran the user's ``tf.py_function``/``tf.numpy_function`` (in a
    #: ``dataset.map`` or in the step; not in ``input_seconds``), and the one seen most, ``file:line in name``.
    py_function_seconds: float | None = field(default=None, metadata=on_wire(StepSeconds()))
    py_function: str = field(default="", metadata=on_wire(Text(from_end=True)))
    #: Wall-clock time of the write.
    time: float = field(default=0.0, metadata=on_wire(WallClock()))
    extra: dict[str, object] = field(default_factory=dict, metadata=on_wire(Local(
        "the launcher's diagnosis sends the planned steps and the last weights of it beside the fields")))

    def input_wait(self) -> float | None:
        """Seconds a step spends waiting for its input (``input_seconds``, else the worker's ``outside_seconds``)."""
        if self.input_seconds is not None:
            return self.input_seconds
        value = self.extra.get("outside_seconds")
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def to_json(self) -> str:
        data = asdict(self)
        data["version"] = _VERSION
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Ledger | None:
        """The ledger in ``text``; ``None`` for another version or a malformed one."""
        try:
            data = json.loads(text)
            if data.pop("version", None) != _VERSION:
                return None
            data["end_of_data"] = tuple(tuple(pair) for pair in data.get("end_of_data", ()))
            data["functions"] = tuple(FunctionTrace(**trace) for trace in data.get("functions", ()))
            return cls(**data)
        except (ValueError, TypeError, AttributeError):
            return None


def write_ledger(path: str | os.PathLike[str], ledger: Ledger) -> None:
    """Replace ``path`` with ``ledger`` at once (a reader never sees half a file)."""
    target = Path(path)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    tmp.write_text(ledger.to_json())
    os.replace(tmp, target)


def read_ledger(path: str | os.PathLike[str]) -> Ledger | None:
    """The ledger in ``path``; ``None`` when there is none yet (or it is unreadable)."""
    try:
        return Ledger.from_json(Path(path).read_text())
    except OSError:
        return None
