"""Who else is in the job: the supervisor's one interface to the other machines (or to none).

The supervisor asks a :class:`Coordinator` to connect, to form each attempt's cluster from
this machine's ports, for events from elsewhere while its workers run, for the verdict after
a failure (restart or give up) and to finish. :class:`LocalCoordinator` answers for a job on
this machine alone; :class:`~tfstrategy.launch.nodes.RendezvousCoordinator` for a job of
several (``--nnodes``), through node 0's rendezvous. The supervisor has no other branch on
the job's shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tfstrategy.launch.processes import LOOPBACK, free_ports
from tfstrategy.launch.states import Failure, Outcome

__all__ = ["Cluster", "Reformation", "Vacancy", "Event", "Coordinator", "LocalCoordinator"]


@dataclass(frozen=True)
class Cluster:
    """One attempt's workers: every ``host:port``, and the global index of this machine's first."""

    addresses: tuple[str, ...]
    first: int = 0


@dataclass(frozen=True, kw_only=True)
class Reformation:
    """An elastic job's group re-forms as ``round`` with the nodes ``nodes``: ``lost`` left, ``joined`` came.

    ``graceful``: the workers stop at a step they agree on (SIGTERM, as for a preemption), else at once
    (a peer is gone: they are blocked in collectives with it). Not a restart: ``--max-restarts`` is not used.
    """

    round: int
    nodes: tuple[int, ...]
    lost: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()
    graceful: bool = False
    reason: str = ""
    #: ``-n MIN:MAX`` on one machine: the worker lost, or the replacement taken back (its index in the new round),
    #: and how many this machine starts in the new round.
    lost_worker: int | None = None
    joined_worker: int | None = None
    workers: int | None = None


@dataclass(frozen=True, kw_only=True)
class Vacancy:
    """A lost worker's place (``-n MIN:MAX``), to start a replacement for while the group goes on without it.

    The replacement is worker ``index`` of round ``round``, whose cluster is ``cluster``; it uses restart
    ``restart`` of ``--max-restarts``. Once it creates its strategy, the group re-forms to take it.
    """

    round: int
    index: int
    cluster: Cluster
    restart: int


@dataclass(frozen=True, kw_only=True)
class Event:
    """What the coordinator tells the supervisor, in the launcher's one vocabulary (:class:`Outcome`).

    - ``SUCCEEDED``: every worker of every machine exited 0;
    - with a ``failure`` (its outcome: failed, stalled, join-timeout, preempted): the attempt's root
      cause, here or elsewhere, and whether the group restarts;
    - ``INTERRUPTED``: a launcher received ``signum`` (on ``node``): stop every worker, pass it on;
    - ``JOIN_TIMEOUT`` or ``LOST`` without a failure: the job cannot go on (a node missing, node 0
      lost), as ``message`` says;
    - with a ``reform`` (``--nnodes MIN:MAX``): stop this machine's workers and form the next round.
    """

    outcome: Outcome
    failure: Failure | None = None
    restart: bool = False
    signum: int | None = None
    node: int | None = None
    message: str = ""
    reform: Reformation | None = None

    @classmethod
    def failed(cls, failure: Failure, *, restart: bool = False) -> Event:
        return cls(outcome=failure.outcome, failure=failure, restart=restart)


class Coordinator(Protocol):
    """The job beyond this machine's workers."""

    @property
    def rank(self) -> int | None:
        """This machine's rank (``None`` on one machine)."""

    @property
    def round(self) -> int:
        """The job's attempt to start with (a node joining late starts at the current one)."""

    def connect(self) -> Event | None:
        """Join the job; the event that ended it instead if it cannot be joined."""

    def ports(self, count: int) -> list[int]:
        """``count`` free ports for this machine's workers."""

    def form(self, attempt: int, ports: list[int]) -> Cluster | Event:
        """The attempt's cluster, or the event that ended the job before it formed."""

    def poll(self) -> Event | None:
        """An event from elsewhere (another node's failure, a stop, a loss), without waiting."""

    def decide(self, attempt: int, failure: Failure) -> Event:
        """The decision after ``failure`` on this machine: the attempt's root cause, restart or not."""

    def vacancy(self, attempt: int) -> Vacancy | None:
        """A lost worker's place to start a replacement for now, while ``attempt`` runs without it (``-n MIN:MAX``;
        it uses one of ``--max-restarts``); ``None``: none, or no restart left."""

    def take(self, vacancy: Vacancy) -> Event:
        """The replacement started for ``vacancy`` creates its strategy: the re-formation that takes it."""

    def share(self, attempt: int, views: tuple[dict[str, object], ...]) -> None:
        """Give node 0 this node's workers' compact views (``--nnodes``), for a diagnosis across nodes."""

    def remote_views(self, attempt: int) -> tuple[dict[str, object], ...] | None:
        """The other nodes' workers' latest views (``--nnodes``) on node 0, to watch every worker for stragglers;
        ``None`` where this launcher does not (another node: node 0 watches them all)."""

    def finish(self, attempt: int) -> Event:
        """This machine's workers all exited 0: ``SUCCEEDED`` once every machine's did, else what happened."""

    def stop(self, signum: int) -> None:
        """This launcher received ``signum``: tell every machine."""

    def leave(self, signum: int) -> bool:
        """This launcher received ``signum`` in an elastic job: whether the others go on without this machine."""

    def close(self, grace: float) -> None:
        """Leave the job."""


class LocalCoordinator:
    """A job on this machine alone: restarts up to ``max_restarts`` times; nothing happens elsewhere.

    ``port_range``: the workers' ports come from ``low..high`` (``--port-range``), else the kernel's ephemeral range.
    ``workers`` and ``min_workers`` (``-n MIN:MAX``): a worker killed with no error of its own while more than
    ``min_workers`` train re-forms the group without it, from the newest committed step, which is not a
    restart; below that, or on any other failure, the group restarts as launched (every worker) as without MIN.
    A lost worker's place is a :meth:`vacancy` while a restart is left: a replacement started for it uses one
    (so a worker that dies every time is not replaced forever), and is taken in by a graceful re-formation
    (:meth:`take`), as a node that joins is.
    """

    def __init__(self, max_restarts: int, port_range: tuple[int, int] | None = None, *, workers: int = 0,
                 min_workers: int | None = None) -> None:
        self.max_restarts = max_restarts
        self.port_range = port_range
        self.workers, self.most, self.min_workers = workers, workers, min_workers
        self.restarts = 0
        self._vacancy: Vacancy | None = None

    @property
    def rank(self) -> int | None:
        return None

    @property
    def round(self) -> int:
        return 0

    def connect(self) -> Event | None:
        return None

    def ports(self, count: int) -> list[int]:
        return free_ports(count, port_range=self.port_range)

    def form(self, attempt: int, ports: list[int]) -> Cluster | Event:
        vacancy, self._vacancy = self._vacancy, None
        if vacancy is not None and vacancy.round == attempt:  # the replacement already waits in this cluster
            return vacancy.cluster
        return Cluster(tuple(f"{LOOPBACK}:{port}" for port in ports))

    def poll(self) -> Event | None:
        return None

    def decide(self, attempt: int, failure: Failure) -> Event:
        self._vacancy = None  # a replacement waiting for this round's successor is stopped with it
        if (self.min_workers is not None and failure.killed and failure.index is not None
                and self.workers > self.min_workers):
            self.workers -= 1
            return Event(outcome=failure.outcome, failure=failure, reform=Reformation(
                round=attempt + 1, nodes=(), lost_worker=failure.index, workers=self.workers, reason=failure.reason))
        restart = failure.outcome.restartable and self.restarts < self.max_restarts
        if restart:  # a restart is the group as launched: every worker again
            self.restarts, self.workers = self.restarts + 1, self.most
        return Event.failed(failure, restart=restart)

    def vacancy(self, attempt: int) -> Vacancy | None:
        if self.min_workers is None or self.workers >= self.most or self.restarts >= self.max_restarts:
            return None
        self.restarts += 1
        count = self.workers + 1  # one place at a time: the replacement is the next round's last worker
        cluster = Cluster(tuple(f"{LOOPBACK}:{port}" for port in self.ports(count)))
        self._vacancy = Vacancy(round=attempt + 1, index=count - 1, cluster=cluster, restart=self.restarts)
        return self._vacancy

    def take(self, vacancy: Vacancy) -> Event:
        self.workers = len(vacancy.cluster.addresses)
        return Event(outcome=Outcome.INTERRUPTED, reform=Reformation(
            round=vacancy.round, nodes=(), joined_worker=vacancy.index, workers=self.workers, graceful=True,
            reason=f"a replacement for a lost worker (restart {vacancy.restart}) created its strategy"))

    def share(self, attempt: int, views: tuple[dict[str, object], ...]) -> None:
        """Nothing to share: every worker is here."""

    def remote_views(self, attempt: int) -> tuple[dict[str, object], ...] | None:
        """No other node: every worker is here, and watched here."""
        return ()

    def finish(self, attempt: int) -> Event:
        return Event(outcome=Outcome.SUCCEEDED)

    def stop(self, signum: int) -> None:
        pass

    def leave(self, signum: int) -> bool:
        return False

    def close(self, grace: float) -> None:
        pass
