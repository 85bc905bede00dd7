"""Slurm: the cluster of a job step, read from the step's own ``SLURM_*`` variables.

Under ``srun python train.py`` every task of the step runs the same script, and
:func:`tfstrategy.select` turns the step into a ``TF_CONFIG`` by itself
(:class:`Slurm`, :func:`cluster_from_slurm_step`); users write no Slurm code.

* **Which processes form the cluster**: the tasks of one job step. A batch
  script run without ``srun`` has no step variables and is one worker, even in
  an ``sbatch -n 4`` allocation (still a Slurm job: its id and restart count
  count). ``TF_CONFIG``, when set, wins; ``TFSTRATEGY_SLURM=off`` keeps the
  tasks independent (e.g. a seed sweep).
* **Worker order**: node by node in ``SLURM_STEP_NODELIST``, and on each node by
  ``SLURM_LOCALID``. Every task computes the same list from the same variables,
  under any distribution (block, cyclic, plane); under the default block
  distribution the worker index equals ``SLURM_PROCID``, and task 0 is the chief
  under block and cyclic alike.
* **Ports** (the k-th task on a node): ``port`` argument or
  ``TFSTRATEGY_SLURM_PORT`` (base + k); else the step's reserved ports
  ``SLURM_STEP_RESV_PORTS`` (``MpiParams=ports=`` in slurm.conf), which Slurm
  never gives to two steps on a node at once; else a base derived from the job
  and step ids, so two jobs sharing a node rarely collide; else TensorFlow's 8888.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from tfstrategy import _compat
from tfstrategy.environments.base import ClusterEnvironment, read_count, variables_line
from tfstrategy.errors import ClusterConfigError, TFStrategyError
from tfstrategy.multiworker.cluster import ClusterConfig, check_port, validate_tf_config
from tfstrategy.settings import Side, Variable, resolve_setting

__all__ = ["Slurm", "read_slurm_step", "tf_config_from_slurm", "SlurmStepCluster", "cluster_from_slurm_step"]

_OFF = ("0", "off", "false", "no")
SLURM = Variable(name="TFSTRATEGY_SLURM", side=Side.CLUSTER, parse=lambda text: text.lower() not in _OFF, default=True,
                 help="off (or 0, false, no) stops select() from building the cluster from a Slurm job step "
                      "(independent tasks)", expected="off to switch the Slurm cluster off")
SLURM_PORT = Variable(name="TFSTRATEGY_SLURM_PORT", side=Side.CLUSTER,
                      help="base port of the workers of a Slurm step: the k-th task on a node listens on base + k",
                      expected="a port number such as 23456")
#: Every variable of the Slurm environment.
SLURM_VARIABLES = (SLURM, SLURM_PORT)
ENV_SLURM, ENV_SLURM_PORT = SLURM.name, SLURM_PORT.name

#: TensorFlow's own default port for Slurm jobs (SlurmClusterResolver's port_base).
DEFAULT_SLURM_PORT = 8888
#: Ports derived from job and step ids lie in [20000, 60000): 1000 jobs x 5 steps x 8 tasks per node.
DERIVED_PORT_BASE, DERIVED_JOB_SLOTS, DERIVED_STEP_SLOTS, DERIVED_TASKS_PER_NODE = 20000, 1000, 5, 8
_REQUIRED = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def slurm_switched_off(env: Mapping[str, str]) -> bool:
    """``TFSTRATEGY_SLURM=off`` (or 0, false, no): the tasks of a step stay independent jobs."""
    return not SLURM.read(env)


@dataclass(frozen=True, kw_only=True)
class SlurmStep:
    """The job step this process is a task of, as its ``SLURM_*`` variables describe it."""

    job_id: str | None
    step_id: str | None
    rank: int
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    node: str | None = None
    local_id: int | None = None
    distribution: str | None = None
    resv_ports: str | None = None

    @property
    def num_tasks(self) -> int:
        """Tasks in the step, on all nodes."""
        return sum(self.tasks_per_node)

    def describe(self) -> str:
        """``job 7 step 0, task 1 of 2 on node1 (local 1), nodes node1,node2``."""
        where = f" on {self.node}" if self.node else ""
        local = f" (local {self.local_id})" if self.local_id is not None else ""
        return (
            f"job {self.job_id or '?'} step {self.step_id or '?'}, task {self.rank} of {self.num_tasks}{where}{local}, "
            f"nodes {','.join(self.nodes)}"
        )


#: Two parsers: ``SLURM_STEP_NODELIST`` to node names, ``SLURM_STEP_TASKS_PER_NODE`` to counts.
Parsers = tuple[Callable[[str], Sequence[str]], Callable[[str], Sequence[Any]]]


def read_slurm_step(env: Mapping[str, str] | None = None, *, parsers: Parsers | None = None) -> SlurmStep | None:
    """This process's Slurm job step; ``None`` outside one (no shell, no ``srun``, or a batch script).

    Args:
        env: the environment to read (``os.environ`` when omitted).
        parsers: the node list's and the task counts' parsers; default TensorFlow's (which imports
            TensorFlow); a process that must not import it (``tfstrategy launch``) passes
            :data:`~tfstrategy.environments.slurm_lists.PLAIN_PARSERS`.

    Raises:
        ClusterConfigError: the step variables are present but do not parse.
    """
    env = os.environ if env is None else env
    present = [name for name in _REQUIRED if env.get(name)]
    if len(present) < len(_REQUIRED):
        return None
    expand_hostlist, expand_tasks_per_node = parsers or _compat.slurm_hostlist_helpers()
    try:
        nodes = tuple(expand_hostlist(env["SLURM_STEP_NODELIST"]))
        counts = tuple(int(count) for count in expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"]))
        rank = int(env["SLURM_PROCID"])
        local_id = int(env["SLURM_LOCALID"]) if env.get("SLURM_LOCALID") else None
    except ValueError as error:
        raise ClusterConfigError(
            f"Received SLURM_STEP_NODELIST={env['SLURM_STEP_NODELIST']!r}, SLURM_STEP_TASKS_PER_NODE="
            f"{env['SLURM_STEP_TASKS_PER_NODE']!r}, SLURM_PROCID={env['SLURM_PROCID']!r}, SLURM_LOCALID="
            f"{env.get('SLURM_LOCALID')!r}, which do not parse ({error}). Expected e.g. 'node[1-2]', '2(x2)', '0' "
            "and '0', as srun sets them; run the script with srun, or set TF_CONFIG yourself."
        ) from error
    return SlurmStep(
        job_id=env.get("SLURM_JOB_ID"),
        step_id=env.get("SLURM_STEP_ID"),
        rank=rank,
        nodes=nodes,
        tasks_per_node=counts,
        node=env.get("SLURMD_NODENAME") or None,
        local_id=local_id,
        distribution=env.get("SLURM_DISTRIBUTION") or None,
        resv_ports=env.get("SLURM_STEP_RESV_PORTS") or None,
    )


def parse_port_list(text: str) -> list[int]:
    """``"21234-21236,21240"`` -> ``[21234, 21235, 21236, 21240]``.

    Raises:
        ClusterConfigError: not a comma-separated list of ports and ``low-high`` ranges.
    """
    ports: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or int(high or low) < int(low):
            raise ClusterConfigError(
                f"Received SLURM_STEP_RESV_PORTS={text!r}; expected ports and ranges such as '21234-21236,21240'. "
                f"Set {ENV_SLURM_PORT}=<base port> to choose the ports yourself."
            )
        ports.extend(range(int(low), int(high or low) + 1))
    return ports


def step_ports(step: SlurmStep, port: int | None = None, env: Mapping[str, str] | None = None) -> tuple[list[int], str]:
    """The port of the k-th task on a node, for every k the step needs, and where they came from.

    Raises:
        SettingsConflictError: ``port`` and ``TFSTRATEGY_SLURM_PORT`` differ.
        ClusterConfigError: ``TFSTRATEGY_SLURM_PORT`` is not a port, or the step
            reserved fewer ports than it has tasks on one node.
    """
    per_node = max(step.tasks_per_node)
    setting = resolve_setting("port", port, ENV_SLURM_PORT, None, env)
    if setting.value is not None:
        text = str(setting.value).strip()
        if not text.isdigit():
            raise ClusterConfigError(f"Received {ENV_SLURM_PORT}={text!r}; expected a port number such as 23456.")
        port = int(text)
        source = f"{ENV_SLURM_PORT}={text} + local task" if setting.source.startswith("env") else f"port={port} + local task"
    if port is not None:
        if not 1 <= port <= 65536 - per_node:
            raise ClusterConfigError(
                f"Received base port {port} for {per_node} task(s) per node; expected 1-{65536 - per_node} "
                f"so that base + {per_node - 1} is a port."
            )
        return [port + k for k in range(per_node)], source
    if step.resv_ports:
        reserved = parse_port_list(step.resv_ports)
        if len(reserved) < per_node:
            raise ClusterConfigError(
                f"Received SLURM_STEP_RESV_PORTS={step.resv_ports} ({len(reserved)} port(s)) for a step with "
                f"{per_node} tasks on a node; expected one reserved port per task on a node. Drop srun's "
                f"--resv-ports or pass --resv-ports={per_node}, or set {ENV_SLURM_PORT}=<base port> to use base + k."
            )
        return reserved[:per_node], f"SLURM_STEP_RESV_PORTS={step.resv_ports}"
    if step.job_id and step.job_id.isdigit() and per_node <= DERIVED_TASKS_PER_NODE:
        step_id = step.step_id or ""
        step_slot = int(step_id) % DERIVED_STEP_SLOTS if step_id.isdigit() else 0
        base = DERIVED_PORT_BASE + DERIVED_TASKS_PER_NODE * (
            (int(step.job_id) % DERIVED_JOB_SLOTS) * DERIVED_STEP_SLOTS + step_slot
        )
        return [base + k for k in range(per_node)], f"derived from job {step.job_id} step {step.step_id}"
    return [DEFAULT_SLURM_PORT + k for k in range(per_node)], f"TensorFlow's default {DEFAULT_SLURM_PORT} + local task"


def slurm_task_index(step: SlurmStep) -> int:
    """This task's worker index: its position node by node, then by ``SLURM_LOCALID``.

    Without ``SLURMD_NODENAME`` or ``SLURM_LOCALID`` (never the case under srun)
    the block distribution is assumed, where the index is ``SLURM_PROCID``.

    Raises:
        ClusterConfigError: the node is not in the step's node list, the local id
            is out of range, or the rank contradicts the block distribution.
    """
    if step.num_tasks < 1:
        raise ClusterConfigError(
            f"Received SLURM_STEP_TASKS_PER_NODE={','.join(map(str, step.tasks_per_node))!r}, which gives 0 tasks; "
            "expected at least 1 task per node. Run inside srun with --ntasks or --ntasks-per-node of 1 or more."
        )
    if len(step.tasks_per_node) != len(step.nodes):
        raise ClusterConfigError(
            f"Received {len(step.nodes)} node(s) in SLURM_STEP_NODELIST but {len(step.tasks_per_node)} count(s) in "
            "SLURM_STEP_TASKS_PER_NODE; expected one count per node. Run inside srun so Slurm sets both."
        )
    if not 0 <= step.rank < step.num_tasks:
        raise ClusterConfigError(
            f"Received SLURM_PROCID={step.rank} for a step of {step.num_tasks} task(s); expected 0..{step.num_tasks - 1}."
        )
    offsets = [sum(step.tasks_per_node[:i]) for i in range(len(step.nodes))]
    if step.node is not None and step.local_id is not None:
        if step.node not in step.nodes:
            raise ClusterConfigError(
                f"Received SLURMD_NODENAME={step.node!r}, which is not in SLURM_STEP_NODELIST ({','.join(step.nodes)}); "
                "expected this task's node to be one of the step's. Run the script directly under srun "
                "(not through ssh or a nested launcher), or set TF_CONFIG yourself."
            )
        position = step.nodes.index(step.node)
        count = step.tasks_per_node[position]
        if not 0 <= step.local_id < count:
            raise ClusterConfigError(
                f"Received SLURM_LOCALID={step.local_id} on {step.node!r}, which runs {count} task(s) of this step; "
                f"expected 0..{count - 1}. Run the script directly under srun, or set TF_CONFIG yourself."
            )
        return offsets[position] + step.local_id
    if step.node is not None:
        position = next(i for i, offset in enumerate(offsets + [step.num_tasks]) if offset > step.rank) - 1
        if step.nodes[position] != step.node:
            raise ClusterConfigError(
                f"Received SLURM_PROCID={step.rank} on node {step.node!r} without SLURM_LOCALID, but the block "
                f"distribution puts task {step.rank} on {step.nodes[position]!r}. Launch with srun "
                "--distribution=block (the default), or let srun set SLURM_LOCALID."
            )
    return step.rank


def tf_config_from_slurm(env: Mapping[str, str] | None = None, *, port: int | None = None) -> ClusterConfig:
    """Build this Slurm task's ``TF_CONFIG`` from the job step's ``SLURM_*`` variables.

    :func:`tfstrategy.select` does this by itself in a step of 2+ tasks; call it
    only to build the strategy without ``select``. Workers are ordered node by
    node, then by ``SLURM_LOCALID`` (= ``SLURM_PROCID`` under block distribution);
    ports as in this module's docstring.

    Args:
        env: the environment to read (``os.environ`` when omitted).
        port: base port; the k-th task on a node listens on ``port + k``.

    Raises:
        ClusterConfigError: not in a job step, or a layout tfstrategy cannot serve.

    Example:
        >>> os.environ["TF_CONFIG"] = tf_config_from_slurm().to_json()  # inside srun
    """
    env = os.environ if env is None else env
    if port is not None:
        check_port(port)
    step = read_slurm_step(env)
    if step is None:
        missing = [name for name in _REQUIRED if not env.get(name)]
        raise ClusterConfigError(
            f"Received no {', '.join(missing)} in the environment; these are set by srun inside a Slurm job step. "
            "Run the script with srun (e.g. srun --ntasks-per-node=1 python train.py), "
            "or build the cluster with tf_config_from_hosts(...)."
        )
    return _build(step, port, env)[0]


def _build(step: SlurmStep, port: int | None, env: Mapping[str, str]) -> tuple[ClusterConfig, str]:
    if env.get("SLURM_HET_SIZE"):
        raise ClusterConfigError(
            f"Received a heterogeneous job step (SLURM_HET_SIZE={env['SLURM_HET_SIZE']}); tfstrategy builds the "
            "cluster from one homogeneous step. Launch the workers with one srun without ':' components, "
            "or set TF_CONFIG yourself."
        )
    index = slurm_task_index(step)
    ports, source = step_ports(step, port, env)
    addresses = [f"{node}:{ports[k]}" for node, count in zip(step.nodes, step.tasks_per_node) for k in range(count)]
    config = validate_tf_config({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
    return config, source


@dataclass(frozen=True, kw_only=True)
class SlurmStepCluster:
    """A cluster built from a Slurm step: the config, the step, and where the ports came from."""

    config: ClusterConfig
    step: SlurmStep
    port_source: str

    def describe(self) -> str:
        """``Slurm job 7 step 0: worker 1 of 2 at node1:21235 (ports from SLURM_STEP_RESV_PORTS=...)``."""
        return (
            f"Slurm job {self.step.job_id or '?'} step {self.step.step_id or '?'}: worker {self.config.task_index} "
            f"of {self.config.num_workers} at {self.config.address} (ports {self.port_source})"
        )


def cluster_from_slurm_step(env: Mapping[str, str] | None = None) -> SlurmStepCluster | None:
    """The cluster :func:`tfstrategy.select` builds here from Slurm, or ``None``.

    ``None`` when ``TF_CONFIG`` is set (it wins), ``TFSTRATEGY_SLURM=off``, or
    this process is not a task of a Slurm job step with 2+ tasks (a batch
    script without srun is one worker).

    Raises:
        ClusterConfigError: a step of 2+ tasks whose layout tfstrategy cannot serve.
    """
    env = os.environ if env is None else env
    if env.get("TF_CONFIG", "").strip() or slurm_switched_off(env):
        return None
    step = read_slurm_step(env)
    if step is None or step.num_tasks < 2:
        return None
    config, source = _build(step, None, env)
    return SlurmStepCluster(config=config, step=step, port_source=source)


#: Slurm variables shown in the text report; ``--json`` carries every ``SLURM_*``.
SLURM_SHOWN = (
    "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_STEP_RESV_PORTS", "SLURM_DISTRIBUTION", "SLURM_RESTART_COUNT", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_CPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
)


class Slurm(ClusterEnvironment):
    """A process of a Slurm job: a task of a job step (``srun``), or a batch script (one worker).

    Construction reads the job's identity only (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``),
    so the launcher and the backups can ask for it without TensorFlow; the step is parsed
    (with TensorFlow's hostlist parser) and validated the first time the cluster is needed.

    Raises:
        ClusterConfigError: ``SLURM_RESTART_COUNT`` is not a number; later, from the cluster's
            accessors, a step whose layout tfstrategy cannot serve.
    """

    name: ClassVar[str] = "Slurm"
    tasks_phrase: ClassVar[str] = "the Slurm job step has"
    sets_tf_config: ClassVar[bool] = True
    job_id_variable: ClassVar[str | None] = "SLURM_JOB_ID"

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(environ)
        self._restart = read_count(self.environ, "SLURM_RESTART_COUNT", "Slurm (after a requeue)")
        self._off = slurm_switched_off(self.environ)
        self._read: tuple[SlurmStep | None, SlurmStepCluster | None] | None = None

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("SLURM_JOB_ID", "").strip()) or all(environ.get(name) for name in _REQUIRED)

    def _step(self) -> tuple[SlurmStep | None, SlurmStepCluster | None]:
        if self._read is None:
            step = None if self._off else read_slurm_step(self.environ)
            cluster = None
            if step is not None and step.num_tasks >= 2:
                config, source = _build(step, None, self.environ)
                cluster = SlurmStepCluster(config=config, step=step, port_source=source)
            self._read = (step, cluster)
        return self._read

    @property
    def step_cluster(self) -> SlurmStepCluster | None:
        """The cluster of a job step of 2+ tasks (what select() writes to ``TF_CONFIG``), else ``None``."""
        return self._step()[1]

    def cluster_config(self) -> ClusterConfig:
        cluster = self.step_cluster
        if cluster is None:
            raise ClusterConfigError(
                f"Received a Slurm job ({self.describe()}); it has no cluster, this process is one worker. "
                "Run the script with srun (e.g. srun --ntasks=2 python train.py) to train on the tasks of a step."
            )
        return cluster.config

    @property
    def num_workers(self) -> int:
        cluster = self.step_cluster
        return cluster.config.num_workers if cluster else 1

    @property
    def task_index(self) -> int:
        cluster = self.step_cluster
        return cluster.config.task_index if cluster else 0

    def job_id(self) -> str | None:
        """``slurm-<SLURM_JOB_ID>``: kept by a requeue, shared by every task of the job."""
        value = self.environ.get("SLURM_JOB_ID", "").strip()
        return f"slurm-{value}" if value else None

    def restart_count(self) -> int:
        """``SLURM_RESTART_COUNT``: how many times the job was requeued."""
        return self._restart

    def describe(self) -> str:
        step, cluster = self._step()
        if cluster is not None:
            return cluster.describe()
        job = f"Slurm job {self.environ.get('SLURM_JOB_ID') or '?'}"
        if self._off:
            return f"{job}; {ENV_SLURM}=off, so every task is its own job"
        if step is None:
            return f"{job}, not in a job step (a batch script without srun is one worker)"
        return f"Slurm {step.describe()}; one task, so one worker"

    @classmethod
    def report_lines(cls, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The ``SLURM_*`` variables that matter, and the job step this process is a task of."""
        values = {key: environ[key] for key in sorted(environ) if key.startswith("SLURM_")}
        line = ("Slurm", variables_line(values, SLURM_SHOWN, "not under Slurm (no SLURM_* variables)"))
        return (line, ("Slurm job step", describe_slurm_step(environ))) if values else (line,)

    @classmethod
    def report_values(cls, environ: Mapping[str, str]) -> dict[str, object]:
        """Every ``SLURM_*`` variable, and the job step in one line."""
        values = {key: environ[key] for key in sorted(environ) if key.startswith("SLURM_")}
        return {"slurm": values, "slurm_step": describe_slurm_step(environ)}


def describe_slurm_step(environ: Mapping[str, str]) -> str:
    """The job step this process is a task of, and what select() does with it, in one line; never raises."""
    try:
        step = read_slurm_step(environ)
        if step is None:
            return "not in a job step (a batch script without srun is one worker)" if environ.get("SLURM_JOB_ID") else "none"
        text = step.describe()
        if environ.get("TF_CONFIG", "").strip():
            return f"{text}; TF_CONFIG is set, so select() uses it instead"
        if step.num_tasks < 2:
            return f"{text}; one task, so one worker"
        cluster = cluster_from_slurm_step(environ)
        if cluster is None:
            return f"{text}; {ENV_SLURM}=off, so every task is its own job"
        config = cluster.config
        return (f"{text}; select() sets TF_CONFIG: worker {config.task_index} of {config.num_workers} at "
                f"{config.address}, workers {','.join(config.cluster['worker'])} (ports {cluster.port_source})")
    except TFStrategyError as error:
        return f"{type(error).__name__}: {error}"
