"""Reproduce, with TensorFlow alone, the threads a collective timeout costs (tensorflow/tensorflow#62466).

No tfstrategy import: this is an upstream bug report in a script. It starts two workers of one
``MultiWorkerMirroredStrategy`` on 127.0.0.1 (a ``TF_CONFIG`` each), made with
``CommunicationOptions(timeout_seconds=T)`` or without a timeout, and runs N steps of one all-reduce
each. Worker 0 prints its thread count (``/proc/self/status``) as the steps go.

With a timeout, every collective op schedules a closure that sleeps out the timeout on a thread of
its own (``BaseCollectiveExecutor::CompleteParamsAsync`` and ``ExecuteAsync``,
``SchedNonBlockingClosureAfter``, "TODO: Share the timeout watchdog thread among collectives"): two
threads a step, alive for T seconds. A fast job reaches the process's thread limit and aborts with
``std::system_error: Resource temporarily unavailable`` (SIGABRT). Without one the count stays flat::

    .venv/bin/python benchmarks/upstream_collective_timeout_threads.py --timeout 300 --steps 800
    .venv/bin/python benchmarks/upstream_collective_timeout_threads.py --timeout none --steps 800

It exits 0; the lines ``step N: threads M`` are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

#: The steps after which worker 0 prints its thread count (and the last one).
REPORTED = (1, 10, 50, 100, 200, 400, 800, 1600, 3200)


def threads() -> int:
    """This process's thread count, as the kernel reports it."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def free_ports(count: int) -> list[int]:
    """``count`` ports free on 127.0.0.1 now (held together so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    for held in sockets:
        held.bind(("127.0.0.1", 0))
    ports = [held.getsockname()[1] for held in sockets]
    for held in sockets:
        held.close()
    return ports


def worker(index: int, ports: list[int], timeout: float | None, steps: int) -> None:
    """One task of the job: the strategy, then ``steps`` all-reduces, worker 0 printing its threads."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                                          "task": {"type": "worker", "index": index}})
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)

    @tf.function
    def step() -> object:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0)))

    if index == 0:
        print(f"TensorFlow {tf.__version__}, timeout_seconds={timeout}: threads {threads()} before the first step",
              flush=True)
    for number in range(1, steps + 1):
        step()
        if index == 0 and (number in REPORTED or number == steps):
            print(f"step {number}: threads {threads()}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", default="300", help="timeout_seconds, or 'none' (default 300)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    timeout = None if args.timeout.lower() == "none" else float(args.timeout)
    if args.worker is not None:
        worker(args.worker, [int(port) for port in args.ports.split(",")], timeout, args.steps)
        return 0
    ports = ",".join(str(port) for port in free_ports(2))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, __file__, "--timeout", args.timeout, "--steps", str(args.steps), "--ports", ports]
    peer = subprocess.Popen([*command, "--worker", "1"], env=env, stdout=subprocess.DEVNULL)
    status = subprocess.run([*command, "--worker", "0"], env=env, check=False).returncode
    return status or peer.wait()


if __name__ == "__main__":
    sys.exit(main())
