"""`tfstrategy launch --nnodes`: several launchers, one rendezvous, supervision across nodes.

Each "node" is its own launcher process whose workers are reached at its own loopback address
(node r at 127.0.0.<r+2>); the rendezvous listens on 127.0.0.2. Nothing listens beyond loopback
except TensorFlow's own servers (0.0.0.0, hard-coded in TensorFlow). Every run is bounded in time
and tagged, so each test checks that no process of either node is left behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from test_launch import PLAIN_WORKER, Run, _tagged

from helpers import ROOT, free_ports, node_port_range
from tfstrategy.cli import build_parser
from tfstrategy.cli.launch import node_options_from_args, options_from_args
from tfstrategy.errors import LaunchError
from tfstrategy.launch.nodes import failure_from_event
from tfstrategy.launch.rendezvous import EventKind, NodeOptions, RendezvousClient, RendezvousServer, ServerLimits
from tfstrategy.launch.rendezvous.wire import Failed
from tfstrategy.settings import ENV_LAUNCH_SECRET, ENV_NODE_RANK

SECRET = "tfstrategy-test-secret-0123456789"
EXAMPLE = [sys.executable, str(ROOT / "examples" / "multi_worker_train.py"), "--epochs", "2"]
MASTER_HOST = "127.0.0.2"


def _free_port(host: str = MASTER_HOST) -> int:
    return free_ports(1, host)[0]


def _node(rank: int, master: str, *args: str, secret: str = SECRET, address: str | None = None) -> Run:
    ports = [] if "--port-range" in args else node_port_range(rank)
    return Run("--nnodes", "2", "--node-rank", str(rank), "--master", master,
               "--node-address", address or f"127.0.0.{rank + 2}", *ports, *args, env={ENV_LAUNCH_SECRET: secret})


def _finish_all(*runs: Run, timeout: float) -> list[tuple[int, str, str, float]]:
    deadline = time.monotonic() + timeout
    results = [run.finish(max(1.0, deadline - time.monotonic())) for run in runs]
    for run in runs:
        assert run.survivors == []  # listed when its launcher had returned, before the guard cleans up
    return results


def _final_losses(out: str) -> list[float]:
    return [float(m.group(1)) for m in re.finditer(r"\] final loss ([0-9.]+) steps", out)]


# --- options ---------------------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["launch", *argv, "--", "true"])


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        pytest.param(["--nnodes", "2", "--node-rank", "1", "--master", "h:29400", "-n", "1"], {},
                     "without a shared secret; expected TFSTRATEGY_LAUNCH_SECRET or --secret-file", id="no-secret"),
        pytest.param(["--nnodes", "2", "--node-rank", "1", "--master", "h:29400", "-n", "1"], {ENV_LAUNCH_SECRET: "short"},
                     "secret of 5 byte", id="short-secret"),
        pytest.param(["--nnodes", "2", "--node-rank", "2", "--master", "h:29400", "-n", "1"], {ENV_LAUNCH_SECRET: SECRET},
                     r"--node-rank 2 \(or TFSTRATEGY_NODE_RANK\) for --nnodes 2; expected 0..1", id="rank-too-high"),
        pytest.param(["--nnodes", "2", "--master", "h:29400", "-n", "1"], {ENV_LAUNCH_SECRET: SECRET},
                     "without --node-rank, and TFSTRATEGY_NODE_RANK=''", id="no-rank"),
        pytest.param(["--nnodes", "2", "--node-rank", "0", "-n", "1"], {ENV_LAUNCH_SECRET: SECRET}, "without --master", id="no-master"),
        pytest.param(["--nnodes", "2", "--node-rank", "0", "--master", "h", "-n", "1"], {ENV_LAUNCH_SECRET: SECRET},
                     "--master 'h'; expected HOST:PORT", id="master-without-port"),
        pytest.param(["--node-rank", "1", "-n", "1"], {}, "--node-rank with --nnodes 1", id="rank-without-nnodes"),
        pytest.param(["--nnodes", "2", "--node-rank", "0", "--master", "h:1", "--isolate-network", "-n", "1"],
                     {ENV_LAUNCH_SECRET: SECRET}, "would cut this node off", id="isolated-network"),
        pytest.param(["--nnodes", "2", "--node-rank", "0", "--master", "h:1", "--secret-file", "/no/such/file", "-n", "1"],
                     {}, "--secret-file /no/such/file, which cannot be read", id="missing-secret-file"),
    ],
)
def test_invalid_node_options_are_refused(argv, env, message, monkeypatch):
    monkeypatch.delenv(ENV_LAUNCH_SECRET, raising=False)
    monkeypatch.delenv(ENV_NODE_RANK, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(LaunchError, match=message):
        options_from_args(_args(*argv))


def test_rank_from_the_environment_and_secret_from_a_file(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    args = _args("--nnodes", "3", "--master", "[::1]:29400", "--secret-file", str(secret), "-n", "2")
    node = node_options_from_args(args, {ENV_NODE_RANK: "2"})
    assert (node.nnodes, node.node_rank, node.master_host, node.master_port) == (3, 2, "::1", 29400)
    assert node.secret == SECRET.encode() and SECRET not in repr(node)


def test_handshake_refuses_a_stranger_and_a_taken_rank():
    port, said = _free_port(), []
    node = NodeOptions(nnodes=2, node_rank=0, master_host=MASTER_HOST, master_port=port, secret=SECRET.encode())
    server = RendezvousServer(node, workers_per_node=1, max_restarts=0, timeout=30, say=said.append)

    def client(rank: int, secret: str) -> RendezvousClient:
        options = NodeOptions(nnodes=2, node_rank=rank, master_host=MASTER_HOST, master_port=port, secret=secret.encode(),
                              node_address="127.0.0.3")
        return RendezvousClient(options, workers_per_node=1, max_restarts=0, interrupted=lambda: False)

    try:
        first = client(1, SECRET)
        assert first.connect(timeout=10) is None and first.address == "127.0.0.3"
        with pytest.raises(LaunchError, match="refused this launcher .* shared secret differs from node 0's"):
            client(1, "x" * 32).connect(timeout=10)
        with pytest.raises(LaunchError, match="rank 1 is taken by the node at 127.0.0.3:"):
            client(1, SECRET).connect(timeout=10)
        assert any("refused a launcher" in line and "the job goes on" in line for line in said)
        first.close()
    finally:
        server.close()


def _running_job(limits: ServerLimits, max_restarts: int = 0) -> tuple[RendezvousServer, list[RendezvousClient]]:
    """Node 0's server and both nodes' clients, in this process, with round 0 formed."""
    port = _free_port()
    node = NodeOptions(nnodes=2, node_rank=0, master_host=MASTER_HOST, master_port=port, secret=SECRET.encode())
    server = RendezvousServer(node, workers_per_node=1, max_restarts=max_restarts, timeout=60, say=lambda _: None,
                              limits=limits)
    clients = [RendezvousClient(NodeOptions(nnodes=2, node_rank=rank, master_host=MASTER_HOST, master_port=port,
                                            secret=SECRET.encode(), node_address=f"127.0.0.{rank + 2}"),
                                workers_per_node=1, max_restarts=max_restarts, interrupted=lambda: False)
               for rank in (0, 1)]
    for client in clients:
        assert client.connect(timeout=30) is None
    with ThreadPoolExecutor(2) as pool:
        formed = list(pool.map(lambda pair: pair[0].form(0, [41000 + pair[1]]), zip(clients, (0, 1))))
    assert all(event is not None and event.kind.value == "cluster" for event in formed), formed
    return server, clients


def _failed(worker: int, when: float, *, consequential: bool, reason: str) -> Failed:
    return Failed.bounded(round=0, worker=worker, reason=reason, status=1, time=when, consequential=consequential,
                          outcome="failed", lines=[f"line of worker {worker}"], logs=[f"/logs/worker-{worker}.log"])


@pytest.mark.parametrize("consequential", [pytest.param(True, id="first-to-arrive-is-an-echo"),
                                           pytest.param(False, id="first-to-arrive-is-later")])
def test_node_0_relays_the_earliest_root_cause_whole_not_the_first_to_arrive(consequential):
    """Node 1's report (at 1005 s) reaches node 0 before node 0's own (at 1000 s); both nodes hear node 0's, whole."""
    server, (c0, c1) = _running_job(ServerLimits(settle_seconds=600))  # decided when both reported, not by a timer
    try:
        with ThreadPoolExecutor(2) as pool:
            second = pool.submit(c1.report_failure, _failed(1, 1005.0, consequential=consequential,
                                                            reason="UnavailableError: Socket closed"))
            while not server._failures:  # node 1's report arrived first
                time.sleep(0.01)
            first = pool.submit(c0.report_failure, _failed(0, 1000.0, consequential=False, reason="ValueError: bad"))
            verdicts = [first.result(30), second.result(30)]
        for event in verdicts:
            assert event is not None and event.kind.value == "failed"
            failure = failure_from_event(event)
            assert (failure.node, failure.index, failure.reason, failure.time) == (0, 0, "ValueError: bad", 1000.0)
            assert (failure.consequential, failure.last_lines, failure.logs) == (False, ("line of worker 0",),
                                                                                 ("/logs/worker-0.log",))
    finally:
        for client in (c0, c1):
            client.close()
        server.close()


def test_node_0_relays_the_diagnosed_failure_over_an_earlier_undiagnosed_one():
    """Node 1's ledgers named the cause (its worker ran out of data); node 0's worker only failed first."""
    server, (c0, c1) = _running_job(ServerLimits(settle_seconds=600))
    diagnosed = dataclasses.replace(_failed(1, 1005.0, consequential=False, reason="exited with status 0"),
                                    diagnosis=["worker 1 ran out of data after 7 batch(es) of epoch 1 while worker 0 "
                                               "waits in batch 8: the shards differ by one batch", "evidence"])
    try:
        with ThreadPoolExecutor(2) as pool:
            second = pool.submit(c1.report_failure, diagnosed)
            while not server._failures:
                time.sleep(0.01)
            first = pool.submit(c0.report_failure, _failed(0, 1000.0, consequential=False, reason="exited 1"))
            verdicts = [first.result(30), second.result(30)]
        for event in verdicts:
            assert event is not None
            failure = failure_from_event(event)
            assert (failure.node, failure.index, failure.diagnosis) == (1, 1, tuple(diagnosed.diagnosis))
            assert failure.headline().startswith("node 1: worker 1 ran out of data after 7 batch(es)")
    finally:
        for client in (c0, c1):
            client.close()
        server.close()


def test_a_node_whose_workers_run_on_does_not_hold_the_decision_past_the_settle_time():
    server, (c0, c1) = _running_job(ServerLimits(settle_seconds=0.2), max_restarts=1)
    try:
        event = c1.report_failure(_failed(1, 1005.0, consequential=False, reason="exited with status 3"))
        assert event is not None and event.data["restart"] is True and event.data["node"] == 1
        assert c0._wait((EventKind.FAILED,), timeout=30).data["reason"] == "exited with status 3"
    finally:
        for client in (c0, c1):
            client.close()
        server.close()


# --- supervision across nodes, with plain workers (no TensorFlow) ----------------------------------------


@pytest.mark.multiprocess
def test_failure_on_node_1_stops_and_restarts_both_nodes():
    master = f"{MASTER_HOST}:{_free_port()}"
    restart = ("-n", "1", "--max-restarts", "1", "--timeout", "30", "--", sys.executable, str(PLAIN_WORKER), "fail")
    nodes = [_node(0, master, *restart), _node(1, master, *restart)]
    results = _finish_all(*nodes, timeout=90)
    for node, (code, _, err, _) in enumerate(results):
        assert code == 1, err
        assert "node 1 worker 1 exited with status 3" in err
        if node == 0:  # not on this node's console: its last lines in the report
            assert "last 15 line(s) of node 1 worker 1:" in err and "  | line 29" in err
        else:  # on this one's, live: not repeated
            assert "  | " not in err and "the output of node 1 worker 1 is above" in err, err
        assert "(restart 1 of 1)" in err and "giving up after 1 restart(s)" in err
    assert "starting 1 worker(s) (worker 0 of 2) on 127.0.0.2:" in results[0][2]
    assert "starting 1 worker(s) (worker 1 of 2) on 127.0.0.3:" in results[1][2]


@pytest.mark.multiprocess
def test_node_that_never_starts_fails_the_other_at_the_timeout():
    master = f"{MASTER_HOST}:{_free_port()}"
    node0 = _node(0, master, "-n", "1", "--timeout", "4", "--", sys.executable, str(PLAIN_WORKER), "sleep")
    [(code, _, err, _)] = _finish_all(node0, timeout=60)
    assert code == 124, err
    assert "node rank(s) 1 did not arrive at the rendezvous on 127.0.0.2:" in err and "within --timeout 4 s" in err


@pytest.mark.multiprocess
def test_ctrl_c_on_node_0_stops_every_process_on_both_nodes():
    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "2", "--timeout", "60", "--", sys.executable, str(PLAIN_WORKER), "sleep")
    nodes = [_node(0, master, *job), _node(1, master, *job)]
    deadline = time.monotonic() + 60
    # per node: the launcher, its reaper, 2 workers and their 2 children
    while any(len(_tagged(node.tag)) < 6 for node in nodes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [len(_tagged(node.tag)) for node in nodes] == [6, 6]
    nodes[0].process.send_signal(signal.SIGINT)
    results = _finish_all(*nodes, timeout=30)
    assert [code for code, *_ in results] == [130, 130]
    assert "node 0 received SIGINT: stopping this node's workers" in results[1][2]
    assert all("passed it on; every worker stopped" in err for _, _, err, _ in results)


# --- with TensorFlow ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_by_one(tmp_path_factory):
    """2 nodes x 1 worker of the example, uninterrupted; a stranger and a second rank 1 are refused meanwhile."""
    out = tmp_path_factory.mktemp("two_by_one")
    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "1", "--timeout", "300", "--", *EXAMPLE, "--out", str(out / "model.keras"))
    node0 = _node(0, master, *job)
    stranger = _node(1, master, *job, secret="not-the-secret-0123456789", address="127.0.0.9")
    [(stranger_code, _, stranger_err, _)] = _finish_all(stranger, timeout=60)
    node1 = _node(1, master, *job)
    deadline = time.monotonic() + 120
    while len(_tagged(node1.tag)) < 3 and time.monotonic() < deadline:  # its worker runs: the cluster is formed
        time.sleep(0.2)
    [(taken_code, _, taken_err, _)] = _finish_all(_node(1, master, *job, address="127.0.0.8"), timeout=60)
    results = _finish_all(node0, node1, timeout=600)
    return {"results": results, "out": out, "stranger": (stranger_code, stranger_err), "taken": (taken_code, taken_err)}


@pytest.mark.multiprocess
def test_two_nodes_one_worker_each_train_to_equal_losses(two_by_one):
    (code0, out0, err0, _), (code1, out1, err1, _) = two_by_one["results"]
    assert (code0, code1) == (0, 0), err0[-2000:] + err1[-2000:]
    assert '"task": {"type": "worker", "index": 1}' not in out0
    losses = _final_losses(out0) + _final_losses(out1)
    assert len(losses) == 2 and losses[0] == losses[1]
    assert (two_by_one["out"] / "model.keras").exists()
    # a healthy job: node 0 watches both workers, and no node says a stall, a diagnosis or a straggler
    for err in (err0, err1):
        assert not re.search(r"straggler|stall|diagnos", err), err[-3000:]


@pytest.mark.multiprocess
def test_a_stranger_and_a_second_rank_1_are_refused_and_the_job_goes_on(two_by_one):
    code, err = two_by_one["stranger"]
    assert code == 2 and "refused this launcher (--node-rank 1): its shared secret differs from node 0's" in err
    code, err = two_by_one["taken"]
    assert code == 2 and "refused this launcher (--node-rank 1): rank 1 is taken by the node at 127.0.0.3:" in err
    node0_err = two_by_one["results"][0][2]
    assert "refused a launcher at 127.0.0.9:" in node0_err and "refused a launcher at 127.0.0.8:" in node0_err
    assert [code for code, *_ in two_by_one["results"]] == [0, 0]


@pytest.mark.multiprocess
def test_two_nodes_two_workers_each_train_to_the_same_losses(two_by_one, tmp_path):
    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "2", "--timeout", "400", "--console-workers", "all", "--", *EXAMPLE, "--out", str(tmp_path / "model.keras"))
    ranges = ((29610, 29619), (29620, 29629))  # each node's workers on ports of its own --port-range
    nodes = [_node(rank, master, "--port-range", f"{low}-{high}", *job) for rank, (low, high) in enumerate(ranges)]
    (code0, out0, err0, _), (code1, out1, err1, _) = _finish_all(*nodes, timeout=900)
    assert (code0, code1) == (0, 0), err0[-2000:] + err1[-2000:]
    for rank, (err, (low, high)) in enumerate(zip((err0, err1), ranges)):
        started = re.search(r"starting 2 worker\(s\) \(workers \d\.\.\d of 4\) on (.*)", err)
        assert started, err
        ports = [int(port) for port in re.findall(rf"127\.0\.0\.{rank + 2}:(\d+)", started.group(1))]
        assert len(ports) == 2 and all(low <= port <= high for port in ports), started.group(0)
    assert "[worker 2]" in out1 and "[worker 3]" in out1 and "[worker 2]" not in out0
    losses = _final_losses(out0) + _final_losses(out1)
    assert len(losses) == 4 and len(set(losses)) == 1
    # The same global batch over 4 workers as over 2: the same training, up to float summation order.
    np.testing.assert_allclose(losses[0], _final_losses(two_by_one["results"][0][1])[0], rtol=1e-4)


@pytest.mark.multiprocess
def test_sigkilled_worker_on_node_1_restarts_both_nodes_to_the_same_result(two_by_one, tmp_path):
    import keras

    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "1", "--max-restarts", "1", "--timeout", "300", "--", *EXAMPLE, "--out", str(tmp_path / "model.keras"))
    node0, node1 = _node(0, master, *job), _node(1, master, *job)
    assert node1.process.stdout is not None
    deadline, seen = time.monotonic() + 400, []
    while time.monotonic() < deadline:
        line = node1.process.stdout.readline()
        seen.append(line)
        if "[worker 1] Epoch 2/2" in line or not line:
            break
    worker = [pid for pid in _tagged(node1.tag) if pid != node1.process.pid
              and b"multi_worker_train" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(worker) == 1, seen
    node1_out_before = "".join(seen)
    os.kill(worker[0], signal.SIGKILL)
    (code0, out0, err0, _), (code1, out1, err1, _) = _finish_all(node0, node1, timeout=600)
    assert (code0, code1) == (0, 0), err0[-2000:] + err1[-2000:]
    for err in (err0, err1):
        assert "node 1 worker 1 was killed by SIGKILL" in err and "(restart 1 of 1)" in err
        print(err.strip().splitlines()[-1])  # the restart timings, for the record
    reference = two_by_one["results"]
    assert _final_losses(out0) + _final_losses(node1_out_before + out1) == \
        _final_losses(reference[0][1]) + _final_losses(reference[1][1])
    want = keras.saving.load_model(two_by_one["out"] / "model.keras").get_weights()
    for got, expected in zip(keras.saving.load_model(tmp_path / "model.keras").get_weights(), want):
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


@pytest.mark.multiprocess
def test_sigkilled_node_0_launcher_leaves_no_process_on_either_node():
    master = f"{MASTER_HOST}:{_free_port()}"
    job = ("-n", "1", "--timeout", "60", "--", sys.executable, str(PLAIN_WORKER), "sleep")
    nodes = [_node(0, master, *job), _node(1, master, *job)]
    deadline = time.monotonic() + 60
    # per node: the launcher, its reaper, a worker and its child
    while any(len(_tagged(node.tag)) < 4 for node in nodes) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [len(_tagged(node.tag)) for node in nodes] == [4, 4]
    nodes[0].process.kill()
    killed = time.monotonic()
    nodes[0].process.wait()
    nodes[1].process.wait(timeout=60)  # it loses node 0 and stops its worker
    for node in nodes:  # before finish(), which would kill what is left
        deadline = time.monotonic() + 60
        while (remaining := _tagged(node.tag)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert remaining == []
    print(f"both nodes' processes gone {time.monotonic() - killed:.1f} s after SIGKILL of node 0's launcher")
    (_, _, _, _), (code1, _, err1, _) = [node.finish(timeout=10) for node in nodes]
    assert code1 == 1 and "lost the connection to node 0's rendezvous" in err1
