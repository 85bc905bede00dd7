"""The rules of node 0's rounds, pure: where the job stands, when a round forms, whether a node may leave.

:class:`~tfstrategy.launch.rendezvous.server.RendezvousServer` holds the state and the connections and asks
these under its lock; they read only what they are given, so they are tested without sockets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from enum import Enum

from tfstrategy.launch.rendezvous.options import NodeOptions

__all__ = ["JobState", "job_shape", "refusal", "ready_to_form", "may_leave", "cluster_workers"]


class JobState(str, Enum):
    """Where the job stands, as node 0's rendezvous sees it."""

    FORMING = "forming"  # waiting for every node's join of the current round
    RUNNING = "running"  # the cluster was sent; workers run
    ENDED = "ended"  # finished, given up, stopped, aborted or timed out: no new round


def job_shape(job: object) -> str:
    """A job's options as its launcher's flags say them, for a refusal naming the difference."""
    if not isinstance(job, dict):
        return repr(job)[:100]
    return f"--nnodes {job.get('nnodes')} -n {job.get('workers_per_node')} --max-restarts {job.get('max_restarts')}"


def refusal(node: NodeOptions, job: Mapping[str, object], offered: object, claimed: int, *, taken_by: str | None,
            ended: bool) -> str | None:
    """Why node 0 refuses a launcher that proved the secret, offering job options ``offered`` and rank ``claimed``
    (``taken_by``: the address of the node holding that rank; ``ended``: the job ended and a late node is not told
    how), or ``None`` to welcome it."""
    if offered != job:
        return (f"it runs {job_shape(offered)}; node 0 runs {job_shape(job)}. Use the same --nnodes, -n and "
                "--max-restarts on every node")
    if not 0 <= claimed < node.nnodes:
        return f"expected a rank 0..{node.nnodes - 1}"
    if taken_by is not None:
        return f"rank {claimed} is taken by the node at {taken_by}. Give each machine its own --node-rank 0..{node.nnodes - 1}"
    return "the job has ended" if ended else None


def ready_to_form(node: NodeOptions, joined: Set[int], connected: Set[int], leaving: Set[int], *, first_round: bool,
                  waited: float, late: bool) -> bool:
    """Whether a round forms with the nodes that ``joined``: every node did; or, elastic, at least MIN did and no node
    still connected (and not leaving) is on its way; the first round also waits ``rendezvous_wait`` for more nodes,
    and at the deadline (``late``) the MIN or more that joined form it."""
    if len(joined) == node.nnodes:
        return True
    if not node.elastic or len(joined) < node.fewest:
        return False
    return late or (joined >= connected - leaving and (not first_round or waited >= node.rendezvous_wait))


def may_leave(node: NodeOptions, rank: int, connected: Set[int], leaving: Set[int]) -> bool:
    """Whether node ``rank`` may leave an elastic job and the others go on (else its leave stops the job)."""
    return node.elastic and rank != 0 and len(connected - leaving - {rank}) >= node.fewest


def cluster_workers(joins: Mapping[int, tuple[str, list[int]]], members: Sequence[int]) -> list[str]:
    """Every worker's ``host:port`` of a round, node by node in ``members``' order (``[v6]:port`` for IPv6)."""
    return [f"{f'[{address}]' if ':' in address else address}:{port}"
            for rank in members for address, ports in [joins[rank]] for port in ports]
