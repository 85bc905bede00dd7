"""Unauthenticated connections node 0 serves at once: bounded in all and per address, before any proof.

A flood from one host cannot keep the real nodes out: it runs into its per-address bound first.
"""

from __future__ import annotations

import collections
import threading

from tfstrategy.launch.rendezvous.options import ServerLimits

__all__ = ["PendingConnections"]


class PendingConnections:
    """The connections in their handshake, by the address they come from (thread-safe)."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._pending: collections.Counter[str] = collections.Counter()

    def admit(self, host: str) -> str | None:
        """Count a new connection from ``host``; why it is refused instead (the bounds it would pass), or ``None``."""
        limits = self.limits
        with self._lock:
            total, mine = sum(self._pending.values()), self._pending[host]
            if total < limits.max_pending and mine < limits.max_pending_per_host:
                self._pending[host] += 1
                return None
        return (f"too many unauthenticated connections ({mine} from it, {total} in all; at most "
                f"{limits.max_pending_per_host} per address and {limits.max_pending} in all)")

    def release(self, host: str) -> None:
        """A connection from ``host`` ended its handshake (admitted or not)."""
        with self._lock:
            self._pending[host] -= 1
            if self._pending[host] <= 0:
                del self._pending[host]
