"""Wait, with a bound, for the other tasks of a ``TF_CONFIG`` cluster to start.

MultiWorkerMirroredStrategy's constructor returns only once every task has
connected, and while it waits TensorFlow's preemption notifier holds SIGTERM
(measured on TF 2.21: a ``tfstrategy check`` whose peer never started waited
forever and ignored SIGTERM). :func:`wait_for_peers` does the waiting in
Python first, where a deadline and SIGTERM both work, and names each task that
never came up.

Each waiting task listens on its own ``TF_CONFIG`` port until its peers are
seen, so two tasks waiting for each other both get through; the listener closes
before TensorFlow starts its server on that port. A peer that creates its
strategy without waiting is seen once TensorFlow's server listens.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from tfstrategy.errors import PeerTimeoutError
from tfstrategy.multiworker.cluster import TRAINING_TASK_TYPES, ClusterConfig, parse_address

__all__ = ["wait_for_peers"]


def peer_addresses(config: ClusterConfig) -> dict[str, str]:
    """The other training tasks, ``{"worker-1": "host:port", ...}``."""
    return {
        f"{role}-{index}": address
        for role in TRAINING_TASK_TYPES
        for index, address in enumerate(config.cluster.get(role, ()))
        if (role, index) != (config.task_type, config.task_index)
    }


def _accepts(address: str, timeout: float = 0.5) -> bool:
    host, port = parse_address(address, "address")
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _listen(address: str) -> socket.socket | None:
    """Listen on this task's port so waiting peers see it; ``None`` if the port is taken."""
    _, port = parse_address(address, "address")
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, reuse_port=False)
        return socket.create_server(("", port))
    except OSError:
        return None


def wait_for_peers(
    config: ClusterConfig,
    timeout: float,
    *,
    poll: float = 0.25,
    progress: Callable[[str], None] | None = None,
) -> None:
    """Return once every other training task accepts connections on its ``TF_CONFIG`` address.

    Args:
        config: this task's validated cluster.
        timeout: seconds to wait in all.
        poll: seconds between rounds of connection attempts.
        progress: called once with a line saying what is awaited, if any peer is not up at once.

    Raises:
        PeerTimeoutError: some tasks did not start within ``timeout``; the message names each.
    """
    if config.task_type not in TRAINING_TASK_TYPES:
        return
    missing = peer_addresses(config)
    deadline = time.monotonic() + timeout
    listener = _listen(config.address)
    told = False
    try:
        while True:
            missing = {name: address for name, address in missing.items() if not _accepts(address)}
            if not missing:
                return
            if time.monotonic() >= deadline:
                names = ", ".join(f"{name} at {address}" for name, address in missing.items())
                raise PeerTimeoutError(
                    f"Received TF_CONFIG for {config.num_workers} training tasks, as {config.task_name}; {names} did "
                    f"not start within {timeout:g} s (nothing accepted connections there). Start the same command "
                    "on every task of the cluster (or use `tfstrategy launch -n N` on one machine), check the "
                    "addresses and firewalls, or raise --join-timeout."
                )
            if progress is not None and not told:
                progress(f"waiting up to {timeout:g} s for {', '.join(f'{n} at {a}' for n, a in missing.items())}")
                told = True
            time.sleep(poll)
    finally:
        if listener is not None:
            listener.close()
