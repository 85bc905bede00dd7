"""Waiting for the other tasks of a TF_CONFIG cluster: bounded, named, and SIGTERM still works (issue 13)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers import ROOT, free_ports, run_cli
from tfstrategy.errors import PeerTimeoutError
from tfstrategy.multiworker.cluster import validate_tf_config
from tfstrategy.multiworker.peers import wait_for_peers


def _tf_config(ports: list[int], index: int) -> dict:
    return {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]}, "task": {"type": "worker", "index": index}}


def test_a_missing_peer_is_named_after_the_timeout():
    ports = free_ports(3)
    with socket.create_server(("127.0.0.1", ports[1])):  # worker-1 is up, worker-2 never starts
        started = time.monotonic()
        with pytest.raises(PeerTimeoutError, match=rf"worker-2 at 127.0.0.1:{ports[2]} did not start within 0.5 s") as caught:
            wait_for_peers(validate_tf_config(_tf_config(ports, 0)), 0.5, poll=0.05)
    assert time.monotonic() - started < 5
    assert "worker-1" not in str(caught.value)


def test_returns_once_every_peer_listens_and_frees_its_own_port():
    ports = free_ports(2)
    lines = []
    with socket.create_server(("127.0.0.1", ports[1])):
        wait_for_peers(validate_tf_config(_tf_config(ports, 0)), 5, progress=lines.append)
    assert lines == []
    with socket.create_server(("127.0.0.1", ports[0])):  # TensorFlow's server can take the port next
        pass


@pytest.mark.slow
def test_check_with_a_peer_that_never_starts_ends_naming_it():
    ports = free_ports(2)
    result = run_cli("check", "--join-timeout", "2", env={"TF_CONFIG": json.dumps(_tf_config(ports, 0))}, timeout=120)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1].startswith(
        f"tfstrategy check: failed: Received TF_CONFIG for 2 training tasks, as worker-0; worker-1 at 127.0.0.1:{ports[1]} "
        "did not start within 2 s"
    )


@pytest.mark.slow
def test_sigterm_ends_a_check_waiting_for_its_peer():
    ports = free_ports(2)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": json.dumps(_tf_config(ports, 0))}
    process = subprocess.Popen(
        [sys.executable, "-m", "tfstrategy", "check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        line = process.stderr.readline()  # blocks until the wait has begun
        assert line.startswith(f"tfstrategy check: waiting up to 120 s for worker-1 at 127.0.0.1:{ports[1]}"), line
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == -signal.SIGTERM
    finally:
        process.kill()
        process.communicate()


@pytest.mark.multiprocess
def test_two_checks_waiting_for_each_other_both_pass():
    ports = free_ports(2)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tfstrategy", "check", "--join-timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**env, "TF_CONFIG": json.dumps(_tf_config(ports, index))},
        )
        for index in range(2)
    ]
    try:
        outputs = [process.communicate(timeout=240) for process in processes]
    finally:
        for process in processes:
            process.kill()
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr
        assert "replicas 2" in stdout.splitlines()
        # A job has no collective timeout by default; the check's few collectives are bounded by --join-timeout.
        assert "collective timeout 60 s" in stdout
