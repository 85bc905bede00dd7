"""A worker started by ``tfstrategy launch``: its ``TF_CONFIG`` plus the launcher's ``TFSTRATEGY_*`` variables.

The launcher writes every worker's ``TF_CONFIG`` and, beside it, the job size,
the worker's index and the group's restart count
(:mod:`tfstrategy.multiworker.worker_protocol` lists them). It is first in the
detect list: a launch inside a Slurm allocation or a Ray task is the launcher's
job, whatever the outer variables say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from tfstrategy.environments.base import ClusterEnvironment, read_count, training_rank
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import ClusterConfig, load_cluster_config
from tfstrategy.settings import ENV_NUM_WORKERS, ENV_RESTART, ENV_WORKER_INDEX

__all__ = ["Launcher"]

_SET_BY = "tfstrategy launch"


class Launcher(ClusterEnvironment):
    """A worker of ``tfstrategy launch`` (``TFSTRATEGY_NUM_WORKERS``, ``TFSTRATEGY_WORKER_INDEX``, ``TF_CONFIG``).

    Raises:
        ClusterConfigError: a variable is missing, not a number, or disagrees with ``TF_CONFIG``.
    """

    name: ClassVar[str] = "tfstrategy launch"
    tasks_phrase: ClassVar[str] = "TF_CONFIG describes"

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(environ)
        for variable in (ENV_NUM_WORKERS, ENV_WORKER_INDEX):
            if not self.environ.get(variable, "").strip():
                raise ClusterConfigError(
                    f"Received {ENV_NUM_WORKERS}={self.environ.get(ENV_NUM_WORKERS)!r} and {ENV_WORKER_INDEX}="
                    f"{self.environ.get(ENV_WORKER_INDEX)!r}; {_SET_BY} sets both for each worker. Unset them if "
                    "they are left over from another job, or start the script with tfstrategy launch."
                )
        workers = read_count(self.environ, ENV_NUM_WORKERS, _SET_BY)
        index = read_count(self.environ, ENV_WORKER_INDEX, _SET_BY)
        self._restart = read_count(self.environ, ENV_RESTART, _SET_BY)
        config = load_cluster_config(self.environ)
        if config is None:
            raise ClusterConfigError(
                f"Received {ENV_NUM_WORKERS}={workers} without TF_CONFIG; {_SET_BY} sets both for each worker. "
                f"Unset {ENV_NUM_WORKERS} and {ENV_WORKER_INDEX} if they are left over from another job."
            )
        if (config.num_workers, training_rank(config)) != (workers, index):
            raise ClusterConfigError(
                f"Received {ENV_NUM_WORKERS}={workers} and {ENV_WORKER_INDEX}={index}, but TF_CONFIG describes "
                f"{config.task_name} of {config.num_workers} training task(s); {_SET_BY} sets all three together. "
                "Leave them as the launcher wrote them, or unset the TFSTRATEGY_* ones to use TF_CONFIG alone."
            )
        self._config = config

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get(ENV_NUM_WORKERS, "").strip() or environ.get(ENV_WORKER_INDEX, "").strip())

    def cluster_config(self) -> ClusterConfig:
        return self._config

    def restart_count(self) -> int:
        """``TFSTRATEGY_RESTART``: the restarts of the worker group by ``--max-restarts``."""
        return self._restart

    def describe(self) -> str:
        restart = f", restart {self._restart}" if self._restart else ""
        return f"tfstrategy launch: worker {self.task_index} of {self.num_workers} at {self._config.address}{restart}"
