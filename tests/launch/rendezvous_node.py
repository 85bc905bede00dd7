"""One rendezvous end in its own process, for the adversarial tests (no TensorFlow, starts in ~0.1 s).

``server HOST PORT [--spare-fds N]``: node 0: the server (short test limits) plus its own rank-0
client, which joins round 0 with one port; with ``--spare-fds N`` the process's descriptor limit
is lowered to what it has open plus N, with ``--nofile N`` to N; ``--no-client``: the server alone. ``client RANK HOST PORT ADDRESS``: a node that joins round
0. Both print every message and event as one line (``say: ...``, ``event: KIND {...}``), ``READY``
once listening or connected, and ``THREAD DIED ...`` if any thread ever raises.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

from tfstrategy.launch.rendezvous import NodeOptions, RendezvousClient, RendezvousServer, ServerLimits

SECRET = b"tfstrategy-test-secret-0123456789"
LIMITS = ServerLimits(handshake_seconds=2.0, heartbeat_seconds=0.2, dead_after=3.0)


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _died(args: threading.ExceptHookArgs) -> None:
    _print(f"THREAD DIED {args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: {args.exc_value}")


def _events(client: RendezvousClient) -> None:
    while True:
        event = client.poll()
        if event is None:
            time.sleep(0.02)
            continue
        _print(f"event: {event.kind.value} {json.dumps(dict(event.data))}")
        if event.kind.value == "lost":
            sys.exit(1)


def main(argv: list[str]) -> None:
    threading.excepthook = _died
    role = argv[0]
    if role == "server":
        host, port = argv[1], int(argv[2])
        node = NodeOptions(nnodes=2, node_rank=0, master_host=host, master_port=port, secret=SECRET, node_address=host)
        server = RendezvousServer(node, workers_per_node=1, max_restarts=0, timeout=120, say=lambda m: _print(f"say: {m}"),
                                  limits=LIMITS)
        if "--spare-fds" in argv or "--nofile" in argv:
            if "--nofile" in argv:
                limit = int(argv[argv.index("--nofile") + 1])
            else:
                limit = len(os.listdir("/proc/self/fd")) + int(argv[argv.index("--spare-fds") + 1])
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        _print(f"READY job {server.job_id}")
        if "--no-client" in argv:
            time.sleep(3600)
        client = RendezvousClient(node, workers_per_node=1, max_restarts=0, interrupted=lambda: False)
    else:
        rank, host, port, address = int(argv[1]), argv[2], int(argv[3]), argv[4]
        node = NodeOptions(nnodes=2, node_rank=rank, master_host=host, master_port=port, secret=SECRET,
                           node_address=address)
        client = RendezvousClient(node, workers_per_node=1, max_restarts=0, interrupted=lambda: False)
    ended = client.connect(timeout=60)
    _print(f"READY connected job {client.job_id}" if ended is None else f"event: {ended.kind.value} {dict(ended.data)}")
    formed = client.form(0, [40000 + client.node.node_rank])
    _print(f"event: {formed.kind.value} {json.dumps(dict(formed.data))}")
    _events(client)


if __name__ == "__main__":
    main(sys.argv[1:])
