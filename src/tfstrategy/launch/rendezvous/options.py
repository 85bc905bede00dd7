"""A launcher's place in a multi-node job, and the shared secret, read and checked before anything starts."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tfstrategy.errors import LaunchError
from tfstrategy.settings import ENV_LAUNCH_SECRET, ENV_NODE_RANK, LAUNCH_SECRET, parse_min_max

__all__ = ["NodeOptions", "ServerLimits", "parse_master", "parse_nnodes", "read_secret", "validate_node_options", "MIN_SECRET_BYTES"]

#: Shortest secret accepted (bytes).
MIN_SECRET_BYTES = 16
#: A secret file larger than this is not a secret file.
_MAX_SECRET_FILE = 4096
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
    #: ``--nnodes MIN:MAX``: the fewest nodes the job trains with (``None``: exactly ``nnodes``, the maximum).
    min_nodes: int | None = None
    #: Seconds the first round waits for up to ``nnodes`` nodes once ``min_nodes`` are there (``--rendezvous-wait``).
    rendezvous_wait: float = 10.0

    @property
    def master(self) -> str:
        return f"{self.master_host}:{self.master_port}"

    @property
    def elastic(self) -> bool:
        """Whether the group re-forms with the nodes present (``--nnodes MIN:MAX`` with MIN < MAX)."""
        return self.min_nodes is not None and self.min_nodes < self.nnodes

    @property
    def fewest(self) -> int:
        """The fewest nodes a round forms with."""
        return self.nnodes if self.min_nodes is None else self.min_nodes

    @property
    def shape(self) -> str:
        """``--nnodes`` as given: ``N`` or ``MIN:MAX``."""
        return str(self.nnodes) if self.min_nodes is None else f"{self.min_nodes}:{self.nnodes}"


def parse_nnodes(value: str) -> tuple[int | None, int]:
    """``--nnodes N`` or ``MIN:MAX`` (torchrun's syntax) as ``(min or None, max)``.

    Raises:
        LaunchError: not a count or a ``MIN:MAX`` pair with 1 <= MIN <= MAX.
    """
    parsed = parse_min_max(value)
    if parsed is not None and (parsed[0] is None or 1 <= parsed[0] <= parsed[1]):
        return parsed
    raise LaunchError(f"Received --nnodes {value!r}; expected a node count N, or MIN:MAX for an elastic job that "
                      "goes on while at least MIN of up to MAX nodes are present, e.g. --nnodes 2 or --nnodes 1:4.")


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

    A file that its group or other users may read or write is refused, as ssh refuses such key files:
    whoever reads the secret can join the job and command every launcher.

    Raises:
        LaunchError: none given, an unreadable, shared or oversized file, or a secret shorter than
            :data:`MIN_SECRET_BYTES`.
    """
    if secret_file is not None:
        secret, origin = _read_secret_file(secret_file), f"--secret-file {secret_file}"
    elif (text := LAUNCH_SECRET.text(env)) is not None:
        secret, origin = text.encode(), ENV_LAUNCH_SECRET
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


def _read_secret_file(path: Path) -> bytes:
    try:
        # O_NOFOLLOW-free on purpose (a symlink to a private file is fine); the mode is the target's.
        with open(path, "rb") as file:
            info = os.fstat(file.fileno())
            shared = stat.S_IMODE(info.st_mode) & 0o077
            if shared:
                raise LaunchError(
                    f"Received --secret-file {path} with mode {stat.S_IMODE(info.st_mode):04o}, which other users "
                    f"may {'read' if shared & 0o044 else 'write'}; expected a file only you can read: chmod 600 {path}"
                )
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_SECRET_FILE:
                raise LaunchError(f"Received --secret-file {path}, which is not a small regular file; expected a file "
                                  f"holding the job's shared secret, e.g. {_MAKE_SECRET}")
            return file.read(_MAX_SECRET_FILE).strip()
    except OSError as error:
        raise LaunchError(f"Received --secret-file {path}, which cannot be read ({error.strerror}); "
                          f"pass a file holding the job's shared secret, e.g. {_MAKE_SECRET}") from None


def validate_node_options(node: NodeOptions) -> NodeOptions:
    """Check a node's place in the job before anything starts.

    Raises:
        LaunchError: fewer than two nodes, or a rank outside ``0..nnodes-1``.
    """
    if node.nnodes < 2:
        raise LaunchError(f"Received --nnodes {node.nnodes} for a multi-node job; expected 2 or more "
                          "(omit --nnodes to run every worker on this machine).")
    if node.min_nodes is not None and not 1 <= node.min_nodes <= node.nnodes:
        raise LaunchError(f"Received --nnodes {node.shape}; expected MIN:MAX with 1 <= MIN <= MAX, e.g. --nnodes 1:4.")
    if node.rendezvous_wait < 0:
        raise LaunchError(f"Received --rendezvous-wait {node.rendezvous_wait:g}; expected seconds >= 0 (how long the "
                          "first round waits for more than MIN nodes).")
    if not 0 <= node.node_rank < node.nnodes:
        raise LaunchError(
            f"Received --node-rank {node.node_rank} (or {ENV_NODE_RANK}) for --nnodes {node.nnodes}; expected 0.."
            f"{node.nnodes - 1}, a different one on each machine, 0 on the machine named by --master. e.g. {_EXAMPLE}"
        )
    return node


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    """The rendezvous's bounds and heartbeat (defaults for real jobs; tests shorten them)."""

    #: Seconds a connection has to complete the whole handshake.
    handshake_seconds: float = 10.0
    #: Unauthenticated connections at once, in all and from one address.
    max_pending: int = 64
    max_pending_per_host: int = 8
    #: Every connection carries a heartbeat this often, each way.
    heartbeat_seconds: float = 2.0
    #: A peer that sent nothing (or read nothing of a send) for this long is dead.
    dead_after: float = 10.0
    #: Messages waiting for one peer before it counts as not reading.
    queue_limit: int = 256
    #: Seconds node 0 waits after a round's first failure for the other nodes' (unless every node reported):
    #: the root cause is the earliest real one, not the first to arrive.
    settle_seconds: float = 2.0
