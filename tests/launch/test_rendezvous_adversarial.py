"""The rendezvous under attack: an attacker on the nodes' network, at 127.0.0.4.

Node 0's rendezvous listens on 127.0.0.2, node 1 is at 127.0.0.3. Each attack either has no
effect on the job or ends it with one clear line naming the peer; no thread dies (every test
watches ``threading.excepthook``), nothing hangs (every wait is on an event, bounded only as a
guard). These run at the protocol level, in-process or in small processes without TensorFlow,
with short limits (a 2 s handshake, heartbeats every 0.2 s, dead after 3 s of silence); the
end-to-end ``--nnodes 2`` launches are at the bottom (multiprocess).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tfstrategy.launch.rendezvous import (
    EventKind,
    JobEvent,
    NodeOptions,
    RendezvousClient,
    RendezvousServer,
    ServerLimits,
    handshake,
    wire,
)

MASTER, NODE1, ATTACKER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
SECRET = b"tfstrategy-test-secret-0123456789"
LIMITS = ServerLimits(handshake_seconds=2.0, heartbeat_seconds=0.2, dead_after=3.0)
NODE_SCRIPT = Path(__file__).with_name("rendezvous_node.py")
GUARD = 60.0  # seconds: only a hang guard, never the expectation


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def no_thread_dies() -> Iterator[list[str]]:
    """Fail the test if any thread raised (the rendezvous's threads must never die)."""
    died: list[str] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: died.append(f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
    yield died
    threading.excepthook = previous
    assert died == []


class Job:
    """Node 0's server and launchers' clients, in this process."""

    def __init__(self, *, max_restarts: int = 0, limits: ServerLimits = LIMITS) -> None:
        self.port = _free_port(MASTER)
        self.said: list[str] = []
        self.server = RendezvousServer(self._options(0), workers_per_node=1, max_restarts=max_restarts, timeout=GUARD,
                                       say=self.said.append, limits=limits)
        self.max_restarts = max_restarts
        self.clients: list[RendezvousClient] = []

    def _options(self, rank: int, *, host: str = MASTER, port: int | None = None) -> NodeOptions:
        return NodeOptions(nnodes=2, node_rank=rank, master_host=host, master_port=port or self.port, secret=SECRET,
                           node_address=MASTER if rank == 0 else NODE1)

    def client(self, rank: int, *, host: str = MASTER, port: int | None = None) -> RendezvousClient:
        client = RendezvousClient(self._options(rank, host=host, port=port), workers_per_node=1,
                                  max_restarts=self.max_restarts, interrupted=lambda: False)
        assert client.connect(timeout=GUARD) is None
        self.clients.append(client)
        return client

    def said_line(self, pattern: str) -> str:
        """The first line node 0 said matching ``pattern``, waiting for it."""
        deadline = time.monotonic() + GUARD
        while time.monotonic() < deadline:
            for line in list(self.said):
                if re.search(pattern, line):
                    return line
            time.sleep(0.02)
        raise AssertionError(f"node 0 never said {pattern!r}; it said {self.said}")

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.close()


@pytest.fixture
def job() -> Iterator[Job]:
    job = Job()
    yield job
    job.close()


def wait_for(client: RendezvousClient, *kinds: EventKind) -> JobEvent:
    event = client._wait(kinds, timeout=GUARD)
    assert event is not None and event.kind in kinds, event
    return event


def events_until_lost(client: RendezvousClient, last: JobEvent | None) -> list[JobEvent]:
    """Every later event of ``client`` up to the loss of its connection."""
    events, deadline = [], time.monotonic() + GUARD
    while (last is None or last.kind is not EventKind.LOST) and time.monotonic() < deadline:
        last = client.poll()
        if last is None:
            time.sleep(0.02)
        else:
            events.append(last)
    assert events[-1:] and events[-1].kind is EventKind.LOST or last.kind is EventKind.LOST, events
    return events


def form_both(c0: RendezvousClient, c1: RendezvousClient) -> tuple[JobEvent | None, JobEvent | None]:
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.submit(c0.form, 0, [41000]), pool.submit(c1.form, 0, [41001])
        return first.result(GUARD), second.result(GUARD)


# --- the seal itself -----------------------------------------------------------------------------


def test_a_sealed_message_opens_only_on_its_connection_its_job_and_its_turn():
    keys_a = handshake.session_keys(SECRET, "a" * 32, "b" * 32, "1" * 16, 1)
    keys_b = handshake.session_keys(SECRET, "a" * 32, "c" * 32, "1" * 16, 1)  # another connection of the same job
    assert len(set(keys_a + keys_b)) == 4  # fresh per connection, different per direction
    line = handshake.Sealer(keys_a[0], "1" * 16).seal(wire.Stop(signal=15)).rstrip(b"\n")
    assert handshake.Opener(keys_a[0], "1" * 16, wire.TO_SERVER).open(line) == wire.Stop(signal=15)
    cases = [
        (handshake.Opener(keys_b[0], "1" * 16, wire.TO_SERVER), "failed authentication"),  # another connection
        (handshake.Opener(keys_a[1], "1" * 16, wire.TO_SERVER), "failed authentication"),  # reflected to its sender
        (handshake.Opener(keys_a[0], "2" * 16, wire.TO_SERVER), "another job"),  # a job with another identity
    ]
    for opener, message in cases:
        with pytest.raises(wire.ProtocolError, match=message):
            opener.open(line)
    later = handshake.Opener(keys_a[0], "1" * 16, wire.TO_SERVER)
    later.seq = 1
    with pytest.raises(wire.ProtocolError, match="message number 0, expected 1"):
        later.open(line)


# --- a man in the middle ----------------------------------------------------------------------


class Relay:
    """A man in the middle at 127.0.0.4: passes the handshake through, then lets ``attack`` rewrite
    each sealed line of one direction (``to_client``: node 0 -> node 1): it returns the lines to send."""

    def __init__(self, target: int, attack: Callable[[int, bytes], list[bytes]], *, to_client: bool) -> None:
        self.target, self.attack, self.to_client = target, attack, to_client
        self.listener = socket.create_server((ATTACKER, 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return
            try:  # node 0 may not listen yet: then node 1 sees a closed connection and retries
                outside = socket.create_connection((MASTER, self.target), source_address=(ATTACKER, 0))
            except OSError:
                inside.close()
                continue
            threading.Thread(target=self._pump, args=(inside, outside, not self.to_client, 1), daemon=True).start()
            threading.Thread(target=self._pump, args=(outside, inside, self.to_client, 2), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, attacked: bool, handshake_lines: int) -> None:
        reader, index = wire.LineReader(source, limit=wire.MAX_LINE), 0
        try:
            while (line := reader.read_line()) is not None:
                if handshake_lines:
                    handshake_lines -= 1
                    sink.sendall(line + b"\n")
                    continue
                for out in (self.attack(index, line) if attacked else [line]):
                    sink.sendall(out + b"\n")
                index += 1
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        # close() alone leaves the accepting thread blocked for the rest of the pytest worker; shutdown wakes it.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def _payload(line: bytes) -> dict:
    return json.loads(line.partition(b" ")[2])


def _reseal_forged(line: bytes, change: Callable[[dict], dict]) -> bytes:
    """The line with its payload changed and its MAC kept (the attacker does not have the key)."""
    mac, _, payload = line.partition(b" ")
    return mac + b" " + json.dumps(change(json.loads(payload)), separators=(",", ":")).encode()


def _rewrite_cluster(index: int, line: bytes) -> list[bytes]:
    if _payload(line)["type"] == "cluster":
        return [_reseal_forged(line, lambda p: {**p, "workers": [f"{ATTACKER}:6666", *p["workers"][1:]]})]
    return [line]


def _inject_stop(index: int, line: bytes) -> list[bytes]:
    if index == 0:
        forged = {"job": _payload(line)["job"], "seq": _payload(line)["seq"], "type": "stop", "signal": 15}
        return [secrets.token_hex(32).encode() + b" " + json.dumps(forged).encode(), line]
    return [line]


def _replay(index: int, line: bytes) -> list[bytes]:
    return [line, line] if index == 0 else [line]


class _Reorder:
    def __init__(self) -> None:
        self.held: bytes | None = None

    def __call__(self, index: int, line: bytes) -> list[bytes]:
        if index == 0:
            self.held = line
            return []
        if index == 1 and self.held is not None:
            return [line, self.held]
        return [line]


def _drop_cluster(index: int, line: bytes) -> list[bytes]:
    return [] if _payload(line)["type"] == "cluster" else [line]


MITM_ATTACKS = [
    # (id, attack, direction node 0 -> node 1, what the detecting side reports)
    pytest.param(_rewrite_cluster, True, "failed authentication", id="rewrite-cluster-to-node-1"),
    pytest.param(_inject_stop, True, "failed authentication", id="inject-stop-to-node-1"),
    pytest.param(_inject_stop, False, "failed authentication", id="inject-stop-to-node-0"),
    pytest.param(_replay, True, "message number 0, expected 1", id="replay-to-node-1"),
    pytest.param(_replay, False, "message number 0, expected 1", id="replay-to-node-0"),
    pytest.param(_Reorder, True, "message number 1, expected 0", id="reorder-to-node-1"),
    pytest.param(_Reorder, False, "message number 1, expected 0", id="reorder-to-node-0"),
    pytest.param(_drop_cluster, True, r"message number \d+, expected \d+ \(replayed, reordered or dropped",
                 id="drop-cluster-to-node-1"),
]


@pytest.mark.parametrize(("attack", "to_client", "detected"), MITM_ATTACKS)
def test_a_man_in_the_middle_ends_the_job_naming_node_1_and_changes_nothing(job, attack, to_client, detected):
    attack = attack() if isinstance(attack, type) else attack
    relay = Relay(job.port, attack, to_client=to_client)
    try:
        c0, c1 = job.client(0), job.client(1, host=ATTACKER, port=relay.port)
        formed0, formed1 = form_both(c0, c1)
        # Node 1 never starts workers on a cluster the attacker touched: it stops, saying why.
        events1 = [formed1] + events_until_lost(c1, formed1)
        assert all(e.kind is not EventKind.CLUSTER or f"{ATTACKER}:6666" not in e.data["workers"] for e in events1)
        lost = events1[-1]
        assert re.search(detected, lost.data["why"]) or "node 0 closed this node's connection" in lost.data["why"]
        # Node 0 ends the whole job at once, naming node 1 and the address its connection came from.
        verdict = formed0 if formed0.kind is EventKind.FAILED else wait_for(c0, EventKind.FAILED)
        assert verdict.data["node"] == 1 and verdict.data["restart"] is False
        assert "broke the rendezvous protocol (127.0.0.4:" in verdict.data["reason"]
        line = job.said_line(r"node 1 at 127\.0\.0\.4:\d+ .*closed its connection")
        assert re.search(detected, line) or "reported that node 0's messages reached it broken" in line
        # A forged stop stopped nothing: no stop event anywhere.
        assert all(e.kind is not EventKind.STOP for e in events1)
    finally:
        relay.close()


def test_the_handshake_through_a_relay_proves_nothing_to_a_stranger(job):
    """A relay that passes every line through unchanged is harmless: the job forms as usual."""
    relay = Relay(job.port, lambda index, line: [line], to_client=True)
    try:
        c0, c1 = job.client(0), job.client(1, host=ATTACKER, port=relay.port)
        formed0, formed1 = form_both(c0, c1)
        assert formed0.kind is formed1.kind is EventKind.CLUSTER
        assert formed0.data["workers"] == formed1.data["workers"] == [f"{MASTER}:41000", f"{NODE1}:41001"]
    finally:
        relay.close()


# --- an authenticated peer that sends nonsense --------------------------------------------------


def raw_handshake(port: int, rank: int = 1, *, rcvbuf: int | None = None, max_restarts: int = 0):
    """A launcher written by hand: the real handshake, then the socket, its reader and both directions."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((NODE1, 0))
    sock.connect((MASTER, port))
    reader = wire.LineReader(sock)
    deadline = time.monotonic() + GUARD
    challenge = wire.read_json(reader, deadline=deadline)
    nonce = secrets.token_hex(16)
    job = {"nnodes": "2", "workers_per_node": 1, "max_restarts": max_restarts}
    sock.sendall(wire.encode({"type": "hello", "rank": rank, "job": job, "nonce": nonce,
                              "proof": handshake.client_proof(SECRET, challenge["nonce"], nonce, rank)}))
    welcome = wire.read_json(reader, deadline=deadline)
    to_server, to_client = handshake.session_keys(SECRET, challenge["nonce"], nonce, welcome["job_id"], rank)
    reader.limit = wire.MAX_LINE
    return sock, reader, handshake.Sealer(to_server, welcome["job_id"]), handshake.Opener(to_client, welcome["job_id"], wire.TO_CLIENT)


def _sealed(sealer: handshake.Sealer, payload: dict) -> bytes:
    data = json.dumps({"job": sealer.job_id, "seq": sealer.seq, **payload}).encode()
    sealer.seq += 1
    return handshake._mac(sealer._key, data).encode() + b" " + data + b"\n"


FAILED = {"type": "failed", "round": 0, "worker": 0, "reason": "x", "status": 1, "time": 1.5e9, "consequential": False,
          "outcome": "failed", "lines": [], "logs": [], "diagnosis": [], "views": []}


@pytest.mark.parametrize(
    ("payload", "reported"),
    [
        pytest.param({"type": "join", "ports": ["x"]}, r"sent a join message with fields \['ports'\]; expected "
                     r"\['round', 'address', 'ports'\]", id="join-ports-x"),
        pytest.param({"type": "join", "round": 0, "address": NODE1, "ports": ["x"]},
                     r"join\.ports\[0\] is 'x'; expected an integer 1\.\.65535", id="join-ports-not-numbers"),
        pytest.param({"type": "join", "round": 0, "address": NODE1, "ports": [1, 2, 3]},
                     r"offered 3 port\(s\); expected -n 1", id="join-too-many-ports"),
        pytest.param({"type": "join", "round": 0, "address": "a b;c", "ports": [5]}, r"join\.address is 'a b;c'",
                     id="join-bad-address"),
        pytest.param({**FAILED, "worker": True}, r"failed\.worker is True", id="failed-bool-worker"),
        pytest.param({**FAILED, "time": float("nan")}, r"failed\.time is 'nan'; expected seconds", id="failed-nan-time"),
        pytest.param({**FAILED, "time": -1}, r"failed\.time is '-1'; expected seconds", id="failed-negative-time"),
        pytest.param({**FAILED, "consequential": "yes"}, r"failed\.consequential is 'yes'; expected true or false",
                     id="failed-consequential-text"),
        pytest.param({**FAILED, "outcome": "succeeded"}, r"failed\.outcome is 'succeeded'; expected one of failed",
                     id="failed-outcome-not-a-failure"),
        pytest.param({**FAILED, "logs": ["a"] * 5}, r"failed\.logs is .*; expected a list of at most 4",
                     id="failed-too-many-logs"),
        pytest.param({**FAILED, "diagnosis": ["a line"] * 21}, r"failed\.diagnosis is .*; expected a list of at most 20",
                     id="failed-diagnosis-too-long"),
        pytest.param({**FAILED, "diagnosis": [3]}, r"failed\.diagnosis\[0\] is '3'; expected text",
                     id="failed-diagnosis-not-text"),
        pytest.param({key: value for key, value in FAILED.items() if key != "time"},
                     r"sent a failed message with fields .*; expected \['round', 'worker', 'reason', 'status', 'time'",
                     id="failed-without-time"),
        pytest.param({**FAILED, "views": [{"index": 0}]}, r"failed\.views\[0\] is \['index'\]; expected an object of",
                     id="failed-view-incomplete"),
        pytest.param({"type": "views", "round": 0, "views": ["x"]}, r"views\.views\[0\] is 'x'; expected an object of",
                     id="views-not-objects"),
        pytest.param({"type": "teleport"}, r"type 'teleport'; expected one of", id="unknown-type"),
        pytest.param({"type": "stop", "signal": 15, "extra": 1}, r"sent a stop message with fields", id="extra-field"),
    ],
)
def test_a_malformed_message_from_an_authenticated_peer_ends_the_job_naming_it(job, payload, reported):
    c0 = job.client(0)
    sock, reader, sealer, opener = raw_handshake(job.port)
    with sock:
        sock.sendall(_sealed(sealer, payload))
        line = job.said_line(r"node 1 at 127\.0\.0\.3:\d+ ")
        assert re.search(reported, line) and line.endswith("closed its connection"), line
        verdict = wait_for(c0, EventKind.FAILED)
        assert verdict.data["node"] == 1 and re.search(reported, verdict.data["reason"])
        # The peer gets node 0's last word, then the end of the stream.
        messages = []
        while (received := reader.read_line(idle=GUARD)) is not None:
            messages.append(opener.open(received))
        assert isinstance(messages[-1], wire.Closing) and re.search(reported, messages[-1].reason)
    assert set(job.server.connected()) == {0}


@pytest.mark.parametrize(("offered", "claimed", "taken_by", "ended", "why"), [
    pytest.param("same", 1, None, False, None, id="welcome"),
    pytest.param({"nnodes": 3}, 1, None, False, r"^it runs --nnodes 3 -n None .*; node 0 runs --nnodes 2 -n 1 "
                 r"--max-restarts 0\. Use the same", id="other-job"),
    pytest.param("same", 2, None, False, r"^expected a rank 0\.\.1$", id="rank-out-of-range"),
    pytest.param("same", 1, "127.0.0.3:5000", False, r"^rank 1 is taken by the node at 127\.0\.0\.3:5000\. Give each",
                 id="rank-taken"),
    pytest.param("same", 1, None, True, r"^the job has ended$", id="ended-untold"),
])
def test_the_admission_rule_names_what_differs_without_sockets(offered, claimed, taken_by, ended, why):
    from tfstrategy.launch.rendezvous.rounds import refusal

    job = {"nnodes": 2, "workers_per_node": 1, "max_restarts": 0}
    node = NodeOptions(nnodes=2, node_rank=0, master_host=MASTER, master_port=1, secret=SECRET, node_address=MASTER)
    said = refusal(node, job, job if offered == "same" else offered, claimed, taken_by=taken_by, ended=ended)
    assert (said is None) if why is None else (said is not None and re.search(why, said)), said


def test_node_0s_own_launcher_joining_after_node_1_broke_the_protocol_is_told_why_the_job_ended(job):
    """A full run's flake (stop 52's session): node 1's forged message ended the job before node 0's own launcher
    had joined its in-process rendezvous, which then refused it ("the job has ended"): node 0 exited 2 without
    naming node 1. A node that arrives after a failure ended the job is welcomed and told that failure."""
    sock, reader, sealer, _ = raw_handshake(job.port)
    with sock:
        sock.sendall(_sealed(sealer, {"type": "teleport"}))
        job.said_line(r"node 1 at 127\.0\.0\.3:\d+ .*closed its connection")
    c0 = job.client(0)  # asserts that it was welcomed
    verdict = c0.form(0, [41000])
    assert verdict is not None and verdict.kind is EventKind.FAILED, verdict
    assert verdict.data["node"] == 1 and verdict.data["restart"] is False
    assert "broke the rendezvous protocol (127.0.0.3:" in verdict.data["reason"]
    assert not any("refused" in line for line in job.said), job.said


def test_an_authentic_line_over_the_size_limit_is_a_protocol_error_not_a_dead_thread(job):
    job.client(0)
    sock, reader, sealer, _ = raw_handshake(job.port)
    with sock:
        try:
            sock.sendall(b"x" * (wire.MAX_LINE + 10))
        except OSError:  # node 0 may close it before all is sent
            pass
        assert "sent more than" in job.said_line(r"node 1 at 127\.0\.0\.3:\d+ ")



@pytest.mark.parametrize(
    ("answer", "message"),
    [
        pytest.param({"type": "welcome", "job_id": "1" * 16, "round": 0, "heartbeat": 2, "dead_after": 10,
                      "proof": "0" * 64}, "did not prove it knows the shared secret", id="wrong-proof"),
        pytest.param({"type": "welcome", "proof": ["not", "text"]}, "did not prove it knows the shared secret",
                     id="proof-not-text"),
        pytest.param({"type": "refused", "reason": "go away\x1b[2J\x07"}, r"refused this launcher \(--node-rank 1\): "
                     r"go away\?\[2J\?\.", id="refusal-with-terminal-escapes"),
    ],
)
def test_an_impostor_node_0_is_refused_by_the_launcher(answer, message):
    """Something else listens on --master: it cannot pass for node 0 without the secret."""
    from tfstrategy.errors import LaunchError

    listener = socket.create_server((ATTACKER, 0))

    def impostor() -> None:
        sock, _ = listener.accept()
        with sock:
            sock.sendall(wire.encode({"type": "challenge", "protocol": wire.PROTOCOL, "nonce": "c" * 32}))
            wire.LineReader(sock).read_line(deadline=time.monotonic() + GUARD)
            sock.sendall(wire.encode(answer))

    threading.Thread(target=impostor, daemon=True).start()
    node = NodeOptions(nnodes=2, node_rank=1, master_host=ATTACKER, master_port=listener.getsockname()[1],
                       secret=SECRET, node_address=NODE1)
    client = RendezvousClient(node, workers_per_node=1, max_restarts=0, interrupted=lambda: False)
    try:
        with pytest.raises(LaunchError, match=message):
            client.connect(timeout=GUARD)
    finally:
        listener.close()


# --- resources: floods, slowloris, a stalled reader ----------------------------------------------


def test_slowloris_is_dropped_at_the_handshake_deadline_and_the_job_forms(job):
    sock = socket.create_connection((MASTER, job.port), source_address=(ATTACKER, 0))
    started, sent = time.monotonic(), 0
    with sock:
        sock.settimeout(0.3)
        hello = b'{"type": "hello", "rank": 1, "nonce": "' + b"a" * 64
        closed = False
        while not closed and sent < len(hello):
            try:
                sock.sendall(hello[sent:sent + 1])
                sent += 1
                while True:  # the challenge, then the end of the stream once node 0 drops us
                    if sock.recv(4096) == b"":
                        closed = True
                        break
            except TimeoutError:
                continue
            except OSError:
                closed = True
        elapsed = time.monotonic() - started
    assert closed, "a client sending one byte every 0.3 s kept its connection"
    assert elapsed < 10 * LIMITS.handshake_seconds and sent < len(hello)
    assert f"no {wire.PROTOCOL} hello within {LIMITS.handshake_seconds:g} s" in job.said_line(r"dropped a connection from 127\.0\.0\.4")
    formed0, formed1 = form_both(job.client(0), job.client(1))
    assert formed0.kind is formed1.kind is EventKind.CLUSTER


def test_a_stalled_reader_freezes_no_one_and_is_dropped():
    job = Job(max_restarts=1)
    try:
        c0 = job.client(0)
        sock, _, sealer, _ = raw_handshake(job.port, rcvbuf=4096, max_restarts=1)
        with sock:
            sock.sendall(_sealed(sealer, {"type": "join", "round": 0, "address": NODE1, "ports": [41001]}))
            stop_beats = threading.Event()

            def beat() -> None:  # alive, but never reads again
                while not stop_beats.wait(0.2):
                    try:
                        sock.sendall(_sealed(sealer, {"type": "heartbeat"}))
                    except OSError:
                        return

            threading.Thread(target=beat, daemon=True).start()
            assert c0.form(0, [41000]).kind is EventKind.CLUSTER
            node1 = next(peer for rank, peer in job.server._peers.items() if rank == 1)
            node1.channel.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # a full network path
            # ~200 KB of last lines, which node 1 never reads: node 0 must answer node 0's launcher anyway.
            verdict = c0.report_failure(wire.Failed.bounded(round=0, worker=0, reason="exited 1", status=1, time=time.time(),
                                                            consequential=False, outcome="failed",
                                                            lines=["y" * 2000] * 100, logs=[]))
            assert verdict.kind is EventKind.FAILED and verdict.data["restart"] is True
            assert job.server.connected()  # its lock is free
            line = job.said_line(r"node 1 at 127\.0\.0\.3:\d+ read nothing of its messages for 3 s \(stalled\)")
            assert "its seat waits for it until --timeout" in line
            stop_beats.set()
    finally:
        job.close()


def _node_process(*args: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, str(NODE_SCRIPT), *args], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return process


def _read_until(process: subprocess.Popen, pattern: str, seen: list[str]) -> str:
    """The first line of ``process`` matching ``pattern`` (everything read goes to ``seen``)."""
    assert process.stdout is not None
    deadline = time.monotonic() + GUARD
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the process ended without {pattern!r}: {seen}")
        seen.append(line.rstrip("\n"))
        if re.search(pattern, line):
            return line.rstrip("\n")
    raise AssertionError(f"no {pattern!r} in {seen}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=GUARD)


@pytest.fixture
def attacker_fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _flood(port: int, count: int) -> list[socket.socket]:
    held = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((ATTACKER, 0))
        sock.connect_ex((MASTER, port))
        held.append(sock)
    return held


def test_1100_connections_at_a_1024_descriptor_limit_do_not_keep_node_1_out(attacker_fds):
    port, seen = _free_port(MASTER), []
    node0 = _node_process("server", MASTER, str(port), "--nofile", "1024")
    flood: list[socket.socket] = []
    try:
        _read_until(node0, "READY", seen)
        flood = _flood(port, 1100)
        _read_until(node0, r"refused connections from 127\.0\.0\.4: too many unauthenticated connections", seen)
        job = Job()  # only for its client
        try:
            c1 = job.client(1, port=port)  # while the 1100 are held open
            assert c1.form(0, [41001]).kind is EventKind.CLUSTER
        finally:
            job.close()
        _read_until(node0, r"event: cluster", seen)
    finally:
        for sock in flood:
            sock.close()
        _stop(node0)
    assert not any("THREAD DIED" in line or "EMFILE" in line for line in seen), seen


def test_the_accept_loop_survives_running_out_of_descriptors(attacker_fds):
    port, seen = _free_port(MASTER), []
    node0 = _node_process("server", MASTER, str(port), "--spare-fds", "4", "--no-client")
    flood: list[socket.socket] = []
    try:
        _read_until(node0, "READY", seen)
        flood = _flood(port, 40)
        line = _read_until(node0, r"cannot accept connections \(EMFILE", seen)
        assert "the job goes on" in line
        for sock in flood:
            sock.close()
        flood = []
        job = Job()
        try:  # the same loop serves again once descriptors are free (handshakes have a deadline)
            c0, c1 = job.client(0, port=port), job.client(1, port=port)
            formed0, formed1 = form_both(c0, c1)
            assert formed0.kind is formed1.kind is EventKind.CLUSTER
        finally:
            job.close()
    finally:
        for sock in flood:
            sock.close()
        _stop(node0)
    assert not any("THREAD DIED" in line for line in seen), seen


# --- a frozen node, node 0 killed and restarted ------------------------------------------------


def test_a_frozen_node_is_noticed_within_dead_after_and_named(job):
    c0, seen = job.client(0), []
    node1 = _node_process("client", "1", MASTER, str(job.port), NODE1)
    try:
        _read_until(node1, "READY connected", seen)
        assert c0.form(0, [41000]).kind is EventKind.CLUSTER
        _read_until(node1, "event: cluster", seen)
        node1.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        verdict = wait_for(c0, EventKind.FAILED)
        noticed = time.monotonic() - frozen
        assert verdict.data["node"] == 1 and "sent nothing for 3 s" in verdict.data["reason"]
        assert "its launcher is frozen or was stopped, or the network between the nodes failed" in verdict.data["reason"]
        print(f"frozen node noticed {noticed:.2f} s after SIGSTOP (dead_after {LIMITS.dead_after} s)")
        node1.send_signal(signal.SIGCONT)
        lost = _read_until(node1, "event: lost", seen)
        assert "restart 'tfstrategy launch' on every node" in lost
    finally:
        node1.send_signal(signal.SIGCONT)
        _stop(node1)
    assert not any("THREAD DIED" in line for line in seen), seen


def test_node_0_killed_and_restarted_the_survivor_stops_and_a_new_job_starts_clean():
    port, seen = _free_port(MASTER), []
    node0 = _node_process("server", MASTER, str(port))
    job = Job()
    try:
        old_job = _read_until(node0, "READY job", seen).split()[-1]
        c1 = job.client(1, port=port)
        assert c1.job_id == old_job and c1.form(0, [41001]).kind is EventKind.CLUSTER
        node0.kill()
        node0.wait()
        lost = wait_for(c1, EventKind.LOST)
        assert "restart 'tfstrategy launch' on every node (a restarted node 0 starts a new job)" in lost.data["why"]
        # node 0 restarted on the same port: a new job; the survivor does not come back on its own ...
        node0 = _node_process("server", MASTER, str(port))
        new_job = _read_until(node0, "READY job", seen).split()[-1]
        assert new_job != old_job
        assert c1._channel.closed and c1.poll() is None
        # ... and a launcher started again joins the new job.
        again = job.client(1, port=port)
        assert again.job_id == new_job and again.form(0, [41001]).kind is EventKind.CLUSTER
    finally:
        job.close()
        _stop(node0)
    assert not any("THREAD DIED" in line for line in seen), seen


def test_a_frozen_node_0_is_noticed_by_node_1_within_dead_after():
    port, seen = _free_port(MASTER), []
    node0 = _node_process("server", MASTER, str(port))
    job = Job()
    try:
        _read_until(node0, "READY job", seen)
        c1 = job.client(1, port=port)
        assert c1.form(0, [41001]).kind is EventKind.CLUSTER
        node0.send_signal(signal.SIGSTOP)
        lost = wait_for(c1, EventKind.LOST)
        assert "it sent nothing for 3 s (its launcher is frozen or was stopped" in lost.data["why"]
        assert "restart 'tfstrategy launch' on every node" in lost.data["why"]
    finally:
        node0.send_signal(signal.SIGCONT)
        job.close()
        _stop(node0)


# --- end to end: two real launchers (multiprocess) -----------------------------------------------


def _launchers(tmp_path: Path, *job: str):
    from test_launch import Run

    from tfstrategy.settings import ENV_LAUNCH_SECRET

    secret = secrets.token_hex(32)
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o600)
    master = f"{MASTER}:{_free_port(MASTER)}"
    common = ("--nnodes", "2", "--master", master)
    env = {key: value for key, value in os.environ.items() if key != ENV_LAUNCH_SECRET}
    with pytest.MonkeyPatch.context() as patch:  # Run starts from os.environ
        patch.setattr(os, "environ", env)
        node0 = Run(*common, "--node-rank", "0", "--node-address", MASTER, "--secret-file", str(secret_file), *job)
        node1 = Run(*common, "--node-rank", "1", "--node-address", NODE1, *job, env={ENV_LAUNCH_SECRET: secret})
    return secret, node0, node1


def _wait_for_processes(*runs, count: int) -> None:
    from test_launch import _tagged

    deadline = time.monotonic() + GUARD
    while any(len(_tagged(run.tag)) < count for run in runs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(len(_tagged(run.tag)) >= count for run in runs)


@pytest.mark.multiprocess
def test_two_launchers_keep_the_secret_out_of_workers_argv_and_logs_and_name_a_frozen_node(tmp_path):
    from test_launch import PLAIN_WORKER, _tagged

    secret, node0, node1 = _launchers(tmp_path, "-n", "2", "--timeout", "60", "--", sys.executable, str(PLAIN_WORKER),
                                      "sleep")
    try:
        _wait_for_processes(node0, node1, count=6)  # per node: the launcher, its reaper, 2 workers, their 2 children
        launchers = {node0.process.pid, node1.process.pid}
        for run in (node0, node1):
            for pid in _tagged(run.tag):
                proc = Path(f"/proc/{pid}")
                assert secret.encode() not in (proc / "cmdline").read_bytes()
                if pid not in launchers or run is node0:  # node 1's user put it in its launcher's environment
                    assert secret.encode() not in (proc / "environ").read_bytes(), pid
        node1.process.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        code0, out0, err0, _ = node0.finish(GUARD)
        noticed = time.monotonic() - frozen
        node1.process.send_signal(signal.SIGCONT)
        code1, out1, err1, _ = node1.finish(GUARD)
    finally:
        node1.process.send_signal(signal.SIGCONT)
        for run in (node0, node1):
            run.finish(GUARD)
    print(f"a SIGSTOPped node 1 ended the job {noticed:.1f} s later (heartbeat every 2 s, dead after 10 s)")
    assert code0 == 1, err0
    assert re.search(r"node 1's launcher lost its control connection \(127\.0\.0\.3:\d+\): it sent nothing for 10 s "
                     r"\(its launcher is frozen or was stopped", err0), err0
    assert code1 == 1, err1
    assert "lost the connection to node 0's rendezvous" in err1 and "restart 'tfstrategy launch' on every node" in err1
    from tfstrategy.launch.exposure import network_interfaces

    for err in (err0, err1):  # warned exactly when an interface beyond loopback is up
        warned = "TensorFlow's servers of this node's workers listen on every interface" in err
        assert warned == bool(network_interfaces()), err
    for text in (out0, err0, out1, err1):
        assert secret not in text


@pytest.mark.multiprocess
def test_node_0_killed_node_1_stops_at_once_saying_every_node_must_restart(tmp_path):
    from test_launch import PLAIN_WORKER

    _, node0, node1 = _launchers(tmp_path, "-n", "1", "--timeout", "60", "--", sys.executable, str(PLAIN_WORKER), "sleep")
    try:
        _wait_for_processes(node0, node1, count=4)  # per node: the launcher, its reaper, a worker, its child
        node0.process.kill()
        killed = time.monotonic()
        code1, _, err1, _ = node1.finish(GUARD)
        print(f"node 1 stopped {time.monotonic() - killed:.1f} s after node 0's launcher was killed")
    finally:
        for run in (node0, node1):
            run.finish(GUARD)
    assert code1 == 1, err1
    assert re.search(r"lost the connection to node 0's rendezvous at 127\.0\.0\.2:\d+ \(it closed the connection; the "
                     r"job cannot go on without node 0's launcher", err1), err1


@pytest.mark.multiprocess
@pytest.mark.parametrize(("attack", "to_client"), [pytest.param(_rewrite_cluster, True, id="rewrite-cluster"),
                                                   pytest.param(_inject_stop, False, id="inject-stop")])
def test_two_launchers_behind_a_man_in_the_middle_stop_naming_node_1(tmp_path, attack, to_client):
    """The issue's attacks on real launchers: node 1 reaches node 0 through a relay at 127.0.0.4."""
    from test_launch import PLAIN_WORKER, Run

    from tfstrategy.settings import ENV_LAUNCH_SECRET

    port = _free_port(MASTER)
    relay = Relay(port, attack, to_client=to_client)
    secret = secrets.token_hex(32)
    job = ("-n", "1", "--timeout", "60", "--", sys.executable, str(PLAIN_WORKER), "sleep")
    node0 = Run("--nnodes", "2", "--node-rank", "0", "--master", f"{MASTER}:{port}", "--node-address", MASTER, *job,
                env={ENV_LAUNCH_SECRET: secret})
    node1 = Run("--nnodes", "2", "--node-rank", "1", "--master", f"{ATTACKER}:{relay.port}", "--node-address", NODE1,
                *job, env={ENV_LAUNCH_SECRET: secret})
    try:
        code0, out0, err0, _ = node0.finish(GUARD)
        code1, out1, err1, _ = node1.finish(GUARD)
    finally:
        relay.close()
    assert (code0, code1) == (1, 1), err0 + err1
    assert (node0.survivors, node1.survivors) == ([], []), err0 + err1  # no worker, child or reaper outlives its launcher
    assert re.search(r"node 1's launcher broke the rendezvous protocol \(127\.0\.0\.4:\d+\)", err0), err0
    assert "received SIGTERM" not in err0 + err1  # a forged stop stops nothing
    assert f"{ATTACKER}:6666" not in out1  # no worker ever got the attacker's address in its TF_CONFIG
    assert re.search(r"(lost the connection to node 0's rendezvous at 127\.0\.0\.4:\d+ \(it sent a message that failed "
                     r"authentication|node 0 closed this node's connection: it sent a message that failed authentication)",
                     err1), err1
    print(err0.strip().splitlines()[-1][:300])
    print(err1.strip().splitlines()[-1][:300])
