"""A launcher's part in a multi-node job: the glue between the supervisor and the rendezvous.

:class:`MultiNode` is what :class:`~tfstrategy.launch.supervisor.Launcher` talks to when
``--nnodes`` > 1: on node 0 it also hosts the :class:`~tfstrategy.launch.rendezvous.RendezvousServer`;
on every node it speaks to that server through a :class:`~tfstrategy.launch.rendezvous.RendezvousClient`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tfstrategy.errors import LaunchError
from tfstrategy.launch import exposure, processes
from tfstrategy.launch.processes import WorkerFailure
from tfstrategy.launch.rendezvous import EventKind, JobEvent, NodeOptions, RendezvousClient, RendezvousServer
from tfstrategy.settings import ENV_LAUNCH_SECRET

__all__ = ["MultiNode", "failure_from_event", "describe_end", "secret_free_environment"]

if TYPE_CHECKING:
    from tfstrategy.launch.supervisor import LaunchOptions

#: Exit status when a node did not arrive in time (as for workers that do not join).
TIMEOUT_STATUS = 124


class MultiNode:
    """This launcher's seat in a job of several nodes.

    Args:
        options: the validated launch options (``options.nodes`` set).
        say: where messages go.
        interrupted: true once the launcher received SIGINT/SIGTERM.

    Raises:
        LaunchError: on node 0, the rendezvous cannot listen on ``--master``.
    """

    def __init__(self, options: LaunchOptions, *, say: Callable[[str], None], interrupted: Callable[[], bool]) -> None:
        node = _nodes_of(options)
        workers, restarts = options.num_workers, options.max_restarts
        self.node, self.say = node, say
        self.rank = node.node_rank
        self.first_worker = node.node_rank * workers
        self._server = None
        self._warned = False  # about TensorFlow's servers being reachable: once per launcher
        if node.node_rank == 0:
            self._server = RendezvousServer(node, workers_per_node=workers, max_restarts=restarts,
                                            timeout=options.join_timeout, say=say)
            say(f"node 0 hosts the rendezvous of {node.nnodes} nodes on {node.master}")
        self._client = RendezvousClient(node, workers_per_node=workers, max_restarts=restarts, interrupted=interrupted)

    @property
    def round(self) -> int:
        return self._client.round

    def connect(self, timeout: float | None) -> JobEvent | None:
        """Join node 0's rendezvous; the event that ended the job instead (node 0 not reachable in time)."""
        ended = self._client.connect(timeout)
        if ended is None and self._client.address:
            self.say(f"node {self.rank} of {self.node.nnodes} joined the rendezvous at {self.node.master}; "
                     f"its workers are reached at {self._client.address}")
        return ended

    def free_ports(self, count: int) -> list[int]:
        """Ports free on this node's advertised address (any address when it is not local, behind NAT)."""
        try:
            return processes.free_ports(count, self._client.address)
        except OSError:
            return processes.free_ports(count, "")

    def form(self, attempt: int, ports: list[int]) -> JobEvent | None:
        formed = self._client.form(attempt, ports)
        if formed is not None and formed.kind is EventKind.CLUSTER and not self._warned:
            warning = exposure.exposure_warning(ports, exposure.network_interfaces())
            self._warned = True
            if warning:
                self.say(warning)
        return formed

    def poll(self) -> JobEvent | None:
        event = self._client.poll()
        return None if event is not None and event.kind is EventKind.CLUSTER else event

    def finish(self, attempt: int) -> JobEvent | None:
        return self._client.finish(attempt)

    def verdict(self, attempt: int, outcome: WorkerFailure | JobEvent | None) -> JobEvent | None:
        """Node 0's decision after a failure here (reported to it) or elsewhere (already its event)."""
        if isinstance(outcome, WorkerFailure):
            return self._client.report_failure(attempt, {
                "worker": outcome.index, "reason": outcome.reason, "status": outcome.status,
                "lines": list(outcome.last_lines),
            })
        return outcome

    def request_stop(self, signum: int) -> None:
        self._client.request_stop(signum)

    def close(self, grace: float) -> None:
        """Leave the job; node 0 first lets the other nodes hear its last word and leave."""
        if self._server is not None:
            self._server.wait_for_nodes_to_leave(grace + 5.0)
        self._client.close()
        if self._server is not None:
            self._server.close()


def failure_from_event(event: JobEvent) -> WorkerFailure:
    """The failure node 0 relayed, as this launcher reports it."""
    data = event.data
    worker = data.get("worker")
    return WorkerFailure(index=None if worker is None else int(worker), node=int(data.get("node", -1)),
                         reason=str(data.get("reason", "failed")), status=int(data.get("status", 1)),
                         last_lines=tuple(str(line) for line in data.get("lines", ())))


def _nodes_of(options: LaunchOptions) -> NodeOptions:
    if options.nodes is None:
        raise LaunchError("Received launch options without --nnodes; expected a multi-node job here.")
    return options.nodes


def describe_end(event: JobEvent | None, options: LaunchOptions) -> tuple[int, str]:
    """Exit status and message of a job ended by ``event`` (a node missing, node 0 lost)."""
    node, timeout = _nodes_of(options), options.join_timeout
    if event is not None and event.kind is EventKind.TIMEOUT:
        missing = ", ".join(str(rank) for rank in event.data.get("missing", ()))
        if event.data.get("unreachable"):
            return TIMEOUT_STATUS, (
                f"could not reach node 0's rendezvous at {node.master} within --timeout {timeout or 0:g} s "
                f"({event.data['unreachable']}): node rank 0 is missing. Start 'tfstrategy launch --node-rank 0 ...' "
                f"on the machine {node.master_host} with the same --master, or let this machine reach that port "
                "(firewall)")
        arrived = ", ".join(f"node {rank} from {address}" for rank, address in event.data.get("arrived", {}).items())
        return TIMEOUT_STATUS, (
            f"node rank(s) {missing} did not arrive at the rendezvous on {node.master} within --timeout {timeout or 0:g} s "
            f"(arrived: {arrived or 'none'}). Start 'tfstrategy launch --nnodes {node.nnodes} --node-rank {missing} "
            f"--master {node.master} ...' on that machine with the same secret, check that it can reach "
            f"{node.master}, or raise --timeout")
    if event is not None and event.kind is EventKind.FAILED:  # e.g. a node broke the protocol while a round formed
        failure = failure_from_event(event)
        return failure.status, failure.report()
    if event is not None and event.kind is EventKind.LOST:
        why = event.data.get("why") or "node 0's launcher stopped, or the network between the nodes failed"
        return 1, f"lost the connection to node 0's rendezvous at {node.master} ({why}); stopped this node's workers"
    return 1, "the job ended before this node's workers started"


def secret_free_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the launch secret: workers never need it."""
    return {key: value for key, value in env.items() if key != ENV_LAUNCH_SECRET}
