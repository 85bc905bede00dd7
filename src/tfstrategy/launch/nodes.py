"""A launcher's part in a multi-node job: the :class:`~tfstrategy.launch.coordinator.Coordinator` of ``--nnodes``.

:class:`RendezvousCoordinator` is what :class:`~tfstrategy.launch.supervisor.Launcher` talks to when
``--nnodes`` > 1: on node 0 it also hosts the :class:`~tfstrategy.launch.rendezvous.RendezvousServer`;
on every node it speaks to that server through a :class:`~tfstrategy.launch.rendezvous.RendezvousClient`,
and turns node 0's messages into the supervisor's :class:`~tfstrategy.launch.coordinator.Event`.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tfstrategy.errors import LaunchError
from tfstrategy.launch import exposure, processes
from tfstrategy.launch.coordinator import Cluster, Event, Reformation, Vacancy
from tfstrategy.launch.rendezvous import EventKind, JobEvent, NodeOptions, RendezvousClient, RendezvousServer
from tfstrategy.launch.rendezvous.wire import VIEWS, Failed, RoundFailed, Views
from tfstrategy.launch.states import Failure, Outcome
from tfstrategy.settings import ENV_LAUNCH_SECRET

__all__ = ["RendezvousCoordinator", "failure_from_event", "describe_end", "secret_free_environment"]

if TYPE_CHECKING:
    from tfstrategy.launch.options import LaunchOptions

class RendezvousCoordinator:
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
        self.options, self.node, self.say = options, node, say
        self._rank = node.node_rank
        self.first_worker = node.node_rank * workers
        self._server = None
        self._warned = False  # about TensorFlow's servers being reachable: once per launcher
        if node.node_rank == 0:
            self._server = RendezvousServer(node, workers_per_node=workers, max_restarts=restarts,
                                            timeout=options.join_timeout, say=say)
            say(f"node 0 hosts the rendezvous of {node.nnodes} nodes on {node.master}")
        self._client = RendezvousClient(node, workers_per_node=workers, max_restarts=restarts, interrupted=interrupted)

    @property
    def rank(self) -> int | None:
        return self._rank

    @property
    def round(self) -> int:
        return self._client.round

    def connect(self) -> Event | None:
        """Join node 0's rendezvous; the event that ended the job instead (node 0 not reachable in time)."""
        ended = self._client.connect(self.options.join_timeout)
        if ended is not None:
            return self._event(ended)
        if self._client.address:
            self.say(f"node {self.node.node_rank} of {self.node.nnodes} joined the rendezvous at {self.node.master}; "
                     f"its workers are reached at {self._client.address}")
        return None

    def ports(self, count: int) -> list[int]:
        """Ports free on this node's advertised address (any address when it is not local, behind NAT)."""
        port_range = self.options.port_range
        try:
            return processes.free_ports(count, self._client.address, port_range)
        except OSError:
            return processes.free_ports(count, "", port_range)

    def form(self, attempt: int, ports: list[int]) -> Cluster | Event:
        formed = self._client.form(attempt, ports)
        if formed is not None and formed.kind is EventKind.CLUSTER:
            if not self._warned:  # TensorFlow's servers reachable from other hosts: once per launcher
                warning = exposure.exposure_warning(ports, exposure.network_interfaces())
                self._warned = True
                if warning:
                    self.say(warning)
            members = [int(rank) for rank in formed.data["nodes"]]
            if self._rank not in members:  # formed at the deadline without this node (elastic)
                return Event(outcome=Outcome.JOIN_TIMEOUT, message=(
                    f"node 0 formed round {formed.round} at --timeout without node {self._rank} (nodes "
                    f"{', '.join(map(str, members))}); restart this node's launcher to join the job again"))
            self.first_worker = members.index(self._rank) * self.options.num_workers
            return Cluster(tuple(str(a) for a in formed.data["workers"]), self.first_worker)
        return self._event(formed)

    def poll(self) -> Event | None:
        event = self._client.poll()
        if event is None or event.kind is EventKind.CLUSTER:
            return None
        return self._event(event)

    def share(self, attempt: int, views: tuple[dict[str, Any], ...]) -> None:
        """Send node 0 this node's workers' compact views, so it can diagnose across nodes."""
        self._client.share_views(Views(round=attempt, views=list(views)[:VIEWS]))

    def remote_views(self, attempt: int) -> tuple[dict[str, Any], ...] | None:
        """On node 0, the other nodes' latest views of ``attempt``'s workers; ``None`` on another node."""
        if self._server is None:
            return None
        shared = self._server.latest_views(attempt)
        return tuple(view for rank, views in sorted(shared.items()) if rank != self._rank for view in views)

    def decide(self, attempt: int, failure: Failure) -> Event:
        """Node 0's decision after a failure here: the round's root cause (maybe another node's), restart or not."""
        return self._event(self._client.report_failure(failure_to_message(attempt, failure)))

    def vacancy(self, attempt: int) -> Vacancy | None:
        """None: a node's workers are not replaced one by one; a node that starts again joins the rendezvous."""
        return None

    def take(self, vacancy: Vacancy) -> Event:
        raise RuntimeError("a job of several nodes has no vacancy to take (vacancy() is always None)")

    def finish(self, attempt: int) -> Event:
        return self._event(self._client.finish(attempt))

    def stop(self, signum: int) -> None:
        self._client.request_stop(signum)

    def leave(self, signum: int) -> bool:
        """Leave an elastic job (``--nnodes MIN:MAX``, not node 0): whether the others re-form without this node."""
        if not self.node.elastic or self._rank == 0:
            return False
        answer = self._client.request_leave(signum, timeout=30.0)
        return answer is not None and answer.kind is EventKind.REFORM

    def close(self, grace: float) -> None:
        """Leave the job; node 0 first lets the other nodes hear its last word and leave."""
        if self._server is not None:
            self._server.wait_for_nodes_to_leave(grace + 5.0)
        self._client.close()
        if self._server is not None:
            self._server.close()

    def _event(self, event: JobEvent | None) -> Event:
        if event is None:  # interrupted while waiting: the supervisor handles its own signal
            return Event(outcome=Outcome.INTERRUPTED)
        if event.kind is EventKind.FINISHED:
            return Event(outcome=Outcome.SUCCEEDED)
        if event.kind is EventKind.REFORM:
            data = event.data
            return Event(outcome=Outcome.INTERRUPTED, reform=Reformation(
                round=int(data["round"]), nodes=tuple(data["nodes"]), lost=tuple(data["lost"]),
                joined=tuple(data["joined"]), graceful=bool(data["graceful"]), reason=str(data["reason"])))
        if event.kind is EventKind.FAILED:
            return Event.failed(failure_from_event(event), restart=bool(event.data.get("restart")))
        if event.kind is EventKind.STOP:
            signum = int(event.data.get("signal") or signal.SIGTERM)
            node = event.data.get("node")
            return Event(outcome=Outcome.INTERRUPTED, signum=signum, node=None if node is None else int(node))
        outcome, message = describe_end(event, self.options)
        return Event(outcome=outcome, message=message)


def failure_to_message(attempt: int, failure: Failure) -> Failed:
    """A failure as this node reports it to node 0: whole (time, cause, consequential, outcome, lines, logs,
    diagnosis)."""
    return Failed.bounded(round=attempt, worker=failure.index, reason=failure.reason, status=failure.status,
                          time=failure.time, consequential=failure.consequential, outcome=failure.outcome.value,
                          lines=failure.last_lines, logs=failure.logs, diagnosis=failure.diagnosis,
                          views=failure.views)


def failure_from_event(event: JobEvent) -> Failure:
    """The root cause node 0 relayed, as this launcher reports it (every field as its node sent it).

    Raises:
        LaunchError: ``event`` is not node 0's failure message (a bug: the wire checked its type).
    """
    message = event.message
    if not isinstance(message, RoundFailed):
        raise LaunchError(f"Received a {event.kind.value} event without node 0's failure message; expected one "
                          "(a bug in tfstrategy's rendezvous: please report it).")
    return Failure(index=message.worker, node=message.node, reason=message.reason, status=message.status,
                   last_lines=tuple(message.lines), time=message.time, consequential=message.consequential,
                   outcome=Outcome(message.outcome), logs=tuple(message.logs), diagnosis=tuple(message.diagnosis))


def _nodes_of(options: LaunchOptions) -> NodeOptions:
    if options.nodes is None:
        raise LaunchError("Received launch options without --nnodes; expected a multi-node job here.")
    return options.nodes


def describe_end(event: JobEvent | None, options: LaunchOptions) -> tuple[Outcome, str]:
    """How a job ended by ``event`` ends (a node missing, node 0 lost), and the message saying so."""
    node, timeout = _nodes_of(options), options.join_timeout
    if event is not None and event.kind is EventKind.TIMEOUT:
        missing = ", ".join(str(rank) for rank in event.data.get("missing", ()))
        if event.data.get("unreachable"):
            return Outcome.JOIN_TIMEOUT, (
                f"could not reach node 0's rendezvous at {node.master} within --timeout {timeout or 0:g} s "
                f"({event.data['unreachable']}): node rank 0 is missing. Start 'tfstrategy launch --node-rank 0 ...' "
                f"on the machine {node.master_host} with the same --master, or let this machine reach that port "
                "(firewall)")
        arrived = ", ".join(f"node {rank} from {address}" for rank, address in event.data.get("arrived", {}).items())
        return Outcome.JOIN_TIMEOUT, (
            f"node rank(s) {missing} did not arrive at the rendezvous on {node.master} within --timeout {timeout or 0:g} s "
            f"(arrived: {arrived or 'none'}). Start 'tfstrategy launch --nnodes {node.nnodes} --node-rank {missing} "
            f"--master {node.master} ...' on that machine with the same secret, check that it can reach "
            f"{node.master}, or raise --timeout")
    if event is not None and event.kind is EventKind.LOST:
        why = event.data.get("why") or "node 0's launcher stopped, or the network between the nodes failed"
        return Outcome.LOST, (f"lost the connection to node 0's rendezvous at {node.master} ({why}); stopped this "
                              "node's workers")
    return Outcome.FAILED, "the job ended before this node's workers started"


def secret_free_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the launch secret: workers never need it."""
    return {key: value for key, value in env.items() if key != ENV_LAUNCH_SECRET}
