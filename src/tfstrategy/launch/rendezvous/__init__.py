"""The rendezvous of ``tfstrategy launch --nnodes N``: who is in the job, and its control channel.

Node 0's launcher hosts a small TCP server on ``--master HOST:PORT``
(:class:`RendezvousServer`). Every launcher (node 0's too, over the same protocol) connects to it
(:class:`RendezvousClient`), proves that it knows the shared secret, and then, for each attempt
("round") of the job, sends its reachable address and its workers' free ports and receives the
whole cluster, from which it builds its workers' ``TF_CONFIG``. The connection stays open while
the job runs: it is the control channel through which node 0 relays the first failure and
whether the group restarts, a stop (Ctrl-C on any node), the ranks missing at the deadline, and
the end of the job.

Modules: :mod:`.options` (a node's place and the secret), :mod:`.wire` (lines and the typed,
checked messages), :mod:`.handshake` (proofs, session keys, sealed lines), :mod:`.channel` (one authenticated connection, sends from a queue),
:mod:`.admission` (the bounds before a proof), :mod:`.rounds` (when a round forms, who may leave: pure),
:mod:`.server` and :mod:`.client`. The security model is in ``docs/guides/clusters.md``.
"""

from tfstrategy.launch.rendezvous.client import HANDSHAKE_SECONDS, EventKind, JobEvent, RendezvousClient
from tfstrategy.launch.rendezvous.options import (
    MIN_SECRET_BYTES,
    NodeOptions,
    ServerLimits,
    parse_master,
    read_secret,
    validate_node_options,
)
from tfstrategy.launch.rendezvous.rounds import JobState
from tfstrategy.launch.rendezvous.server import RendezvousServer
from tfstrategy.launch.rendezvous.wire import PROTOCOL

__all__ = [
    "NodeOptions", "parse_master", "read_secret", "validate_node_options", "MIN_SECRET_BYTES", "RendezvousServer",
    "ServerLimits", "JobState", "EventKind", "JobEvent", "RendezvousClient", "HANDSHAKE_SECONDS", "PROTOCOL",
]
