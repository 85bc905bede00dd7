"""The checks of the rendezvous' message fields: each field's type and bounds, and ledgers as their fields declare.

A node's messages are checked field by field before anything reads them (:func:`.wire.parse_message`); what
a field may hold is here, with the limits a sender keeps to (a failure's last lines, its views). A worker's
ledger inside a view is checked as each of its fields declares (:func:`record_check`, from
:mod:`tfstrategy.contract.bounds`), so a new ledger field needs no edit here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from tfstrategy.contract.bounds import (
    COUNT,
    STEP_SECONDS,
    TEXT,
    WALL,
    Bound,
    Count,
    Last,
    Nested,
    Pair,
    StepSeconds,
    Text,
    WallClock,
    sent_fields,
)
from tfstrategy.contract.ledger import Ledger
from tfstrategy.launch.ledger_diagnosis import WIRE_WEIGHTS
from tfstrategy.launch.states import Outcome

__all__ = ["ProtocolError", "Check", "FIELDS", "record_check", "OUTCOMES", "LINES", "LINE_CHARS", "DIAGNOSIS_LINES",
           "VIEWS", "LOGS", "PATH_CHARS", "TEXT_LIMIT"]

_HOST = re.compile(r"[A-Za-z0-9._:%-]{1,253}")
_HOST_PORT = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,300}")


class ProtocolError(Exception):
    """A peer broke the protocol: what it sent, and what was expected (for the report naming the peer)."""


_ROUNDS = 1_000_000
TEXT_LIMIT = 10_000
#: A failure's last lines: at most this many, each at most LINE_CHARS characters.
LINES = 100
LINE_CHARS = 2_000
#: A failure's diagnosis: its headline and evidence, at most this many lines (each at most LINE_CHARS).
DIAGNOSIS_LINES = 20
#: A failure's worker views (node -> node 0): at most this many workers.
VIEWS = 64
#: A failure's log files: at most this many paths, each at most this long.
LOGS = 4
PATH_CHARS = 4096
#: How a failure ends the job (the :class:`~tfstrategy.launch.states.Outcome` values a failure can have).
OUTCOMES = tuple(outcome.value for outcome in (Outcome.FAILED, Outcome.JOIN_TIMEOUT, Outcome.STALLED,
                                                Outcome.PREEMPTED, Outcome.STOPPED))

#: A field check: the value (of the type the message declares) or :class:`ProtocolError`.
Check = Callable[[object, str], Any]


def _int(low: int, high: int, *, optional: bool = False) -> Check:
    def check(value: object, where: str) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ProtocolError(f"{where} is {value!r}; expected an integer {low}..{high}")
        return value
    return check


def _seconds(value: object, where: str) -> float:
    """A wall-clock second: a finite number 0..``WALL`` (JSON has no separate integers and floats)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                               and 0 <= value <= WALL):
        raise ProtocolError(f"{where} is {str(value)[:60]!r}; expected seconds since the epoch, 0..{WALL:.0f}")
    return float(value)


def _text(limit: int = TEXT_LIMIT, pattern: re.Pattern[str] | None = None, choices: tuple[str, ...] = ()) -> Check:
    def check(value: object, where: str) -> str:
        if (not isinstance(value, str) or len(value) > limit or (pattern and not pattern.fullmatch(value))
                or (choices and value not in choices)):
            expected = (f"one of {', '.join(choices)}" if choices else
                        f"{'a host' if pattern else 'text'} of at most {limit} characters")
            raise ProtocolError(f"{where} is {str(value)[:60]!r}; expected {expected}")
        return value
    return check


def _list(item: Check, limit: int) -> Check:
    def check(value: object, where: str) -> list[object]:
        if not isinstance(value, list) or len(value) > limit:
            raise ProtocolError(f"{where} is {str(value)[:60]!r}; expected a list of at most {limit} items")
        return [item(entry, f"{where}[{index}]") for index, entry in enumerate(value)]
    return check


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"{where} is {value!r}; expected true or false")
    return value


def _addresses(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > 10_000:
        raise ProtocolError(f"{where} is {str(value)[:60]!r}; expected an object of rank: address")
    host = _text(253, _HOST)
    return {_text(7)(rank, f"{where} key"): host(address, f"{where}[{rank}]") for rank, address in value.items()}


def _optional(check: Check) -> Check:
    def optional(value: object, where: str) -> object:
        return None if value is None else check(value, where)
    return optional


def _record(checks: Mapping[str, Check]) -> Check:
    """An object with exactly the keys of ``checks``, each checked."""
    def check(value: object, where: str) -> dict[str, object]:
        if not isinstance(value, dict) or set(value) != set(checks):
            keys = sorted(value) if isinstance(value, dict) else str(value)[:60]
            raise ProtocolError(f"{where} is {keys!r}; expected an object of {sorted(checks)}")
        return {key: item(value[key], f"{where}.{key}") for key, item in checks.items()}
    return check


def _pair(first: Check, second: Check) -> Check:
    def check(value: object, where: str) -> list[object]:
        if not isinstance(value, list) or len(value) != 2:
            raise ProtocolError(f"{where} is {str(value)[:60]!r}; expected a pair")
        return [first(value[0], f"{where}[0]"), second(value[1], f"{where}[1]")]
    return check


def _triple(first: Check, second: Check, third: Check) -> Check:
    def check(value: object, where: str) -> list[object]:
        if not isinstance(value, list) or len(value) != 3:
            raise ProtocolError(f"{where} is {str(value)[:60]!r}; expected a list of 3")
        return [first(value[0], f"{where}[0]"), second(value[1], f"{where}[1]"), third(value[2], f"{where}[2]")]
    return check


def _step_seconds(value: object, where: str) -> float | None:
    """Seconds per step as a ledger times them: unknown (``null``), or a finite number 0..``STEP_SECONDS``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)
                                                                               and 0 <= value <= STEP_SECONDS):
        raise ProtocolError(f"{where} is {str(value)[:60]!r}; expected null or seconds per step, 0..{STEP_SECONDS:g}")
    return float(value)


def _bound_check(bound: Bound) -> Check:
    """The check of a value declared within ``bound`` (:mod:`tfstrategy.contract.bounds`)."""
    if isinstance(bound, Count):
        return _int(bound.low, COUNT, optional=bound.optional)
    if isinstance(bound, Text):
        return _text(bound.limit)
    if isinstance(bound, StepSeconds):
        return _step_seconds
    if isinstance(bound, WallClock):
        return _seconds
    if isinstance(bound, Last):
        return _list(_bound_check(bound.item), bound.limit)
    if isinstance(bound, Pair):
        return _pair(_bound_check(bound.first), _bound_check(bound.second))
    if isinstance(bound, Nested):
        return record_check(bound.record)
    raise TypeError(f"Received {bound!r} inside another bound; expected a bound that is sent (a Local field is not)")


def record_check(record: type[Any], **beside: Check) -> Check:
    """The check of a dataclass ``record`` as :func:`tfstrategy.contract.bounds.to_wire` sends it: exactly the
    fields it sends, each within the bound it declares, and the keys ``beside`` (what a sender adds to it)."""
    return _record({**{name: _bound_check(bound) for name, bound in sent_fields(record)}, **beside})


_COUNTER = _int(0, COUNT)
#: A worker's ledger in its view: the fields as :class:`~tfstrategy.contract.ledger.Ledger` declares them, and
#: the planned steps and the last weights that :func:`tfstrategy.launch.ledger_diagnosis.view_to_wire` adds.
_LEDGER_VIEW = record_check(
    Ledger, epoch_steps=_int(1, COUNT, optional=True),
    weights=_list(_triple(_COUNTER, _text(TEXT), _text(TEXT)), WIRE_WEIGHTS))
#: One worker's view as a node sends it (:func:`tfstrategy.launch.ledger_diagnosis.view_to_wire`).
_WORKER_VIEW = _record({
    "index": _int(0, 1 << 20), "steps": _int(-1, COUNT), "in_step": _bool, "returncode": _int(-64, 1023, optional=True),
    "joined": _bool, "joining": _bool, "stopped": _bool, "error_type": _optional(_text(TEXT)),
    "ledger": _optional(_LEDGER_VIEW),
})

#: The check of each field a message may have, by its name (:func:`tfstrategy.launch.rendezvous.wire.parse_message`).
FIELDS: dict[str, Check] = {
    "round": _int(0, _ROUNDS), "address": _text(253, _HOST), "ports": _list(_int(1, 65535), 4096),
    "worker": _int(0, 1 << 20, optional=True), "reason": _text(), "status": _int(0, 1023),
    "time": _seconds, "consequential": _bool, "outcome": _text(20, choices=OUTCOMES),
    "lines": _list(_text(LINE_CHARS), LINES), "logs": _list(_text(PATH_CHARS), LOGS), "signal": _int(1, 64),
    "workers": _list(_text(300, _HOST_PORT), 1 << 16), "node": _int(0, 1 << 16), "restart": _bool,
    "missing": _list(_int(0, 1 << 16), 1 << 16), "arrived": _addresses,
    "diagnosis": _list(_text(LINE_CHARS), DIAGNOSIS_LINES), "views": _list(_WORKER_VIEW, VIEWS),
    "nodes": _list(_int(0, 1 << 16), 1 << 16), "lost": _list(_int(0, 1 << 16), 1 << 16),
    "joined": _list(_int(0, 1 << 16), 1 << 16), "graceful": _bool,
}
