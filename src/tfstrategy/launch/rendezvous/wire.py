"""The rendezvous protocol on the wire: lines, the handshake's shape and the typed, checked messages.

The proofs, the session keys and the sealing of each line are in :mod:`.handshake`.

One JSON object per line. The handshake is a mutual HMAC-SHA256 challenge-response over fresh
nonces, so the secret never crosses the network::

    server -> {"type": "challenge", "protocol": P, "nonce": S}
    client -> {"type": "hello", "rank": R, "job": {shape}, "nonce": C, "proof": HMAC(secret, client|S|C|R)}
    server -> {"type": "welcome", "job_id": J, "round": r, "heartbeat": h, "dead_after": d,
               "proof": HMAC(secret, server|S|C|R|welcome fields)}      or  {"type": "refused", "reason": ...}

Every later line, in both directions, is *sealed*: ``MAC PAYLOAD`` where ``PAYLOAD`` is the JSON
of the message plus the job's identity ``J`` and the sender's sequence number (0, 1, 2, ... per
direction), and ``MAC`` is HMAC-SHA256 of the payload's bytes under that direction's session key.
The keys are derived HKDF-style (RFC 5869 extract-then-expand, with :mod:`hmac`) from the secret,
both nonces, ``J`` and the rank, so they are fresh for every connection and differ per direction:
a line altered in transit, injected, taken from another connection or job, or sent back to its
sender fails the MAC; one replayed, reordered or dropped fails the sequence number (a dropped one
at the latest with the next heartbeat).

The payload is then parsed into one of the frozen message classes below, with every field
checked; anything else is a :class:`ProtocolError`. A worker's ledger inside a view is checked as
each of its fields declares (:func:`record_check`, from :mod:`tfstrategy.contract.bounds`); the checks of
every field are :mod:`.checks`'.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tfstrategy.contract.bounds import WALL
from tfstrategy.launch.rendezvous.checks import (
    DIAGNOSIS_LINES,
    FIELDS,
    LINE_CHARS,
    LINES,
    LOGS,
    OUTCOMES,
    PATH_CHARS,
    TEXT_LIMIT,
    VIEWS,
    ProtocolError,
    record_check,
)
from tfstrategy.launch.states import Outcome

__all__ = [
    "PROTOCOL", "ProtocolError", "LineReader", "Join", "Failed", "Done", "Stop", "Leave", "Abort", "Heartbeat", "Views", "Cluster", "Reform", "RoundFailed", "Stopped", "Timeout",
    "Finished", "Closing", "Message", "parse_message", "OUTCOMES", "record_check", "LINES", "LINE_CHARS",
    "DIAGNOSIS_LINES", "VIEWS",
]

PROTOCOL = "tfstrategy-rendezvous/8"
#: Longest line before authentication (a hello is ~300 bytes) and after it (a failure's last lines).
HANDSHAKE_LINE = 4096
MAX_LINE = 4 << 20
_HEX = re.compile(r"[0-9a-f]{16,128}")


# --- framing -------------------------------------------------------------------------------------


class LineReader:
    """Whole lines from a socket, each at most ``limit`` bytes, within a deadline or an idle time."""

    def __init__(self, sock: socket.socket, limit: int = HANDSHAKE_LINE) -> None:
        self.sock, self.limit = sock, limit
        self._buffer = bytearray()

    def read_line(self, *, deadline: float | None = None, idle: float | None = None) -> bytes | None:
        """The next line without its newline; ``None`` at the end of the stream.

        Raises:
            TimeoutError: the deadline passed, or nothing arrived for ``idle`` seconds.
            ProtocolError: a line longer than the limit.
            OSError: the connection failed.
        """
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[:end + 1]
                if len(line) > self.limit:
                    raise ProtocolError(f"sent a line of {len(line)} bytes; expected at most {self.limit}")
                return line
            if len(self._buffer) > self.limit:
                raise ProtocolError(f"sent more than {self.limit} bytes without a newline")
            wait = idle
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("deadline passed")
                wait = left if wait is None else min(wait, left)
            # The socket's timeout is only changed during the handshake (one thread then); afterwards
            # the channel sets it once, for sends and receives alike.
            if wait is not None and self.sock.gettimeout() != wait:
                self.sock.settimeout(wait)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError(f"nothing for {wait:g} s") from None
            if not data:
                return None
            self._buffer += data


def read_json(reader: LineReader, *, deadline: float) -> dict[str, Any] | None:
    """One handshake object; ``None`` at the end of the stream.

    Raises:
        ProtocolError: not a JSON object. TimeoutError, OSError: as :meth:`LineReader.read_line`.
    """
    line = reader.read_line(deadline=deadline)
    if line is None:
        return None
    try:
        value = json.loads(line)
    except ValueError:
        raise ProtocolError(f"sent {line[:60]!r}, which is not JSON") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"sent {line[:60]!r}; expected a JSON object")
    return value


def encode(message: Mapping[str, object]) -> bytes:
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


# --- messages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """A control message; ``kind`` is its ``type`` on the wire."""

    kind: ClassVar[str] = ""


@dataclass(frozen=True)
class Join(Message):
    """node -> node 0: this node's workers for ``round``."""

    kind: ClassVar[str] = "join"
    round: int
    address: str
    ports: list[int]


@dataclass(frozen=True)
class Failed(Message):
    """node -> node 0: a local worker failed in ``round``, whole: when (wall clock), why, whether it only
    echoes a failure elsewhere, how it ends the job (``outcome``), its last lines and log files, and the
    cause its workers' ledgers show (``diagnosis``: headline then evidence; empty if none), and what node 0
    needs to diagnose across nodes: each local worker's compact view (``views``:
    :func:`tfstrategy.launch.ledger_diagnosis.view_to_wire`)."""

    kind: ClassVar[str] = "failed"
    round: int
    worker: int | None
    reason: str
    status: int
    time: float
    consequential: bool
    outcome: str
    lines: list[str]
    logs: list[str]
    diagnosis: list[str]
    views: list[dict[str, object]] = dataclasses.field(default_factory=list)

    @classmethod
    def bounded(cls, *, round: int, worker: int | None, reason: str, status: int, time: float, consequential: bool,
                outcome: str, lines: tuple[str, ...] | list[str], logs: tuple[str, ...] | list[str],
                diagnosis: tuple[str, ...] | list[str] = (),
                views: tuple[dict[str, object], ...] | list[dict[str, object]] = ()) -> Failed:
        """A failure cut to what the wire carries (the newest lines, the first log files), so it never breaks the protocol."""
        return cls(round=round, worker=worker, reason=reason[:TEXT_LIMIT], status=min(max(status, 0), 1023),
                   time=time if math.isfinite(time) and 0 <= time <= WALL else 0.0, consequential=consequential,
                   outcome=outcome if outcome in OUTCOMES else Outcome.FAILED.value,
                   lines=[line[:LINE_CHARS] for line in lines][-LINES:], logs=[path[:PATH_CHARS] for path in logs][:LOGS],
                   diagnosis=[line[:LINE_CHARS] for line in diagnosis][:DIAGNOSIS_LINES], views=list(views)[:VIEWS])


@dataclass(frozen=True)
class Done(Message):
    kind: ClassVar[str] = "done"
    round: int


@dataclass(frozen=True)
class Stop(Message):
    """node -> node 0: this launcher received ``signal``; stop the job."""

    kind: ClassVar[str] = "stop"
    signal: int


@dataclass(frozen=True)
class Leave(Message):
    """node -> node 0 (``--nnodes MIN:MAX``): this launcher received ``signal`` (a scale-down, a preempted machine):
    re-form the others without it, at a step the workers agree on."""

    kind: ClassVar[str] = "leave"
    signal: int


@dataclass(frozen=True)
class Abort(Message):
    """node -> node 0: this node's end of the connection broke the protocol (why); end the job."""

    kind: ClassVar[str] = "abort"
    reason: str


@dataclass(frozen=True)
class Views(Message):
    """node -> node 0, every few seconds while a round runs: its workers' compact views (as in :class:`Failed`),
    so node 0 can diagnose across nodes when a node whose workers only wait reports no failure."""

    kind: ClassVar[str] = "views"
    round: int
    views: list[dict[str, object]]


@dataclass(frozen=True)
class Heartbeat(Message):
    kind: ClassVar[str] = "heartbeat"


@dataclass(frozen=True)
class Cluster(Message):
    """node 0 -> nodes: every worker's ``host:port`` for ``round``, and the ranks of the nodes in it (in that order)."""

    kind: ClassVar[str] = "cluster"
    round: int
    workers: list[str]
    nodes: list[int]


@dataclass(frozen=True)
class Reform(Message):
    """node 0 -> nodes (``--nnodes MIN:MAX``): the group re-forms as ``round`` with the nodes present; ``lost`` left,
    ``joined`` came; ``graceful``: stop the workers at a step they agree on (SIGTERM), not at once."""

    kind: ClassVar[str] = "reform"
    round: int
    lost: list[int]
    joined: list[int]
    nodes: list[int]
    graceful: bool
    reason: str


@dataclass(frozen=True)
class RoundFailed(Message):
    """node 0 -> nodes: the round's root cause (the earliest real failure any node reported, whole), and whether
    the group restarts."""

    kind: ClassVar[str] = "failed"
    round: int
    node: int
    worker: int | None
    reason: str
    status: int
    time: float
    consequential: bool
    outcome: str
    lines: list[str]
    logs: list[str]
    diagnosis: list[str]
    restart: bool

    @classmethod
    def of(cls, node: int, failed: Failed, *, restart: bool) -> RoundFailed:
        fields = {f.name: getattr(failed, f.name) for f in dataclasses.fields(Failed) if f.name != "views"}
        return cls(node=node, restart=restart, **fields)


@dataclass(frozen=True)
class Stopped(Message):
    """node 0 -> nodes: node ``node`` received ``signal``; stop."""

    kind: ClassVar[str] = "stop"
    node: int
    signal: int


@dataclass(frozen=True)
class Timeout(Message):
    kind: ClassVar[str] = "timeout"
    round: int
    missing: list[int]
    arrived: dict[str, str]


@dataclass(frozen=True)
class Finished(Message):
    kind: ClassVar[str] = "finished"
    round: int


@dataclass(frozen=True)
class Closing(Message):
    """node 0 -> node: node 0 closes this connection, and why."""

    kind: ClassVar[str] = "closing"
    reason: str


TO_SERVER: dict[str, type[Message]] = {m.kind: m for m in (Join, Failed, Done, Stop, Leave, Abort, Heartbeat, Views)}
TO_CLIENT: dict[str, type[Message]] = {m.kind: m for m in (Cluster, Reform, RoundFailed, Stopped, Timeout, Finished,
                                                           Closing, Heartbeat)}

def parse_message(data: Mapping[str, object], messages: Mapping[str, type[Message]]) -> Message:
    """The typed message of ``data`` (its ``type`` one of ``messages``), every field checked.

    Raises:
        ProtocolError: an unknown type, a missing or unexpected field, or a field of the wrong type or range.
    """
    kind = data.get("type")
    cls = messages.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"sent a message of type {str(kind)[:40]!r}; expected one of {', '.join(sorted(messages))}")
    names = [f.name for f in dataclasses.fields(cls)]
    extra = sorted(set(data) - set(names) - {"type"})
    missing = [name for name in names if name not in data]
    if extra or missing:
        raise ProtocolError(f"sent a {kind} message with fields {sorted(set(data) - {'type'})}; expected {names}")
    return cls(**{name: FIELDS[name](data[name], f"{kind}.{name}") for name in names})
