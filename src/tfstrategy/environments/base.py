"""The one interface of a cluster environment: where this process runs, read from its variables.

A cluster environment is whatever started this process and tells it, through
environment variables, who its peers are (``tfstrategy launch``, Ray Train, a
user's ``TF_CONFIG``, a Slurm job step). Each one is a small subclass of
:class:`ClusterEnvironment` in its own module, listed once in
:data:`tfstrategy.environments.ENVIRONMENTS`; nothing else in tfstrategy names
it. Subclasses read only the mapping they are given (never ``os.environ``), so
they are tested with dicts.
"""

from __future__ import annotations

import abc
import signal
from collections.abc import Mapping
from typing import ClassVar

from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import ClusterConfig

__all__ = ["ClusterEnvironment", "read_count", "training_rank", "variables_line"]


class ClusterEnvironment(abc.ABC):
    """One way a process learns its cluster: detected cheaply, validated on construction.

    Subclasses set :attr:`name`, implement :meth:`detect`, :meth:`cluster_config`
    and :meth:`describe`, and override the rest where their scheduler says more
    (a job id, a restart count, another preemption signal).

    Args:
        environ: the environment to read (a copy is kept).

    Raises:
        TFStrategyError: a variable of this environment is invalid; the message
            names the variable and what sets it.
    """

    #: What users call it: ``"TF_CONFIG"``, ``"Slurm"``, ``"Ray"``, ``"tfstrategy launch"``.
    name: ClassVar[str]
    #: True when tfstrategy writes ``TF_CONFIG`` from :meth:`cluster_config` (the scheduler does not).
    sets_tf_config: ClassVar[bool] = False
    #: The variable the job id comes from (``SLURM_JOB_ID``), or ``None``.
    job_id_variable: ClassVar[str | None] = None
    #: How select()'s reason says where the tasks come from: "auto: <phrase> 2 tasks, so ..."
    #: (empty: "the <name> cluster has").
    tasks_phrase: ClassVar[str] = ""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ: Mapping[str, str] = dict(environ)

    @classmethod
    @abc.abstractmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether this process runs in this environment; cheap, and never raises."""

    @abc.abstractmethod
    def cluster_config(self) -> ClusterConfig:
        """The job's cluster, as ``TF_CONFIG`` would describe it.

        Raises:
            ClusterConfigError: this process is one worker without a cluster (``num_workers`` is 1 and the
                environment has no ``TF_CONFIG`` of its own), or the layout cannot be served.
        """

    @property
    def num_workers(self) -> int:
        """Training tasks (chief and workers) in the job; 1 for a process without a cluster."""
        return self.cluster_config().num_workers

    @property
    def task_index(self) -> int:
        """This process's rank among the training tasks, ``0..num_workers - 1`` (a chief first)."""
        return training_rank(self.cluster_config())

    def job_id(self) -> str | None:
        """The scheduler's id of the job (the same on every worker and after a restart), or ``None``."""
        return None

    def restart_count(self) -> int:
        """How many times the scheduler restarted this job before this start (0 when it does not say)."""
        return 0

    def preemption_signal(self) -> int:
        """The signal the scheduler sends before it stops the job (SIGTERM unless it says otherwise)."""
        return int(signal.SIGTERM)

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for humans, e.g. ``Slurm job 7 step 0: worker 1 of 4 at n1:21235 (...)``."""

    @classmethod
    def report_lines(cls, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """``tfstrategy env``'s lines about this environment's own variables (none by default); never raises."""
        return ()

    @classmethod
    def report_values(cls, environ: Mapping[str, str]) -> dict[str, object]:
        """``tfstrategy env --json``'s fields about this environment's variables (none by default); never raises."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.describe()}>"


def training_rank(config: ClusterConfig) -> int:
    """A task's rank over every training task: the chief first, then the workers (an evaluator keeps its index)."""
    if config.task_type == "worker":
        return len(config.cluster.get("chief", ())) + config.task_index
    return config.task_index


def read_count(environ: Mapping[str, str], variable: str, set_by: str, *, default: int = 0) -> int:
    """A non-negative integer variable, ``default`` when unset or empty.

    Raises:
        ClusterConfigError: it is set but not a non-negative integer; names the variable and ``set_by``.
    """
    text = environ.get(variable, "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 9:
        raise ClusterConfigError(
            f"Received {variable}={text[:40]!r}; expected a non-negative integer, as {set_by} sets it. "
            f"Unset {variable} if it is left over from another job."
        )
    return int(text)


def variables_line(values: Mapping[str, str], shown: tuple[str, ...] | None, empty: str) -> str:
    """``A=1, B=2 (+3 more with --json)``: the ``shown`` variables (all when ``None``) for ``tfstrategy env``."""
    if not values:
        return empty
    keys = [key for key in values if shown is None or key in shown]
    # A 10 KB value is shown cut: the report is for pasting (--json keeps it whole).
    text = ", ".join(f"{key}={values[key] if len(values[key]) <= 200 else values[key][:200] + '...'}" for key in keys)
    hidden = len(values) - len(keys)
    return text + (f" (+{hidden} more with --json)" if hidden else "")
