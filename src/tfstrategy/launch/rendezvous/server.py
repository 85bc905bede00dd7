"""Node 0's side of the rendezvous: authenticates nodes, forms each round's cluster, relays failures and stops.

Resources are bounded before a peer proves anything: at most ``max_pending`` connections are
in the handshake at once (``max_pending_per_host`` from one address, so a flood from one host
cannot keep the real nodes out), each with ``handshake_seconds`` for the whole handshake (not
per read: one byte every few seconds does not keep a connection). The accept loop survives
running out of file descriptors (EMFILE/ENFILE) and transient errors: it backs off and keeps
serving. After the handshake every message is sealed (:mod:`.handshake`) and sent from a queue
(:mod:`.channel`), never under the server's lock.

What a peer does wrong is reported with its address and its rank; it never kills a thread:

- it breaks the protocol after authenticating (a message that fails authentication or is out of
  sequence, i.e. tampered with in transit, or a malformed one): its connection is closed and
  the job ends at once, on every node, naming it;
- it goes silent for ``dead_after`` seconds (frozen machine, SIGSTOPped launcher, cable) or
  disconnects: while the workers run, that is the round's failure (restarted under
  ``--max-restarts``, the node's seat waiting for it until ``--timeout``); while a round forms,
  its seat waits for it until ``--timeout``.
"""

from __future__ import annotations

import errno
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tfstrategy.errors import LaunchError
from tfstrategy.launch.rendezvous.admission import PendingConnections
from tfstrategy.launch.rendezvous.channel import Channel, ChannelClosed
from tfstrategy.launch.rendezvous.handshake import (
    Opener,
    Sealer,
    client_proof,
    is_nonce,
    proof_matches,
    session_keys,
    welcome_proof,
)
from tfstrategy.launch.rendezvous.options import NodeOptions, ServerLimits
from tfstrategy.launch.rendezvous.root_cause import root_cause
from tfstrategy.launch.rendezvous.rounds import JobState, cluster_workers, may_leave, ready_to_form, refusal
from tfstrategy.launch.rendezvous.wire import (
    PROTOCOL,
    TO_SERVER,
    Abort,
    Closing,
    Cluster,
    Done,
    Failed,
    Finished,
    Heartbeat,
    Join,
    Leave,
    LineReader,
    Message,
    ProtocolError,
    Reform,
    RoundFailed,
    Stop,
    Stopped,
    Timeout,
    Views,
    encode,
    read_json,
)
from tfstrategy.launch.states import Outcome
from tfstrategy.settings import ENV_LAUNCH_SECRET

__all__ = ["ServerLimits", "JobState", "RendezvousServer"]

_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: The same complaint about the same source is said at most once per this many seconds.
_REPORT_EVERY = 10.0


@dataclass(frozen=True)
class _Peer:
    rank: int
    address: str  # host:port it connected from
    channel: Channel


class RendezvousServer:
    """Node 0's side: authenticates nodes, forms each round's cluster, relays failures and stops.

    Args:
        node: node 0's options (``--master`` is where it listens).
        workers_per_node: ``-n``, which every node must use.
        max_restarts: group restarts allowed, decided here for every node.
        timeout: seconds every node has to join a round (``None``: no limit).
        say: where the server's messages go (the launcher's stderr).
        limits: bounds and heartbeat.

    Raises:
        LaunchError: the master address is not this machine's, or its port is taken.
    """

    def __init__(self, node: NodeOptions, *, workers_per_node: int, max_restarts: int, timeout: float | None,
                 say: Callable[[str], None], limits: ServerLimits | None = None) -> None:
        self.node, self.say, self.limits = node, say, limits or ServerLimits()
        self.job: dict[str, object] = {"nnodes": node.shape, "workers_per_node": workers_per_node,
                                       "max_restarts": max_restarts}
        self.max_restarts = max_restarts
        #: This job's identity: in every welcome and sealed message, so nothing of another job is accepted.
        self.job_id = secrets.token_hex(8)
        self.timeout = timeout
        try:
            family = socket.AF_INET6 if ":" in node.master_host else socket.AF_INET
            self._listener = socket.create_server((node.master_host, node.master_port), family=family, backlog=128)
        except OSError as error:
            raise LaunchError(
                f"Received --master {node.master} on node 0, but its rendezvous cannot listen there "
                f"({error.strerror}); expected an address of this machine and a free port. Run node 0 on the machine "
                "--master names, or pick another port (the same on every node)."
            ) from None
        self._listener.settimeout(0.5)  # so that close() ends the accept loop
        self._lock = threading.Lock()
        self._peers: dict[int, _Peer] = {}
        self._pending = PendingConnections(self.limits)
        self._reported: dict[str, float] = {}
        self.state = JobState.FORMING
        self.round = 0
        #: Restarts after a failure of the job itself (a re-formation for a node lost or joined is not one).
        self.restarts = 0
        #: The ranks of the nodes in the running round (every node but in an elastic job).
        self.members: list[int] = []
        #: Nodes that asked to leave (``Leave``) and are still connected: no round waits for them.
        self._leaving: set[int] = set()
        self._round_started = time.monotonic()
        self._joins: dict[int, tuple[str, list[int]]] = {}
        self._done: set[int] = set()
        #: The round's failures so far, by node, and the monotonic second the first arrived.
        self._failures: dict[int, Failed] = {}
        #: Each node's latest worker views of the running round (:class:`Views`), for a diagnosis across nodes.
        self._views: dict[int, list[dict[str, object]]] = {}
        self._first_failure_at: float | None = None
        #: The message that ended the job, for a node that connects after it (node 0's own launcher among them).
        self._ended_by: Message | None = None
        self._closed = False
        for target in (self._accept_loop, self._tick_loop):
            threading.Thread(target=self._guarded, args=(target,), daemon=True, name=f"rendezvous {target.__name__}").start()

    def _guarded(self, target: Callable[[], None]) -> None:
        """Run a server loop; an unexpected error is reported and the loop restarted, never a dead thread."""
        while not self._closed:
            try:
                target()
                return
            except Exception as error:  # noqa: BLE001 - the rendezvous must outlive its own bugs
                self.say(f"rendezvous: internal error in {target.__name__} ({type(error).__name__}: {error}); "
                         "it goes on")
                time.sleep(0.1)

    def _report(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._reported.get(key, -_REPORT_EVERY) >= _REPORT_EVERY:
            self._reported[key] = now
            self.say(f"rendezvous: {message}")

    # --- connections -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        backoff = 0.0
        while not self._closed:
            try:
                sock, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if self._closed:
                    return
                if error.errno in _EXHAUSTED:
                    # Out of descriptors: what is open closes by itself (handshakes have a deadline).
                    backoff = min(1.0, max(0.05, backoff * 2))
                    self._report("exhausted", f"cannot accept connections ({errno.errorcode.get(error.errno)}: "
                                 f"{error.strerror}); retrying every {backoff:g} s, the job goes on")
                else:
                    backoff = 0.01  # ECONNABORTED and kin: that connection is gone, the next one is not
                time.sleep(backoff)
                continue
            backoff = 0.0
            host = str(address[0])
            refused = self._pending.admit(host)
            if refused is not None:
                self._report(f"flood {host}", f"refused connections from {host}: {refused}; the job goes on")
                sock.close()
                continue
            try:
                threading.Thread(target=self._serve, args=(sock, host), daemon=True, name=f"rendezvous {host}").start()
            except RuntimeError as error:  # no thread to spare: like running out of descriptors
                self._pending.release(host)
                sock.close()
                self._report("threads", f"cannot serve a connection from {host} ({error}); the job goes on")
                time.sleep(0.05)

    def _serve(self, sock: socket.socket, host: str) -> None:
        peer: _Peer | None = None
        try:
            try:
                peer = self._handshake(sock, host)
            finally:
                self._pending.release(host)
            if peer is None:
                sock.close()
                return
            self._read(peer)
        except Exception as error:  # noqa: BLE001 - a bug must not leave a node unanswered
            self.say(f"rendezvous: internal error serving {host} ({type(error).__name__}: {error}); closed it")
            if peer is not None:
                self._lost(peer, ChannelClosed(f"met an internal error of node 0 ({error})", broken=True))
            sock.close()

    def _handshake(self, sock: socket.socket, host: str) -> _Peer | None:
        """The peer once it proved the secret and its place is free; ``None`` after refusing or dropping it."""
        limits = self.limits
        deadline = time.monotonic() + limits.handshake_seconds
        try:
            host_, port_ = sock.getpeername()[:2]
            address = f"{host_}:{port_}"
            reader = LineReader(sock)
            nonce = secrets.token_hex(16)
            sock.settimeout(limits.handshake_seconds)
            sock.sendall(encode({"type": "challenge", "protocol": PROTOCOL, "nonce": nonce}))
            hello = read_json(reader, deadline=deadline)
        except TimeoutError:
            self._report(f"slow {host}", f"dropped a connection from {host}: no {PROTOCOL} hello within "
                         f"{limits.handshake_seconds:g} s; the job goes on")
            return None
        except ProtocolError as error:
            self._report(f"garbage {host}", f"dropped a connection from {host} that did not speak {PROTOCOL}: it "
                         f"{error}; the job goes on")
            return None
        except OSError:
            return None
        if hello is None:
            return None
        rank, client_nonce, proof = hello.get("rank"), hello.get("nonce"), hello.get("proof")
        if hello.get("type") != "hello" or not is_nonce(client_nonce) or not isinstance(proof, str):
            self._report(f"garbage {host}", f"dropped a connection from {address} that did not speak {PROTOCOL} "
                         f"(its first message: {str(hello)[:80]}); the job goes on")
            return None
        claimed = rank if isinstance(rank, int) and not isinstance(rank, bool) else -1
        if not proof_matches(proof, client_proof(self.node.secret, nonce, client_nonce, claimed)):
            self._refuse(sock, address, claimed, "its shared secret differs from node 0's. Give every node the "
                         f"same {ENV_LAUNCH_SECRET} or --secret-file")
            return None
        job = hello.get("job")
        with self._lock:
            taken = self._peers.get(claimed)
            # A node arriving after a failure or a stop ended the job (node 0's own launcher, joining its rendezvous
            # after node 1 broke it) is welcomed and told that end, as the others were.
            told = isinstance(self._ended_by, (RoundFailed, Stopped))
            why = refusal(self.node, self.job, job, claimed, taken_by=None if taken is None else taken.address,
                          ended=self.state is JobState.ENDED and not told)
            if why is None:
                if self.node.elastic and self.state is JobState.RUNNING and claimed not in self.members:
                    # Before the welcome, so that the node joins the round that takes it in.
                    self._reform_locked(lost=[], joined=[claimed], graceful=True,
                                        reason=f"node {claimed} joined from {address}")
                welcome: dict[str, object] = {"type": "welcome", "job_id": self.job_id, "round": self.round,
                                              "heartbeat": limits.heartbeat_seconds, "dead_after": limits.dead_after}
                welcome["proof"] = welcome_proof(self.node.secret, nonce, client_nonce, claimed, welcome)
                to_server, to_client = session_keys(self.node.secret, nonce, client_nonce, self.job_id, claimed)
                channel = Channel(sock, reader, address, sealer=Sealer(to_client, self.job_id),
                                  opener=Opener(to_server, self.job_id, TO_SERVER), dead_after=limits.dead_after,
                                  queue_limit=limits.queue_limit)
                peer = _Peer(claimed, address, channel)
                self._peers[claimed] = peer  # broadcasts queue for it from now on
                if told and self._ended_by is not None:
                    channel.send(self._ended_by)
        if why is not None:
            self._refuse(sock, address, claimed, why)
            return None
        try:
            sock.sendall(encode(welcome))  # before anything queued: the channel's sender starts after it
        except OSError:
            self._lost(peer, ChannelClosed("closed the connection during the handshake"))
            return None
        channel.start()
        if claimed:
            self.say(f"rendezvous: node {claimed} connected from {address}")
        return peer

    def _refuse(self, sock: socket.socket, address: str, rank: int, why: str) -> None:
        self.say(f"rendezvous: refused a launcher at {address} claiming rank {rank}: {why}; the job goes on")
        try:
            sock.sendall(encode({"type": "refused", "reason": why}))
        except OSError:
            pass
        return None

    def _read(self, peer: _Peer) -> None:
        while True:
            try:
                message = peer.channel.receive()
                if not isinstance(message, Heartbeat):
                    self._handle(peer.rank, message)
            except ChannelClosed as closed:
                self._lost(peer, closed)
                return
            except ProtocolError as error:
                self._lost(peer, ChannelClosed(str(error), broken=True))
                return

    def _lost(self, peer: _Peer, closed: ChannelClosed) -> None:
        """``peer``'s connection ended (it left, went silent, or broke the protocol): what that means for the job."""
        closed.reason = closed.reason[:2000]  # it may quote the peer; messages carry at most 10,000 characters
        if closed.broken:
            peer.channel.close(Closing(f"node 0 closed this node's connection: it {closed.reason}"))
        else:
            peer.channel.close()
        if self._closed:
            return
        rank, who = peer.rank, f"node {peer.rank} at {peer.address}"
        with self._lock:
            if self._peers.get(rank) is not peer:
                return
            del self._peers[rank]
            self._leaving.discard(rank)
            state = self.state
            if closed.broken and state is not JobState.ENDED:
                broke = Failed.bounded(round=self.round, worker=None, status=1, time=time.time(), consequential=False,
                                       outcome=Outcome.FAILED.value, lines=[], logs=[],
                                       reason=f"broke the rendezvous protocol ({peer.address}): it {closed.reason}; "
                                       "node 0 closed its connection and stopped the job")
                self._end_locked(RoundFailed.of(rank, broke, restart=False))
            elif state is JobState.FORMING:
                self._joins.pop(rank, None)  # it may come back before the deadline
                self._form_if_ready_locked(time.monotonic())  # elastic: the others need not wait for it
            elif (state is JobState.RUNNING and rank in self.members and self.node.elastic
                  and len(set(self._peers) - self._leaving) >= self.node.fewest):
                self._reform_locked(lost=[rank], joined=[], graceful=False,
                                    reason=f"node {rank} lost ({peer.address}: it {closed.reason})")
            elif state is JobState.RUNNING and rank in self.members and rank not in self._done:
                self._failed_locked(rank, Failed.bounded(
                    round=self.round, worker=None, status=1, time=time.time(), consequential=False, outcome=Outcome.FAILED.value,
                    lines=[], logs=[], reason=f"lost its control connection ({peer.address}): it {closed.reason}"))
        if closed.broken:
            self.say(f"rendezvous: {who} {closed.reason}; closed its connection")
        elif state is JobState.FORMING:
            self.say(f"rendezvous: {who} {closed.reason}; its seat waits for it until --timeout")
        elif state is JobState.RUNNING and closed.silent:
            self.say(f"rendezvous: {who} {closed.reason}")

    # --- the job -----------------------------------------------------------------------------

    def _handle(self, rank: int, message: Message) -> None:
        """Act on an authentic, well-formed message.

        Raises:
            ProtocolError: it makes no sense here (ports for another ``-n``), or the node aborted.
        """
        if isinstance(message, Abort):
            raise ProtocolError(f"reported that node 0's messages reached it broken: node 0's rendezvous {message.reason}")
        with self._lock:
            current = message.round == self.round if hasattr(message, "round") else True
            if isinstance(message, Join) and current and self.state is JobState.FORMING:
                if len(message.ports) != self.job["workers_per_node"]:
                    raise ProtocolError(f"offered {len(message.ports)} port(s); expected -n "
                                        f"{self.job['workers_per_node']}, one per worker")
                self._joins[rank] = (message.address, list(message.ports))
                self._form_if_ready_locked(time.monotonic())
            elif isinstance(message, Failed) and current and self.state is JobState.RUNNING:
                self._failed_locked(rank, message)
            elif isinstance(message, Views) and current and self.state is JobState.RUNNING:
                self._views[rank] = message.views
            elif isinstance(message, Done) and current and self.state is JobState.RUNNING:
                self._done.add(rank)
                if self._done >= set(self.members):
                    self._end_locked(Finished(round=self.round))
            elif isinstance(message, Leave) and self.state is not JobState.ENDED and may_leave(self.node, rank, set(self._peers), self._leaving):
                self._leaving.add(rank)
                self._joins.pop(rank, None)
                if self.state is JobState.RUNNING and rank in self.members:
                    self._reform_locked(lost=[rank], joined=[], graceful=True,
                                        reason=f"node {rank} leaves (it received signal {message.signal})")
                else:
                    self._form_if_ready_locked(time.monotonic())
            elif isinstance(message, (Stop, Leave)) and self.state is not JobState.ENDED:
                self._end_locked(Stopped(node=rank, signal=message.signal))
            # Anything else is a message of an earlier round or state that crossed ours: nothing to do.

    def _form_if_ready_locked(self, now: float, *, late: bool = False) -> None:
        """Form the round when :func:`~.rounds.ready_to_form` says so: broadcast every worker's address."""
        joined = set(self._joins)
        if self.state is not JobState.FORMING or not joined or not ready_to_form(
                self.node, joined, set(self._peers), self._leaving, first_round=self.round == 0,
                waited=now - self._round_started, late=late):
            return
        self.members = sorted(joined)
        workers = cluster_workers(self._joins, self.members)
        self.state = JobState.RUNNING
        self._broadcast(Cluster(round=self.round, workers=workers, nodes=self.members))

    def _reform_locked(self, *, lost: list[int], joined: list[int], graceful: bool, reason: str) -> None:
        """Elastic: end the running round and form the next with the nodes present (not a restart of the job)."""
        self._new_round_locked()
        present = sorted((set(self._peers) | set(joined)) - set(lost) - self._leaving)
        self._broadcast(Reform(round=self.round, lost=lost, joined=joined, nodes=present, graceful=graceful,
                               reason=reason[:2000]))

    def _new_round_locked(self) -> None:
        self.round += 1
        self.state, self._joins, self._done, self.members = JobState.FORMING, {}, set(), []
        self._failures, self._first_failure_at, self._views = {}, None, {}
        self._round_started = time.monotonic()

    def _failed_locked(self, rank: int, failure: Failed) -> None:
        """Note a node's failure of the running round; the round's root cause is decided once it settles."""
        known = self._failures.get(rank)
        if known is None or failure.time < known.time:
            self._failures[rank] = failure
        if self._first_failure_at is None:
            self._first_failure_at = time.monotonic()
        self._decide_locked(time.monotonic())

    def _decide_locked(self, now: float) -> None:
        """Once every node reported (or ``settle_seconds`` passed), relay the round's root cause (:func:`root_cause`)."""
        if self.state is not JobState.RUNNING or self._first_failure_at is None:
            return
        heard = set(self._failures) | self._done
        if not (heard >= set(self.members) or now - self._first_failure_at >= self.limits.settle_seconds):
            return
        reported = sorted(self._failures.items(), key=lambda item: item[1].time)
        rank, cause = root_cause(reported, self._views)
        restart = self.restarts < self.max_restarts and not self._done and cause.outcome != Outcome.STOPPED.value
        ended = RoundFailed.of(rank, cause, restart=restart)
        self._failures, self._first_failure_at, self._views = {}, None, {}
        if restart:
            self._broadcast(ended)
            self.restarts += 1
            self._new_round_locked()
        else:
            self._end_locked(ended)

    def _end_locked(self, message: Message) -> None:
        """The job ends with ``message``: every node hears it, and so does one that connects later."""
        self.state, self._ended_by = JobState.ENDED, message
        self._broadcast(message)

    def _broadcast(self, message: Message) -> None:
        for peer in list(self._peers.values()):
            peer.channel.send(message)  # queued: never blocks under the lock

    def _tick_loop(self) -> None:
        next_beat = 0.0
        while not self._closed:
            time.sleep(0.1)
            now = time.monotonic()
            with self._lock:
                if now >= next_beat:
                    next_beat = now + self.limits.heartbeat_seconds
                    self._broadcast(Heartbeat())
                self._decide_locked(now)
                self._form_if_ready_locked(now)
                late = (self.state is JobState.FORMING and self.timeout is not None
                        and now - self._round_started > self.timeout)
                if late:
                    self._form_if_ready_locked(now, late=True)  # elastic: with the MIN or more that joined
                if late and self.state is JobState.FORMING:
                    missing = [r for r in range(self.node.nnodes) if r not in self._joins]
                    arrived = {str(r): address for r, (address, _) in sorted(self._joins.items())}
                    self._end_locked(Timeout(round=self.round, missing=missing, arrived=arrived))

    def wait_for_nodes_to_leave(self, timeout: float) -> None:
        """Give the other nodes up to ``timeout`` seconds to act on the last message and disconnect."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not any(rank for rank in self._peers):
                    return
            time.sleep(0.05)

    def latest_views(self, round: int) -> dict[int, list[dict[str, object]]]:
        """Each node's latest worker views of round ``round`` (:class:`Views`, checked), by rank; none once it ended."""
        with self._lock:
            return dict(self._views) if round == self.round and self.state is JobState.RUNNING else {}

    def connected(self) -> Mapping[int, str]:
        """The authenticated nodes now connected: rank -> the address they connected from."""
        with self._lock:
            return {rank: peer.address for rank, peer in self._peers.items()}

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            peers = list(self._peers.values())
        for peer in peers:
            peer.channel.close()
