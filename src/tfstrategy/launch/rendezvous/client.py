"""A node's side of the rendezvous: connects, joins each round, reports failures and stops, and hears node 0.

Losing node 0 ends this node's part of the job. When node 0's connection closes, fails, goes
silent for the heartbeat's ``dead_after`` seconds, or carries a message that is not authentic
and in sequence, the client reports it (a ``LOST`` event saying why) and never reconnects: node
0's launcher held the job's state (the round, the restarts used, who failed first), and a node 0
started again is a new job with a new identity, which refuses what belonged to the old one. So
every surviving node stops its workers at once with a line saying node 0 is gone and that every
node's launcher must be restarted; none waits for a node 0 that may never come back.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeGuard

from tfstrategy.errors import LaunchError
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
from tfstrategy.launch.rendezvous.options import NodeOptions
from tfstrategy.launch.rendezvous.wire import (
    PROTOCOL,
    TO_CLIENT,
    Abort,
    Closing,
    Done,
    Failed,
    Heartbeat,
    Join,
    Leave,
    LineReader,
    Message,
    ProtocolError,
    Stop,
    Views,
    encode,
    read_json,
)
from tfstrategy.settings import ENV_LAUNCH_SECRET

__all__ = ["EventKind", "JobEvent", "RendezvousClient", "HANDSHAKE_SECONDS"]

#: Seconds node 0 has to complete the handshake.
HANDSHAKE_SECONDS = 10.0
_RESTART_ALL = ("the job cannot go on without node 0's launcher, which held its state: restart 'tfstrategy launch' on "
                "every node (a restarted node 0 starts a new job)")


class EventKind(str, Enum):
    """What node 0 tells every node."""

    CLUSTER = "cluster"  # every node joined the round: here are all the workers' addresses
    REFORM = "reform"  # elastic: a node was lost or joined; the group re-forms as the next round
    FAILED = "failed"  # the round's first failure, and whether the group restarts
    STOP = "stop"  # a launcher received SIGINT/SIGTERM: every node passes it on to its workers
    TIMEOUT = "timeout"  # a node did not join the round within --timeout
    FINISHED = "finished"  # every node's workers exited 0
    LOST = "lost"  # the connection to node 0 broke


@dataclass(frozen=True)
class JobEvent:
    """One message from node 0 (or the loss of its connection): its typed ``message``, and its fields as ``data``."""

    kind: EventKind
    data: Mapping[str, Any] = field(default_factory=dict)
    message: Message | None = None

    @property
    def round(self) -> int:
        return int(self.data.get("round", -1))


def _seconds(value: object) -> TypeGuard[float]:
    """A finite number of seconds (JSON's numbers; never a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _Busy(Exception):
    """Node 0's port answered but the handshake could not start (it sheds load, or is starting): retry."""


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
        self.job = {"nnodes": node.shape, "workers_per_node": workers_per_node, "max_restarts": max_restarts}
        self.address = node.node_address or ""
        self.round = 0
        #: The job's identity, from node 0's welcome.
        self.job_id: str | None = None
        self._channel: Channel | None = None
        self._events: queue.Queue[JobEvent] = queue.Queue()
        self._closing = False

    def connect(self, timeout: float | None) -> JobEvent | None:
        """Reach node 0 (retrying until ``timeout`` s, as it may start later or be busy) and authenticate.

        Returns:
            ``None`` once connected (or when interrupted); a ``TIMEOUT`` event naming rank 0 if node 0
            could not be reached in time.

        Raises:
            LaunchError: node 0 refused this launcher, did not prove it knows the secret, or is not a
                rendezvous of this version.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last_error = "no answer"
        while not self.interrupted():
            try:
                self._handshake(self._open())
                return None
            except (OSError, _Busy) as error:
                last_error = (error.strerror if isinstance(error, OSError) else str(error)) or type(error).__name__
            if deadline is not None and time.monotonic() > deadline:
                return JobEvent(EventKind.TIMEOUT, {"missing": [0], "arrived": {}, "unreachable": last_error})
            time.sleep(0.5)
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

    def _handshake(self, sock: socket.socket) -> None:
        try:
            self._authenticate(sock)
        except BaseException:
            sock.close()
            raise

    def _authenticate(self, sock: socket.socket) -> None:
        where, master = f"node 0's rendezvous at {self.node.master}", self.node.master
        deadline = time.monotonic() + HANDSHAKE_SECONDS
        reader = LineReader(sock)
        try:
            challenge = read_json(reader, deadline=deadline)
        except TimeoutError:
            raise _Busy(f"no {PROTOCOL} challenge within {HANDSHAKE_SECONDS:g} s") from None
        except ProtocolError as error:
            raise LaunchError(f"Received no {PROTOCOL} challenge from {master} (it {error}); expected node 0's "
                              "launcher there. Check --master (the same HOST:PORT on every node).") from None
        if challenge is None:
            raise _Busy("it closed the connection before its challenge (busy, or starting)")
        protocol = challenge.get("protocol")
        if challenge.get("type") != "challenge" or not is_nonce(challenge.get("nonce")) or protocol != PROTOCOL:
            other = (f"it speaks {str(protocol)[:40]}, this launcher {PROTOCOL}: install the same tfstrategy on every "
                     "node" if str(protocol).startswith("tfstrategy-rendezvous/") else
                     "expected node 0's launcher there. Check --master (the same HOST:PORT on every node)")
            raise LaunchError(f"Received no {PROTOCOL} challenge from {master}; {other}.")
        server_nonce, nonce, rank = challenge["nonce"], secrets.token_hex(16), self.node.node_rank
        sock.sendall(encode({"type": "hello", "rank": rank, "job": self.job, "nonce": nonce,
                             "proof": client_proof(self.node.secret, server_nonce, nonce, rank)}))
        try:
            answer = read_json(reader, deadline=deadline)
        except (TimeoutError, ProtocolError) as error:
            raise LaunchError(f"{where} did not answer this launcher's hello ({error}); expected node 0's launcher "
                              "there. Check --master.") from None
        if answer is None:  # a refusal says so: a bare close is node 0 shedding load (or its deadline): retry
            raise _Busy("it closed the connection during the handshake")
        if answer.get("type") != "welcome":
            # Not authenticated: printable characters only, so a stranger on the port cannot drive the terminal.
            reason = "".join(c if c.isprintable() else "?" for c in str(answer.get("reason"))[:500])
            raise LaunchError(f"{where} refused this launcher (--node-rank {rank}): {reason}.")
        if not proof_matches(answer.get("proof"), welcome_proof(self.node.secret, server_nonce, nonce, rank, answer)):
            raise LaunchError(f"{where} did not prove it knows the shared secret; expected node 0's launcher with the "
                              f"same {ENV_LAUNCH_SECRET} or --secret-file. Check --master and the secret.")
        job_id, round_, beat, dead_after = (answer.get(key) for key in ("job_id", "round", "heartbeat", "dead_after"))
        if not (isinstance(job_id, str) and is_nonce(job_id) and isinstance(round_, int) and not isinstance(round_, bool)
                and _seconds(beat) and _seconds(dead_after) and 0 < beat < dead_after <= 3600):
            raise LaunchError(f"{where} sent a welcome this launcher cannot use ({str(answer)[:200]}); install the same "
                              "tfstrategy on every node.")
        to_server, to_client = session_keys(self.node.secret, server_nonce, nonce, job_id, rank)
        channel = Channel(sock, reader, master, sealer=Sealer(to_server, job_id),
                          opener=Opener(to_client, job_id, TO_CLIENT), dead_after=float(dead_after))
        channel.start()
        self._channel, self.round, self.job_id = channel, round_, job_id
        if not self.node.node_address:
            self.address = sock.getsockname()[0]
        threading.Thread(target=self._read_loop, args=(channel,), daemon=True, name="rendezvous reader").start()
        threading.Thread(target=self._beat_loop, args=(channel, float(beat)), daemon=True,
                         name="rendezvous heartbeat").start()

    def _read_loop(self, channel: Channel) -> None:
        try:
            while True:
                message = channel.receive()
                if isinstance(message, Closing):
                    channel.close()
                    self._lost(f"{message.reason}; node 0 stopped the job")
                    return
                if not isinstance(message, Heartbeat):
                    self._events.put(JobEvent(EventKind(message.kind), dataclasses.asdict(message), message))
        except ChannelClosed as closed:
            # Tell node 0 why (best effort: the way back may be intact), so every node stops naming this one.
            if closed.broken:
                channel.close(Abort(reason=closed.reason))
                self._lost(f"it {closed.reason}; this node closed the connection, and node 0 stops the job")
            else:
                channel.close()
                self._lost(f"it {closed.reason}; {_RESTART_ALL}")
        except Exception as error:  # noqa: BLE001 - a bug must end the job with a message, not a dead thread
            channel.close()
            self._lost(f"this launcher's rendezvous failed ({type(error).__name__}: {error})")

    def _lost(self, why: str) -> None:
        if not self._closing:
            self._events.put(JobEvent(EventKind.LOST, {"why": why}))

    @staticmethod
    def _beat_loop(channel: Channel, every: float) -> None:
        while not channel.closed:
            time.sleep(every)
            channel.send(Heartbeat())

    def _send(self, message: Join | Failed | Done | Stop | Leave | Views) -> None:
        if self._channel is not None:
            self._channel.send(message)

    def poll(self) -> JobEvent | None:
        """The next event that matters now (stale rounds skipped), without waiting."""
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                return None
            if event.kind in (EventKind.CLUSTER, EventKind.FAILED) and event.round < self.round:
                continue
            if event.kind is EventKind.REFORM and event.round <= self.round:
                continue  # a re-formation this node already joined
            return event

    def _wait(self, kinds: tuple[EventKind, ...], timeout: float | None = None, *,
              interruptible: bool = True) -> JobEvent | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (interruptible and self.interrupted()):
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
        self._send(Join(round=round_, address=self.address, ports=list(ports)))
        return self._wait((EventKind.CLUSTER, EventKind.REFORM, EventKind.FAILED, EventKind.STOP, EventKind.TIMEOUT,
                           EventKind.LOST))

    def report_failure(self, failure: Failed) -> JobEvent | None:
        """Tell node 0 a local worker failed (whole: :meth:`Failed.bounded`); node 0's decision: the round's root
        cause (the earliest real failure of any node), restart or not."""
        self._send(failure)
        return self._wait((EventKind.FAILED, EventKind.REFORM, EventKind.STOP, EventKind.LOST), timeout=30.0)

    def share_views(self, views: Views) -> None:
        """Send node 0 this node's workers' compact views (for a diagnosis across nodes); no answer."""
        self._send(views)

    def finish(self, round_: int) -> JobEvent | None:
        """Tell node 0 this node's workers all exited 0; waits for every node's (or a failure, stop, loss)."""
        self._send(Done(round=round_))
        return self._wait((EventKind.FINISHED, EventKind.REFORM, EventKind.FAILED, EventKind.STOP, EventKind.LOST))

    def request_leave(self, signum: int, timeout: float) -> JobEvent | None:
        """Ask node 0 to re-form the others without this node (an elastic job); its answer: the ``REFORM`` every node
        hears, or ``STOP`` when the others cannot go on without it."""
        self._send(Leave(signal=signum))
        return self._wait((EventKind.REFORM, EventKind.STOP, EventKind.FAILED, EventKind.LOST), timeout=timeout,
                          interruptible=False)  # this launcher's own signal is what it answers

    def request_stop(self, signum: int) -> None:
        """Ask node 0 to stop the whole job (this launcher received ``signum``)."""
        self._send(Stop(signal=signum))

    def close(self) -> None:
        self._closing = True
        if self._channel is not None:
            self._channel.close(flush=True)  # a last stop or done still reaches node 0
            self._channel.drain(2.0)
