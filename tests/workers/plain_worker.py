"""A worker without TensorFlow for the launcher's supervision tests (starts in milliseconds).

Each worker first starts a child (``sleep``) so the tests can check that nothing survives.
``fail``: worker 1 prints 30 lines and exits 3, the others wait. ``raise``: worker 1 raises a KeyError three
calls deep (a traceback on its stderr), the others wait. ``sleep``: every worker waits.
``joined``: worker 0 signals that it joined; worker 1 never does. ``starting``: worker 0 signals that it is
creating its strategy (as the start-up hook does in a TensorFlow worker); worker 1 never gets that far. ``outlast``: every worker joins, then exits 0 six seconds later.
``leave``: worker 0 joins and waits;
worker 1 exits 0 without ever joining.
``listen``: every worker listens on 0.0.0.0:<its TF_CONFIG port>, as TensorFlow's server does,
checks that its peers answer on 127.0.0.1, and waits. ``bind``: every worker binds 0.0.0.0:<its port> and exits 0.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

mode = sys.argv[1]
index = int(os.environ["TFSTRATEGY_WORKER_INDEX"])
subprocess.Popen(["sleep", "600"])
print(f"ready {os.environ['TF_CONFIG']}", flush=True)
if mode == "fail" and index == 1:
    for line in range(30):
        print(f"line {line}", flush=True)
    sys.exit(3)
if mode == "raise" and index == 1:

    def metric(logs: dict[str, float]) -> float:
        return logs["accuracy"]

    def evaluate() -> float:
        return metric({"loss": 0.5})

    evaluate()
if mode == "leave" and index == 1:
    sys.exit(0)
if mode == "starting" and index == 0:
    from tfstrategy.multiworker.worker_protocol import signal_starting

    signal_starting()
if mode == "starting" and index == 1:
    print("stalling before TensorFlow starts", flush=True)
if mode == "outlast":
    from tfstrategy.multiworker.worker_protocol import signal_joined

    signal_joined()
    time.sleep(6)
    sys.exit(0)
if mode in ("joined", "leave") and index == 0:
    from tfstrategy.multiworker.worker_protocol import signal_joined

    signal_joined()
if mode == "bind":
    ports = [int(a.rsplit(":", 1)[1]) for a in json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]]
    socket.socket().bind(("0.0.0.0", ports[index]))
    sys.exit(0)
if mode == "listen":
    ports = [int(a.rsplit(":", 1)[1]) for a in json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]]
    server = socket.socket()
    server.bind(("0.0.0.0", ports[index]))
    server.listen()
    for port in ports:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit(f"peer on 127.0.0.1:{port} unreachable")
    print(f"listening on 0.0.0.0:{ports[index]}; peers reachable", flush=True)
time.sleep(600)
