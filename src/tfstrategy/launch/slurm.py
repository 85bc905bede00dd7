"""``srun tfstrategy launch``: one launcher per task of a Slurm job step, its multi-node options from the step.

Inside a job step of 2+ tasks, ``tfstrategy launch`` without ``--nnodes``, ``--node-rank`` or
``--master`` is one node of a multi-node launch (like torchrun under Slurm), so the launchers'
supervision and ledger diagnosis work there too:

* ``--nnodes``: the step's tasks (``srun --ntasks-per-node=1``: one launcher a machine);
* ``--node-rank``: the task's worker index as :mod:`tfstrategy.environments.slurm` orders the step
  (node by node, then ``SLURM_LOCALID``);
* ``--master``: the first node of ``SLURM_STEP_NODELIST``, resolved here, and the port
  ``select()`` would give the step's first task there (``TFSTRATEGY_SLURM_PORT``, the step's
  reserved ports, else one derived from the job and step ids);
* ``--node-address``: this task's node, resolved here.

The shared secret stays required. A step of one task, ``TFSTRATEGY_SLURM=off``, or any of the
three flags given keeps today's behaviour. Pure apart from name resolution, which is an argument.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tfstrategy.environments.slurm import (
    ENV_SLURM,
    SlurmStep,
    read_slurm_step,
    slurm_switched_off,
    slurm_task_index,
    step_ports,
)
from tfstrategy.environments.slurm_lists import PLAIN_PARSERS
from tfstrategy.errors import LaunchError, TFStrategyError
from tfstrategy.settings import ENV_LAUNCH_SECRET, LAUNCH_SECRET

__all__ = ["SlurmNodes", "slurm_nodes"]

_MAKE_SECRET = "export TFSTRATEGY_LAUNCH_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')"
_OPT_OUT = (f"pass --nnodes, --node-rank and --master yourself, or set {ENV_SLURM}=off to run each task's launcher "
            "on its own")


@dataclass(frozen=True, kw_only=True)
class SlurmNodes:
    """The multi-node options a Slurm job step gives this launcher."""

    step: SlurmStep
    nnodes: int
    node_rank: int
    master_host: str
    master_port: int
    node_address: str
    #: Where the rendezvous port came from (``SLURM_STEP_RESV_PORTS=...``, ``derived from job 7 step 0``).
    port_source: str

    @property
    def master(self) -> str:
        """``HOST:PORT`` (``[v6]:PORT``), as ``--master`` takes it."""
        host = f"[{self.master_host}]" if ":" in self.master_host else self.master_host
        return f"{host}:{self.master_port}"

    def describe(self) -> str:
        """``Slurm job 12 step 0: 2 nodes, this is node 0, rendezvous on 127.0.0.1:20016``."""
        return (f"Slurm job {self.step.job_id or '?'} step {self.step.step_id or '?'}: {self.nnodes} nodes, this is "
                f"node {self.node_rank}, rendezvous on {self.master} (port {self.port_source})")


def slurm_nodes(env: Mapping[str, str], *, explicit: bool, secret_file: bool,
                resolve: Callable[[str], str] = socket.gethostbyname) -> SlurmNodes | None:
    """This launcher's place in a multi-node job, from the Slurm job step it is a task of.

    Args:
        env: the launcher's environment.
        explicit: ``--nnodes``, ``--node-rank`` or ``--master`` was given (they win: nothing is read).
        secret_file: ``--secret-file`` was given (else ``TFSTRATEGY_LAUNCH_SECRET`` must be set).
        resolve: a node name to its address (``socket.gethostbyname``).

    Returns:
        ``None`` outside a job step, in a step of one task, with ``TFSTRATEGY_SLURM=off`` or explicit flags.

    Raises:
        LaunchError: step variables that do not parse or describe a layout tfstrategy cannot serve, a node
            name that does not resolve (or resolves to loopback in a step over several machines), or no
            shared secret.
    """
    if explicit or slurm_switched_off(env):
        return None
    try:
        step = read_slurm_step(env, parsers=PLAIN_PARSERS)
        if step is None or step.num_tasks < 2:
            return None
        rank = slurm_task_index(step)
        ports, port_source = step_ports(step, None, env)
    except TFStrategyError as error:
        raise LaunchError(f"{error} (tfstrategy launch inside a Slurm job step: {_OPT_OUT}.)") from None
    if not secret_file and LAUNCH_SECRET.text(env) is None:
        raise LaunchError(
            f"Received a Slurm job step of {step.num_tasks} tasks (job {step.job_id or '?'} step {step.step_id or '?'}), "
            f"so this launcher is node {rank} of {step.num_tasks}, but no shared secret; expected {ENV_LAUNCH_SECRET} "
            "exported before srun (srun passes the environment on) or --secret-file FILE on a path every node "
            f"reads. Make one with: {_MAKE_SECRET}"
        )
    this_node = step.node or _node_of(step, rank)
    return SlurmNodes(step=step, nnodes=step.num_tasks, node_rank=rank, master_host=_address(step, step.nodes[0], resolve),
                      master_port=ports[0], node_address=_address(step, this_node, resolve), port_source=port_source)


def _node_of(step: SlurmStep, index: int) -> str:
    """The node of the step's ``index``-th task (node by node)."""
    offsets = [sum(step.tasks_per_node[: i + 1]) for i in range(len(step.nodes))]
    return step.nodes[next(i for i, end in enumerate(offsets) if index < end)]


def _address(step: SlurmStep, node: str, resolve: Callable[[str], str]) -> str:
    """``node``'s address; a loopback one only when the whole step runs on one machine.

    Raises:
        LaunchError: the name does not resolve, or resolves to loopback in a step over several machines.
    """
    try:
        address = resolve(node)
    except OSError as error:
        raise LaunchError(f"Received node {node!r} in SLURM_STEP_NODELIST, which does not resolve to an address here "
                          f"({error}); expected the step's node names to resolve on every node. Fix the name "
                          f"service, or {_OPT_OUT}.") from None
    if len(set(step.nodes)) > 1 and ipaddress.ip_address(address).is_loopback:
        raise LaunchError(f"Received node {node!r} in SLURM_STEP_NODELIST, which resolves to {address} here, a loopback "
                          f"address the other nodes of the step ({','.join(step.nodes)}) cannot reach; expected its "
                          f"network address (/etc/hosts maps it to loopback). Fix /etc/hosts, or {_OPT_OUT}.")
    return address
