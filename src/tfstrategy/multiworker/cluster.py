"""Read, validate and build the multi-worker cluster description (``TF_CONFIG``).

``TF_CONFIG`` is what MultiWorkerMirroredStrategy reads to find its peers. A
typo in it does not fail early in TensorFlow: a wrong index or a duplicated
address makes the workers wait for each other forever. :func:`validate_tf_config`
checks every rule up front and names the offending part with a correct example.
:func:`tf_config_from_hosts` builds it instead of writing it by hand;
:mod:`tfstrategy.environments` builds it from a cluster environment (a Slurm job step).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tfstrategy.errors import ClusterConfigError

__all__ = ["TRAINING_TASK_TYPES", "read_tf_config", "ClusterConfig", "parse_address", "validate_tf_config", "load_cluster_config", "tf_config_from_hosts", "check_port"]

EXAMPLE_TF_CONFIG = (
    '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, "task": {"type": "worker", "index": 0}}'
)

#: Task types TensorFlow's multi-worker code accepts in a cluster.
TASK_TYPES = ("chief", "worker", "evaluator", "ps")
#: Task types that train (and take part in MultiWorkerMirroredStrategy's collectives).
TRAINING_TASK_TYPES = ("chief", "worker")

_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.\-]+)):(?P<port>[0-9]{1,5})$")
#: The longest TF_CONFIG read: a real one lists a few thousand addresses at most.
MAX_TF_CONFIG_CHARS = 1_000_000
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def read_tf_config(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """Parse ``TF_CONFIG`` from the environment; ``None`` when it is unset or empty.

    Raises:
        ClusterConfigError: it is not a JSON object.
    """
    env = os.environ if env is None else env
    raw = env.get("TF_CONFIG", "").strip()
    if not raw:
        return None
    if len(raw) > MAX_TF_CONFIG_CHARS:
        raise ClusterConfigError(
            f"Received TF_CONFIG of {len(raw)} characters ({raw[:40]!r}...); expected at most {MAX_TF_CONFIG_CHARS}, "
            f"enough for thousands of tasks. Expected for example {EXAMPLE_TF_CONFIG}."
        )
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ClusterConfigError(
            f"Received TF_CONFIG={raw[:80]!r}, which is not valid JSON ({error.msg} at character {error.pos}). "
            f"Expected for example {EXAMPLE_TF_CONFIG}."
        ) from error
    except ValueError as error:  # a number of more than 4300 digits
        raise ClusterConfigError(
            f"Received TF_CONFIG={raw[:40]!r}... holding a number too long to read ({_first(error)}); expected "
            f"ports and indexes of a few digits, as in {EXAMPLE_TF_CONFIG}."
        ) from error
    except RecursionError as error:  # json gives up on deeply nested arrays or objects
        raise ClusterConfigError(
            f"Received TF_CONFIG={raw[:40]!r}..., nested too deeply to parse; expected a flat object such as "
            f"{EXAMPLE_TF_CONFIG}."
        ) from error
    if not isinstance(config, dict):
        raise ClusterConfigError(f"Received TF_CONFIG={raw[:80]!r}; expected a JSON object such as {EXAMPLE_TF_CONFIG}.")
    return config


def _first(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:120]


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """A validated ``TF_CONFIG``: every task's address and which task this process is."""

    cluster: Mapping[str, tuple[str, ...]]
    task_type: str
    task_index: int

    @property
    def num_workers(self) -> int:
        """Training tasks (chief and workers) in the job."""
        return sum(len(self.cluster.get(role, ())) for role in TRAINING_TASK_TYPES)

    @property
    def is_chief(self) -> bool:
        """Whether this task writes checkpoints and saved models (``chief``, else ``worker`` 0)."""
        if "chief" in self.cluster:
            return self.task_type == "chief"
        return self.task_type == "worker" and self.task_index == 0

    @property
    def address(self) -> str:
        """This task's ``host:port``."""
        return self.cluster[self.task_type][self.task_index]

    @property
    def task_name(self) -> str:
        """``worker-1``, ``chief-0``: unique per task, used for per-worker directories."""
        return f"{self.task_type}-{self.task_index}"

    def to_dict(self) -> dict[str, Any]:
        """The ``TF_CONFIG`` object."""
        return {
            "cluster": {role: list(addresses) for role, addresses in self.cluster.items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }

    def to_json(self) -> str:
        """The ``TF_CONFIG`` value, ready for ``os.environ["TF_CONFIG"]``."""
        return json.dumps(self.to_dict())


def _show(value: object) -> str:
    try:
        text = json.dumps(value) if isinstance(value, (dict, list, str, int)) else repr(value)
    except (ValueError, RecursionError):  # an int over 4300 digits, a deeply nested value
        text = repr(type(value).__name__)
    return text if len(text) <= 120 else f"{text[:120]}... ({len(text)} characters)"


def _fail(problem: str, fix: str) -> ClusterConfigError:
    return ClusterConfigError(f"{problem}. {fix} Expected for example TF_CONFIG={EXAMPLE_TF_CONFIG}.")


def parse_address(address: object, where: str) -> tuple[str, int]:
    """Split ``host:port`` (``[::1]:port`` for IPv6) and check the port.

    Raises:
        ClusterConfigError: not a string of that shape, or the port is not 1-65535.
    """
    match = _HOST_PORT.match(address) if isinstance(address, str) else None
    if match is None:
        raise _fail(
            f"Received {where}={_show(address)}, which is not host:port",
            "Write each address as 'host:port', e.g. '10.0.0.5:12345' or '[::1]:12345'.",
        )
    port = int(match["port"])
    if not 1 <= port <= 65535:
        raise _fail(f"Received {where}={_show(address)}, whose port {port} is not in 1-65535", "Use a port such as 12345.")
    return match["ipv6"] or match["host"], port


def _same_machine_key(host: str, port: int) -> tuple[str, int]:
    """What makes two addresses collide: the machine and the port.

    TensorFlow's server listens on every interface of its machine, so every
    loopback spelling (``localhost``, ``127.0.0.1``, ``[::1]``,
    ``[0:0:0:0:0:0:0:1]``) is one machine, and an IP written two ways is one IP.
    """
    if _is_loopback(host):
        return "this machine", port
    try:
        return ipaddress.ip_address(host).compressed, port
    except ValueError:
        return host.lower().rstrip("."), port


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def validate_tf_config(config: Mapping[str, Any]) -> ClusterConfig:
    """Check a parsed ``TF_CONFIG`` and return it as a :class:`ClusterConfig`.

    Raises:
        ClusterConfigError: missing ``cluster``/``task``, an unknown or absent
            task type, an index out of range, an unparseable or duplicated
            address, or ``localhost`` mixed with other hosts.

    Example:
        >>> validate_tf_config(json.loads(EXAMPLE_TF_CONFIG)).num_workers
        2
    """
    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise _fail(
            f"Received TF_CONFIG without a usable 'cluster' (cluster={_show(cluster)})",
            "Add \"cluster\": {\"worker\": [...every worker's host:port...]}.",
        )
    parsed: dict[str, tuple[str, ...]] = {}
    seen: dict[tuple[str, int], str] = {}
    hosts: dict[str, str] = {}
    for role, addresses in cluster.items():
        if role not in TASK_TYPES:
            raise _fail(
                f"Received cluster.{str(role)[:60]}, an unknown task type",
                "Use only chief, worker and evaluator (MultiWorkerMirroredStrategy needs just 'worker', optionally one 'chief').",
            )
        if role == "ps":
            count = len(addresses) if isinstance(addresses, list) else "?"
            raise _fail(
                f"Received cluster.ps with {count} address(es); tfstrategy selects MultiWorkerMirroredStrategy, which "
                "has no parameter servers, and does not support ParameterServerStrategy yet",
                "Remove cluster.ps to train with MultiWorkerMirroredStrategy (every task in cluster.worker), or create "
                "tf.distribute.ParameterServerStrategy yourself without tfstrategy.select().",
            )
        if not isinstance(addresses, list) or not addresses:
            raise _fail(
                f"Received cluster.{role}={_show(addresses)}; expected a non-empty list of 'host:port' strings",
                f"Write cluster.{role} as a list such as [\"10.0.0.5:12345\"].",
            )
        if role in ("chief", "evaluator") and len(addresses) > 1:
            raise _fail(f"Received cluster.{role} with {len(addresses)} addresses; a job has at most one {role}",
                        f"Keep one address in cluster.{role} and move the others to cluster.worker.")
        for index, address in enumerate(addresses):
            where = f"cluster.{role}[{index}]"
            host, port = parse_address(address, where)
            key = _same_machine_key(host, port)
            if key in seen:
                first = seen[key]
                written = "" if _address_at(cluster, first) == address else f" written as {_show(_address_at(cluster, first))}"
                raise _fail(
                    f"Received {where}={_show(address)}, the same address as {first}{written}",
                    "Give every task its own host:port (on one machine: one port per worker).",
                )
            seen[key] = where
            hosts[where] = host
        parsed[role] = tuple(addresses)
    local = [where for where, host in hosts.items() if _is_loopback(host)]
    remote = [where for where, host in hosts.items() if not _is_loopback(host)]
    if local and remote:
        raise _fail(
            f"Received {local[0]}={_show(_address_at(cluster, local[0]))} (this machine only) in a cluster whose "
            f"{remote[0]}={_show(_address_at(cluster, remote[0]))} is another host, which could never reach it",
            "Use this machine's network name or IP address instead of localhost/127.0.0.1.",
        )

    task = config.get("task")
    if not isinstance(task, dict):
        raise _fail(
            f"Received TF_CONFIG without a 'task' object (task={_show(task)}); each process must say which task it is",
            "Add \"task\": {\"type\": \"worker\", \"index\": I} with a different I on each machine.",
        )
    task_type, task_index = task.get("type"), task.get("index")
    if not isinstance(task_type, str) or task_type not in parsed:
        raise _fail(
            f"Received task.type={_show(task_type)}, which is not in the cluster (it has {', '.join(parsed)})",
            f"Set task.type to one of {', '.join(parsed)}.",
        )
    if isinstance(task_index, str) and task_index.strip().isascii() and task_index.strip().isdigit():
        # Bounded: int() of more than 4300 digits raises, and no cluster has a million tasks.
        task_index = int(task_index) if len(task_index.strip()) <= 6 else -1
    if isinstance(task_index, bool) or not isinstance(task_index, int) or not 0 <= task_index < len(parsed[task_type]):
        count = len(parsed[task_type])
        raise _fail(
            f"Received task={_show(task)}; index must be 0..{count - 1} as cluster.{task_type} has {count} address(es)",
            f"Set task.index to this process's position in cluster.{task_type}.",
        )
    return ClusterConfig(cluster=parsed, task_type=task_type, task_index=task_index)


def _address_at(cluster: Mapping[str, Any], where: str) -> object:
    """The address at ``cluster.ROLE[I]`` (``where`` as produced by validation)."""
    role, index = where.removeprefix("cluster.").rstrip("]").split("[")
    return cluster[role][int(index)]


def load_cluster_config(env: Mapping[str, str] | None = None) -> ClusterConfig | None:
    """Read and validate ``TF_CONFIG``; ``None`` when it is unset.

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is set but invalid.
    """
    config = read_tf_config(env)
    return None if config is None else validate_tf_config(config)


def tf_config_from_hosts(hosts: Sequence[str] | str, task_index: int, *, port: int = 12345) -> ClusterConfig:
    """Build the config of worker ``task_index`` in a cluster of ``hosts``.

    Args:
        hosts: ``["node1", "node2:23456"]`` or ``"node1,node2"``; a host without
            a port gets ``port``. Every machine must receive the same list.
        task_index: this machine's position in ``hosts``.
        port: the port of hosts given without one.

    Raises:
        ClusterConfigError: empty list, bad address, duplicate, or index out of range.

    Example:
        >>> tf_config_from_hosts("node1,node2", 1).to_json()
        '{"cluster": {"worker": ["node1:12345", "node2:12345"]}, "task": {"type": "worker", "index": 1}}'
    """
    check_port(port)
    if isinstance(hosts, str):
        items = [h.strip() for h in hosts.split(",")]
    elif isinstance(hosts, (list, tuple)) and all(isinstance(h, str) for h in hosts):
        items = [h.strip() for h in hosts]
    else:
        raise ClusterConfigError(
            f"Received hosts={_show(hosts)} ({type(hosts).__name__}); expected a comma-separated string or a list of "
            "host names, e.g. 'node1,node2' or ['10.0.0.5:12345', '10.0.0.6:12345']."
        )
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise ClusterConfigError(
            f"Received task_index={_show(task_index)} ({type(task_index).__name__}); expected this machine's position "
            f"in hosts as an int, 0..{len(items) - 1}, e.g. tf_config_from_hosts('node1,node2', 0)."
        )
    if not items or not all(items):
        raise ClusterConfigError(
            f"Received hosts={hosts!r}; expected a non-empty list of host names without blanks, "
            "e.g. 'node1,node2' or ['10.0.0.5:12345', '10.0.0.6:12345']."
        )
    addresses = [h if _HOST_PORT.match(h) else f"{h}:{port}" for h in items]
    config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": task_index}}
    return validate_tf_config(config)


def check_port(port: object, name: str = "port") -> None:
    """Raise unless ``port`` is an int in 1-65535.

    Raises:
        ClusterConfigError: naming what was received.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ClusterConfigError(
            f"Received {name}={_show(port)} ({type(port).__name__}); expected an int in 1-65535, e.g. {name}=12345."
        )
