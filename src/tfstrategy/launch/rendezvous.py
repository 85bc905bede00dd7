"""The rendezvous of ``tfstrategy launch --nnodes N``: who is in the job, and its control channel.

Node 0's launcher hosts a small TCP server on ``--master HOST:PORT``. Every
launcher (node 0's too, over the same protocol) connects to it, proves that it
knows the shared secret, and then, for each attempt ("round") of the job, sends
its reachable address and its workers' free ports and receives the whole
cluster, from which it builds its workers' ``TF_CONFIG``. The connection stays
open while the job runs: it is the control channel through which node 0 relays
the first failure and whether the group restarts, a stop (Ctrl-C on any node),
the ranks missing at the deadline, and the end of the job.

One JSON object per line. Authentication is an HMAC-SHA256 challenge-response
in both directions, so the secret never crosses the network and a launcher
cannot be fooled by a program that merely listens on the master's port::

    server -> {"type": "challenge", "nonce": S}
    client -> {"type": "hello", "rank": R, "job": {...}, "nonce": C, "proof": HMAC(secret, client|S|C|R)}
    server -> {"type": "welcome", "round": r, "proof": HMAC(secret, server|S|C|R)}  or  {"type": "refused", ...}

then ``join``/``failed``/``done``/``stop`` from a node, and
``cluster``/``failed``/``stop``/``timeout``/``finished`` from node 0 to every node.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from tfstrategy.errors import LaunchError
from tfstrategy.settings import ENV_LAUNCH_SECRET, ENV_NODE_RANK

__all__ = ["NodeOptions", "parse_master", "read_secret", "validate_node_options", "RendezvousServer", "EventKind", "JobEvent", "RendezvousClient"]

PROTOCOL = "tfstrategy-rendezvous/1"
#: Seconds a peer has to complete the handshake before it is dropped.
HANDSHAKE_SECONDS = 10.0
#: Shortest secret accepted (bytes).
MIN_SECRET_BYTES = 16
_MAX_LINE = 1 << 20
_EXAMPLE = "tfstrategy launch --nnodes 2 --node-rank 0 --master 10.0.0.5:29400 -n 1 -- python train.py"
_MAKE_SECRET = "python -c 'import secrets; print(secrets.token_hex(32))' > ~/.tfstrategy-secret; chmod 600 ~/.tfstrategy-secret"


@dataclass(frozen=True, kw_only=True)
class NodeOptions:
    """Where this launcher stands in a multi-node job."""

    nnodes: int
    node_rank: int
    master_host: str
    master_port: int
    secret: bytes = field(repr=False)
    #: The address this node's workers are reached at; default: the one it reaches the master from.
    node_address: str | None = None

    @property
    def master(self) -> str:
        return f"{self.master_host}:{self.master_port}"


def parse_master(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as ``(host, port)``.

    Raises:
        LaunchError: no port, or a port outside 1..65535.
    """
    host, sep, port = value.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(
            f"Received --master {value!r}; expected HOST:PORT of node 0's machine, with a free port for the rendezvous, "
            f"e.g. --master 10.0.0.5:29400. Use the same value on every node."
        )
    return host, int(port)


def read_secret(secret_file: Path | None, env: Mapping[str, str]) -> bytes:
    """The shared secret: the file's contents (``--secret-file``), else ``TFSTRATEGY_LAUNCH_SECRET``.

    Raises:
        LaunchError: none given, an unreadable file, or a secret shorter than :data:`MIN_SECRET_BYTES`.
    """
    if secret_file is not None:
        try:
            secret, origin = secret_file.read_bytes().strip(), f"--secret-file {secret_file}"
        except OSError as error:
            raise LaunchError(f"Received --secret-file {secret_file}, which cannot be read ({error.strerror}); "
                              f"pass a file holding the job's shared secret, e.g. {_MAKE_SECRET}") from None
    elif env.get(ENV_LAUNCH_SECRET):
        secret, origin = env[ENV_LAUNCH_SECRET].strip().encode(), ENV_LAUNCH_SECRET
    else:
        raise LaunchError(
            f"Received --nnodes > 1 without a shared secret; expected {ENV_LAUNCH_SECRET} or --secret-file FILE "
            "(the same on every node; never on the command line, which ps shows), so that only your nodes join "
            f"the job. Make one with: {_MAKE_SECRET}"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise LaunchError(f"Received a shared secret of {len(secret)} byte(s) from {origin}; expected at least "
                          f"{MIN_SECRET_BYTES}. Make one with: {_MAKE_SECRET}")
    return secret


def validate_node_options(node: NodeOptions) -> NodeOptions:
    """Check a node's place in the job before anything starts.

    Raises:
        LaunchError: fewer than two nodes, or a rank outside ``0..nnodes-1``.
    """
    if node.nnodes < 2:
        raise LaunchError(f"Received --nnodes {node.nnodes} for a multi-node job; expected 2 or more "
                          "(omit --nnodes to run every worker on this machine).")
    if not 0 <= node.node_rank < node.nnodes:
        raise LaunchError(
            f"Received --node-rank {node.node_rank} (or {ENV_NODE_RANK}) for --nnodes {node.nnodes}; expected 0.."
            f"{node.nnodes - 1}, a different one on each machine, 0 on the machine named by --master. e.g. {_EXAMPLE}"
        )
    return node


def _shape(job: object) -> str:
    if not isinstance(job, dict):
        return repr(job)
    return f"--nnodes {job.get('nnodes')} -n {job.get('workers_per_node')} --max-restarts {job.get('max_restarts')}"


def _proof(secret: bytes, side: str, server_nonce: str, client_nonce: str, rank: int) -> str:
    message = f"{PROTOCOL}|{side}|{server_nonce}|{client_nonce}|{rank}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class _Connection:
    """One JSON-lines socket: whole lines in, whole lines out (sends serialised)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        host, port = sock.getpeername()[:2]
        self.peer = f"{host}:{port}"
        self._send_lock = threading.Lock()

    def send(self, message: Mapping[str, Any]) -> bool:
        data = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                return False

    def receive(self) -> dict[str, Any] | None:
        """The next message; ``None`` at the end of the stream or on garbage."""
        try:
            line = self.reader.readline(_MAX_LINE)
        except (OSError, ValueError):
            return None
        if not line.endswith(b"\n"):
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) else None

    def close(self) -> None:
        for close in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.reader.close, self.sock.close):
            try:
                close()
            except OSError:
                pass


class JobState(str, Enum):
    """Where the job stands, as node 0's rendezvous sees it."""

    FORMING = "forming"  # waiting for every node's join of the current round
    RUNNING = "running"  # the cluster was sent; workers run
    ENDED = "ended"  # finished, given up, stopped or timed out: no new round


class RendezvousServer:
    """Node 0's side: authenticates nodes, forms each round's cluster, relays failures and stops.

    Args:
        node: node 0's options (``--master`` is where it listens).
        workers_per_node: ``-n``, which every node must use.
        max_restarts: group restarts allowed, decided here for every node.
        timeout: seconds every node has to join a round (``None``: no limit).
        say: where the server's messages go (the launcher's stderr).

    Raises:
        LaunchError: the master address is not this machine's, or its port is taken.
    """

    def __init__(self, node: NodeOptions, *, workers_per_node: int, max_restarts: int, timeout: float | None,
                 say: Callable[[str], None]) -> None:
        self.node, self.say = node, say
        self.job = {"nnodes": node.nnodes, "workers_per_node": workers_per_node, "max_restarts": max_restarts}
        self.timeout = timeout
        try:
            family = socket.AF_INET6 if ":" in node.master_host else socket.AF_INET
            self._listener = socket.create_server((node.master_host, node.master_port), family=family)
        except OSError as error:
            raise LaunchError(
                f"Received --master {node.master} on node 0, but its rendezvous cannot listen there "
                f"({error.strerror}); expected an address of this machine and a free port. Run node 0 on the machine "
                "--master names, or pick another port (the same on every node)."
            ) from None
        self._lock = threading.Lock()
        self._peers: dict[int, _Connection] = {}
        self.state = JobState.FORMING
        self.round = 0
        self._round_started = time.monotonic()
        self._joins: dict[int, tuple[str, list[int]]] = {}
        self._done: set[int] = set()
        self._closed = False
        for target in (self._accept_loop, self._deadline_loop):
            threading.Thread(target=target, daemon=True).start()

    # --- connections -------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = _Connection(sock)
        rank = self._handshake(conn)
        if rank is None:
            conn.close()
            return
        while (message := conn.receive()) is not None:
            self._handle(rank, message)
        self._disconnected(rank, conn)

    def _handshake(self, conn: _Connection) -> int | None:
        """The peer's rank once it proved the secret and its place is free; ``None`` after refusing it."""
        conn.sock.settimeout(HANDSHAKE_SECONDS)
        nonce = secrets.token_hex(16)
        conn.send({"type": "challenge", "protocol": PROTOCOL, "nonce": nonce})
        hello = conn.receive()
        if hello is None or hello.get("type") != "hello":
            self.say(f"rendezvous: dropped a connection from {conn.peer} that did not speak {PROTOCOL}")
            return None
        rank, client_nonce = hello.get("rank"), str(hello.get("nonce", ""))
        claimed = rank if isinstance(rank, int) and not isinstance(rank, bool) else -1
        expected = _proof(self.node.secret, "client", nonce, client_nonce, claimed)
        if not hmac.compare_digest(str(hello.get("proof", "")), expected):
            return self._refuse(conn, claimed, "its shared secret differs from node 0's. Give every node the same "
                                f"{ENV_LAUNCH_SECRET} or --secret-file")
        job = hello.get("job")
        with self._lock:
            if job != self.job:
                return self._refuse(conn, claimed, f"it runs {_shape(job)}; node 0 runs {_shape(self.job)}. "
                                    "Use the same --nnodes, -n and --max-restarts on every node")
            if not 0 <= claimed < self.node.nnodes:
                return self._refuse(conn, claimed, f"expected a rank 0..{self.node.nnodes - 1}")
            if claimed in self._peers:
                holder = self._peers[claimed].peer
                return self._refuse(conn, claimed, f"rank {claimed} is taken by the node at {holder}. Give each "
                                    f"machine its own --node-rank 0..{self.node.nnodes - 1}")
            if self.state is JobState.ENDED:
                return self._refuse(conn, claimed, "the job has ended")
            self._peers[claimed] = conn
            conn.send({"type": "welcome", "round": self.round,
                       "proof": _proof(self.node.secret, "server", nonce, client_nonce, claimed)})
        conn.sock.settimeout(None)
        if claimed:
            self.say(f"rendezvous: node {claimed} connected from {conn.peer}")
        return claimed

    def _refuse(self, conn: _Connection, rank: int, why: str) -> None:
        self.say(f"rendezvous: refused a launcher at {conn.peer} claiming rank {rank}: {why}; the job goes on")
        conn.send({"type": "refused", "reason": why})
        return None

    def _disconnected(self, rank: int, conn: _Connection) -> None:
        conn.close()
        with self._lock:
            if self._peers.get(rank) is not conn:
                return
            del self._peers[rank]
            if self.state is JobState.FORMING:
                self._joins.pop(rank, None)  # it may come back before the deadline
            elif self.state is JobState.RUNNING and rank not in self._done:
                self._failed_locked({
                    "round": self.round, "node": rank, "worker": None, "status": 1, "lines": [],
                    "reason": "disconnected (it was stopped, or its machine is unreachable)",
                })

    # --- the job -----------------------------------------------------------------------------

    def _handle(self, rank: int, message: Mapping[str, Any]) -> None:
        kind = message.get("type")
        with self._lock:
            if kind == "join" and message.get("round") == self.round and self.state is JobState.FORMING:
                self._joins[rank] = (str(message.get("address")), [int(p) for p in message.get("ports", [])])
                if len(self._joins) == self.node.nnodes:
                    workers = [f"{self._host(address)}:{port}" for r in sorted(self._joins)
                               for address, ports in [self._joins[r]] for port in ports]
                    self.state = JobState.RUNNING
                    self._broadcast({"type": "cluster", "round": self.round, "workers": workers})
            elif kind == "failed" and message.get("round") == self.round and self.state is JobState.RUNNING:
                self._failed_locked({**message, "node": rank})
            elif kind == "done" and message.get("round") == self.round and self.state is JobState.RUNNING:
                self._done.add(rank)
                if len(self._done) == self.node.nnodes:
                    self.state = JobState.ENDED
                    self._broadcast({"type": "finished", "round": self.round})
            elif kind == "stop" and self.state is not JobState.ENDED:
                self.state = JobState.ENDED
                self._broadcast({"type": "stop", "node": rank, "signal": message.get("signal")})

    @staticmethod
    def _host(address: str) -> str:
        return f"[{address}]" if ":" in address else address

    def _failed_locked(self, failure: Mapping[str, Any]) -> None:
        """Relay the round's first failure to every node, with the decision: restart or give up."""
        restart = self.round < self.job["max_restarts"] and not self._done
        self._broadcast({**failure, "type": "failed", "round": self.round, "restart": restart})
        if restart:
            self.round += 1
            self.state, self._joins, self._done = JobState.FORMING, {}, set()
            self._round_started = time.monotonic()
        else:
            self.state = JobState.ENDED

    def _broadcast(self, message: Mapping[str, Any]) -> None:
        for conn in list(self._peers.values()):
            conn.send(message)

    def _deadline_loop(self) -> None:
        while not self._closed:
            time.sleep(0.1)
            with self._lock:
                late = (self.state is JobState.FORMING and self.timeout is not None
                        and time.monotonic() - self._round_started > self.timeout)
                if late:
                    missing = [r for r in range(self.node.nnodes) if r not in self._joins]
                    arrived = {r: address for r, (address, _) in sorted(self._joins.items())}
                    self.state = JobState.ENDED
                    self._broadcast({"type": "timeout", "round": self.round, "missing": missing, "arrived": arrived})

    def wait_for_nodes_to_leave(self, timeout: float) -> None:
        """Give the other nodes up to ``timeout`` seconds to act on the last message and disconnect."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not any(rank for rank in self._peers):
                    return
            time.sleep(0.05)

    def close(self) -> None:
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            peers = list(self._peers.values())
        for conn in peers:
            conn.close()


class EventKind(str, Enum):
    """What node 0 tells every node."""

    CLUSTER = "cluster"  # every node joined the round: here are all the workers' addresses
    FAILED = "failed"  # the round's first failure, and whether the group restarts
    STOP = "stop"  # a launcher received SIGINT/SIGTERM: every node passes it on to its workers
    TIMEOUT = "timeout"  # a node did not join the round within --timeout
    FINISHED = "finished"  # every node's workers exited 0
    LOST = "lost"  # the connection to node 0 broke


@dataclass(frozen=True)
class JobEvent:
    """One message from node 0 (or the loss of its connection)."""

    kind: EventKind
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def round(self) -> int:
        return int(self.data.get("round", -1))


class RendezvousClient:
    """A node's side: connects, joins each round, reports failures and stops, and hears node 0.

    Args:
        node: this node's options.
        workers_per_node: ``-n``.
        max_restarts: ``--max-restarts`` (must match node 0's).
        interrupted: true once the launcher received a signal; waits then return ``None``.
    """

    def __init__(self, node: NodeOptions, *, workers_per_node: int, max_restarts: int,
                 interrupted: Callable[[], bool]) -> None:
        self.node, self.interrupted = node, interrupted
        self.job = {"nnodes": node.nnodes, "workers_per_node": workers_per_node, "max_restarts": max_restarts}
        self.address = node.node_address or ""
        self.round = 0
        self._conn: _Connection | None = None
        self._events: queue.Queue[JobEvent] = queue.Queue()
        self._closing = False

    def connect(self, timeout: float | None) -> JobEvent | None:
        """Reach node 0 (retrying until ``timeout`` s, as it may start later) and authenticate.

        Returns:
            ``None`` once connected (or when interrupted); a ``TIMEOUT`` event naming rank 0 if node 0
            could not be reached in time.

        Raises:
            LaunchError: node 0 refused this launcher, or did not prove it knows the secret.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_error = "no answer"
        while not self.interrupted():
            try:
                sock = self._open()
            except OSError as error:
                last_error = error.strerror or type(error).__name__
                if deadline is not None and time.monotonic() > deadline:
                    return JobEvent(EventKind.TIMEOUT, {"missing": [0], "arrived": {}, "unreachable": last_error})
                time.sleep(0.5)
                continue
            self._handshake(_Connection(sock))
            return None
        return None

    def _open(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET6 if ":" in self.node.master_host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            if self.node.node_address:
                try:  # so that node 0 sees the advertised address; behind NAT it is not local, and that is fine
                    sock.bind((self.node.node_address, 0))
                except OSError:
                    pass
            sock.settimeout(5.0)
            sock.connect((self.node.master_host, self.node.master_port))
            return sock
        except OSError:
            sock.close()
            raise

    def _handshake(self, conn: _Connection) -> None:
        where = f"node 0's rendezvous at {self.node.master}"
        conn.sock.settimeout(HANDSHAKE_SECONDS)
        challenge = conn.receive()
        if challenge is None or challenge.get("protocol") != PROTOCOL:
            conn.close()
            raise LaunchError(f"Received no {PROTOCOL} challenge from {self.node.master}; expected node 0's launcher "
                              "there. Check --master (the same HOST:PORT on every node).")
        nonce, rank = secrets.token_hex(16), self.node.node_rank
        server_nonce = str(challenge.get("nonce", ""))
        conn.send({"type": "hello", "rank": rank, "job": self.job, "nonce": nonce,
                   "proof": _proof(self.node.secret, "client", server_nonce, nonce, rank)})
        answer = conn.receive() or {"type": "refused", "reason": "it closed the connection"}
        if answer.get("type") != "welcome":
            conn.close()
            raise LaunchError(f"{where} refused this launcher (--node-rank {rank}): {answer.get('reason')}.")
        expected = _proof(self.node.secret, "server", server_nonce, nonce, rank)
        if not hmac.compare_digest(str(answer.get("proof", "")), expected):
            conn.close()
            raise LaunchError(f"{where} did not prove it knows the shared secret; expected node 0's launcher with the "
                              f"same {ENV_LAUNCH_SECRET} or --secret-file. Check --master and the secret.")
        conn.sock.settimeout(None)
        self._conn, self.round = conn, int(answer.get("round", 0))
        if not self.node.node_address:
            self.address = conn.sock.getsockname()[0]
        threading.Thread(target=self._read_loop, args=(conn,), daemon=True).start()

    def _read_loop(self, conn: _Connection) -> None:
        while (message := conn.receive()) is not None:
            try:
                self._events.put(JobEvent(EventKind(message.get("type")), message))
            except ValueError:
                continue
        if not self._closing:
            self._events.put(JobEvent(EventKind.LOST))

    def _send(self, message: Mapping[str, Any]) -> None:
        if self._conn is not None:
            self._conn.send(message)

    def poll(self) -> JobEvent | None:
        """The next event that matters now (stale rounds skipped), without waiting."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return None
            if event.kind in (EventKind.CLUSTER, EventKind.FAILED) and event.round < self.round:
                continue
            return event

    def _wait(self, kinds: tuple[EventKind, ...], timeout: float | None = None) -> JobEvent | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.interrupted():
            event = self.poll()
            if event is not None and event.kind in kinds:
                return event
            if deadline is not None and time.monotonic() > deadline:
                return JobEvent(EventKind.LOST, {"why": f"no answer from node 0 within {timeout:g} s"})
            if event is None:
                time.sleep(0.02)
        return None

    def form(self, round_: int, ports: list[int]) -> JobEvent | None:
        """Offer this node's workers for ``round_``; the ``CLUSTER`` event, or what ended the job instead."""
        self.round = round_
        self._send({"type": "join", "round": round_, "address": self.address, "ports": ports})
        return self._wait((EventKind.CLUSTER, EventKind.STOP, EventKind.TIMEOUT, EventKind.LOST))

    def report_failure(self, round_: int, failure: Mapping[str, Any]) -> JobEvent | None:
        """Tell node 0 a local worker failed; node 0's verdict (the round's first failure, restart or not)."""
        self._send({**failure, "type": "failed", "round": round_})
        return self._wait((EventKind.FAILED, EventKind.STOP, EventKind.LOST), timeout=30.0)

    def finish(self, round_: int) -> JobEvent | None:
        """Tell node 0 this node's workers all exited 0; waits for every node's (or a failure, stop, loss)."""
        self._send({"type": "done", "round": round_})
        return self._wait((EventKind.FINISHED, EventKind.FAILED, EventKind.STOP, EventKind.LOST))

    def request_stop(self, signum: int) -> None:
        """Ask node 0 to stop the whole job (this launcher received ``signum``)."""
        self._send({"type": "stop", "signal": signum})

    def close(self) -> None:
        self._closing = True
        if self._conn is not None:
            self._conn.close()

