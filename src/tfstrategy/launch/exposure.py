"""Who can reach a job's TensorFlow servers: the data plane tfstrategy cannot authenticate.

TensorFlow's gRPC server (``GrpcServer::Init``) asks gRPC for ``0.0.0.0:<port>`` whatever host
``TF_CONFIG`` names, which gRPC opens as the dual-stack wildcard ``[::]:<port>``: every IPv4 and
IPv6 interface. Measured on TensorFlow 2.16.2 and 2.21.0: a server for ``127.0.0.3:P`` listens on
``[::]:P``, and so does one built from a ``ServerDef`` with ``port=P`` (its only address field;
there is no host field); the other protocols (``grpc+verbs``, ``grpc+gdr``, ``grpc+mpi``) are not
in the pip builds, and ``TF_GRPC_DEFAULT_OPTIONS`` (client channel arguments) changes nothing.
The server authenticates no one: whoever reaches the port can run operations in the worker. The rendezvous (:mod:`tfstrategy.launch.rendezvous`) protects the launchers' control
channel only. These helpers say when the servers are reachable beyond loopback, for
``tfstrategy env`` and the multi-node launcher.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

__all__ = ["network_interfaces", "exposure_warning", "describe_tf_config_exposure", "GUIDE"]

GUIDE = "docs/guides/clusters.md, 'Security model'"
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8


def network_interfaces(sys_class_net: Path = Path("/sys/class/net")) -> list[str]:
    """Names of this network namespace's interfaces that are up and not loopback (Linux; ``[]`` elsewhere)."""
    names = []
    try:
        entries = sorted(sys_class_net.iterdir())
    except OSError:
        return []
    for entry in entries:
        try:
            flags = int((entry / "flags").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if flags & _IFF_UP and not flags & _IFF_LOOPBACK:
            names.append(entry.name)
    return names


def exposure_warning(ports: Sequence[int], interfaces: Iterable[str]) -> str | None:
    """The launcher's warning for its workers' ``ports``, or ``None`` when only loopback is up."""
    interfaces = list(interfaces)
    if not interfaces or not ports:
        return None
    listed = ", ".join(f"[::]:{port}" for port in ports)
    return (f"TensorFlow's servers of this node's workers listen on every interface ({listed}; TensorFlow has no "
            f"option to bind one address) and authenticate no one: anyone reaching them over {', '.join(interfaces)} "
            "can run operations in the workers. Allow these ports only from the other nodes "
            f"({GUIDE}: firewall rules)")


def describe_tf_config_exposure(config: Mapping[str, object] | None, interfaces: Iterable[str]) -> str:
    """``tfstrategy env``'s line about this task's TensorFlow server."""
    interfaces = list(interfaces)
    config = config if isinstance(config, Mapping) else {}
    task, cluster = config.get("task"), config.get("cluster")
    task = task if isinstance(task, Mapping) else {}
    addresses = cluster.get(task.get("type"), []) if isinstance(cluster, Mapping) else []
    index = task.get("index", 0)
    if not isinstance(addresses, list) or not isinstance(index, int) or not 0 <= index < len(addresses):
        return "none (no TF_CONFIG task; a multi-worker job's servers listen on every interface, unauthenticated)"
    port = str(addresses[index]).rpartition(":")[2]
    where = (f"reachable beyond loopback (interfaces up: {', '.join(interfaces)}): firewall it ({GUIDE})"
             if interfaces else "only loopback is up in this network namespace, so only this machine reaches it")
    return f"will listen on [::]:{port} (every interface), unauthenticated; {where}"
