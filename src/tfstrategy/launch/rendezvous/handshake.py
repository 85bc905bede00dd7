"""The rendezvous handshake's proofs, the session keys, and the sealing of every later line.

What they protect against is described in :mod:`.wire` (the protocol); the messages sealed here
are its typed messages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import TypeGuard

from tfstrategy.launch.rendezvous.wire import _HEX, PROTOCOL, Message, ProtocolError, parse_message

__all__ = ["is_nonce", "client_proof", "welcome_proof", "proof_matches", "session_keys", "Sealer", "Opener"]


def is_nonce(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and _HEX.fullmatch(value) is not None


def client_proof(secret: bytes, server_nonce: str, client_nonce: str, rank: int) -> str:
    return _mac(secret, f"{PROTOCOL}|client|{server_nonce}|{client_nonce}|{rank}".encode())


def welcome_proof(secret: bytes, server_nonce: str, client_nonce: str, rank: int, welcome: Mapping[str, object]) -> str:
    """The server's proof, over every field of its welcome (job identity, round, heartbeat) but the proof."""
    fields = json.dumps({k: v for k, v in welcome.items() if k != "proof"}, sort_keys=True, separators=(",", ":"))
    return _mac(secret, f"{PROTOCOL}|server|{server_nonce}|{client_nonce}|{rank}|{fields}".encode())


def proof_matches(given: object, expected: str) -> bool:
    """Constant-time comparison of a peer's proof (any JSON value) with the expected one."""
    return isinstance(given, str) and hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


def _mac(key: bytes, data: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def session_keys(secret: bytes, server_nonce: str, client_nonce: str, job_id: str, rank: int) -> tuple[bytes, bytes]:
    """``(client-to-server, server-to-client)`` keys of one connection (HKDF-SHA256 extract and expand)."""
    prk = hmac.new(f"{server_nonce}|{client_nonce}".encode(), secret, hashlib.sha256).digest()

    def expand(direction: str) -> bytes:
        info = f"{PROTOCOL}|session|{job_id}|{rank}|{direction}".encode()
        return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()

    return expand("client->server"), expand("server->client")


class Sealer:
    """Seals one direction's messages: job identity, next sequence number, MAC."""

    def __init__(self, key: bytes, job_id: str) -> None:
        self._key, self.job_id, self.seq = key, job_id, 0

    def seal(self, message: Message) -> bytes:
        payload = json.dumps({"job": self.job_id, "seq": self.seq, "type": message.kind, **dataclasses.asdict(message)},
                             separators=(",", ":")).encode()
        self.seq += 1
        return _mac(self._key, payload).encode() + b" " + payload + b"\n"


class Opener:
    """Checks the other direction's lines: MAC first, then job identity and sequence, then the message."""

    def __init__(self, key: bytes, job_id: str, messages: Mapping[str, type[Message]]) -> None:
        self._key, self.job_id, self.seq, self._messages = key, job_id, 0, messages

    def open(self, line: bytes) -> Message:
        """The message of ``line``.

        Raises:
            ProtocolError: it failed authentication, is out of sequence, or is not a valid message.
        """
        mac, _, payload = line.partition(b" ")
        if not hmac.compare_digest(mac, _mac(self._key, payload).encode()):
            raise ProtocolError("sent a message that failed authentication (altered or injected in transit, "
                                "or not from this connection)")
        try:
            data = json.loads(payload)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ProtocolError(f"sent an authentic line that is not a JSON object: {payload[:60]!r}")
        if data.pop("job", None) != self.job_id:
            raise ProtocolError(f"sent a message of another job; expected job {self.job_id}")
        seq = data.pop("seq", None)
        if seq != self.seq:
            raise ProtocolError(f"sent message number {seq}, expected {self.seq} (replayed, reordered or dropped "
                                "in transit)")
        self.seq += 1
        return parse_message(data, self._messages)
