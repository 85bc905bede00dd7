"""What a record's field may carry between nodes, declared on the field itself (``--nnodes``).

A launcher sends node 0 its workers' ledgers (:mod:`tfstrategy.contract.ledger`) inside their views, and
node 0 checks every field it receives. Both ends follow one declaration: each field of the record names
its bound in its metadata (``field(default=0, metadata=on_wire(Count()))``); the sender cuts a value to
it (:func:`to_wire`: a worker's file may hold anything), the receiver rebuilds the record
(:func:`from_wire`), and the rendezvous derives its checks from it
(:func:`tfstrategy.launch.rendezvous.wire.record_check`). A new field therefore crosses the wire with no
edit outside its declaration, and a field that declares no bound fails where the rendezvous is imported.

Pure values; nothing here imports TensorFlow or another module of tfstrategy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "COUNT", "TEXT", "STEP_SECONDS", "WALL", "Count", "Text", "StepSeconds", "WallClock", "Last", "Pair", "Nested",
    "Local", "Bound", "on_wire", "sent_fields", "to_wire", "from_wire", "finite",
]

#: The largest count a record carries (steps, batches, an epoch).
COUNT = 1 << 40
#: The most characters of a text by default (a frame, a summary, a weight's name).
TEXT = 300
#: The most seconds per step a record carries.
STEP_SECONDS = 1e6
#: The latest wall-clock second a record carries (the year 5138).
WALL = 1e11

#: The key of a field's metadata that holds its bound.
_BOUND = "tfstrategy.wire"

_Record = TypeVar("_Record")


@dataclass(frozen=True)
class Count:
    """An integer ``low``..:data:`COUNT` (or ``None`` when ``optional``); the sender moves one outside into it."""

    low: int = 0
    optional: bool = False


@dataclass(frozen=True)
class Text:
    """At most ``limit`` characters; the sender keeps the first ones, or the last when ``from_end`` (a place's
    ``file:line in name``, whose end says most)."""

    limit: int = TEXT
    from_end: bool = False


@dataclass(frozen=True)
class StepSeconds:
    """Seconds per step: unknown (``None``) or 0..:data:`STEP_SECONDS`; the sender sends an odd value as unknown."""


@dataclass(frozen=True)
class WallClock:
    """Seconds since the epoch, 0..:data:`WALL`; the sender sends an odd value as 0."""


@dataclass(frozen=True)
class Last:
    """A list of at most ``limit`` items, each within ``item``; the sender keeps the newest (the last ones)."""

    limit: int
    item: Bound


@dataclass(frozen=True)
class Pair:
    """Two values, within ``first`` and ``second``."""

    first: Bound
    second: Bound


@dataclass(frozen=True)
class Nested:
    """One record of ``record``, a dataclass whose fields declare their own bounds."""

    record: type[Any]


@dataclass(frozen=True)
class Local:
    """Not sent: the field stays on the worker's node (``why``: what stands in for it, if anything)."""

    why: str


Bound = Count | Text | StepSeconds | WallClock | Last | Pair | Nested | Local


def on_wire(bound: Bound) -> dict[str, Bound]:
    """A field's metadata declaring ``bound``: ``field(default=0, metadata=on_wire(Count()))``."""
    return {_BOUND: bound}


def sent_fields(record: type[Any]) -> tuple[tuple[str, Bound], ...]:
    """``(name, bound)`` of each field of the dataclass ``record`` that crosses the wire (not :class:`Local`).

    Raises:
        TypeError: a field declares no bound.
    """
    found = []
    for item in dataclasses.fields(record):
        bound = item.metadata.get(_BOUND)
        if bound is None:
            raise TypeError(
                f"Received {record.__name__}.{item.name} with no bound on the wire; expected every field of a record "
                f"sent between nodes to declare one. Declare it: field(..., metadata=on_wire(Count())) or, to keep "
                f"it on the worker's node, on_wire(Local('why')) (tfstrategy.contract.bounds).")
        if not isinstance(bound, Local):
            found.append((item.name, bound))
    return tuple(found)


def finite(value: object, high: float) -> float | None:
    """``value`` as a float when it is a finite number 0..``high`` (a worker's file may hold anything), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if 0 <= value <= high else None


def to_wire(record: object) -> dict[str, object]:
    """The fields of ``record`` (a dataclass instance) that cross the wire, each cut to its bound, as JSON values."""
    return {name: _cut(bound, getattr(record, name)) for name, bound in sent_fields(type(record))}


def _cut(bound: Bound, value: Any) -> object:
    if isinstance(bound, Count):
        return None if value is None and bound.optional else min(max(value, bound.low), COUNT)
    if isinstance(bound, Text):
        return value[-bound.limit:] if bound.from_end else value[:bound.limit]
    if isinstance(bound, StepSeconds):
        return finite(value, STEP_SECONDS)
    if isinstance(bound, WallClock):
        return finite(value, WALL) or 0.0
    if isinstance(bound, Last):
        return [_cut(bound.item, item) for item in value][-bound.limit:]
    if isinstance(bound, Pair):
        first, second = value
        return [_cut(bound.first, first), _cut(bound.second, second)]
    if isinstance(bound, Nested):
        return to_wire(value)
    raise TypeError(f"Received {bound!r} inside another bound; expected a bound that is sent (a Local field is not)")


def from_wire(record: type[_Record], data: Mapping[str, Any], **local: object) -> _Record:
    """The ``record`` that :func:`to_wire` sent as ``data`` (checked on receipt), with its :class:`Local` fields
    from ``local`` (the rest take their defaults)."""
    sent = {name: _rebuild(bound, data[name]) for name, bound in sent_fields(record)}
    return record(**sent, **local)


def _rebuild(bound: Bound, value: Any) -> object:
    if isinstance(bound, Last):
        return tuple(_rebuild(bound.item, item) for item in value)
    if isinstance(bound, Pair):
        first, second = value
        return (_rebuild(bound.first, first), _rebuild(bound.second, second))
    if isinstance(bound, Nested):
        return from_wire(bound.record, value)
    return value
