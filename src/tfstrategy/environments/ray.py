"""A Ray Train worker: Ray starts the process (``RAY_RAYLET_PID``, ``RAY_JOB_ID``) and writes its ``TF_CONFIG``.

Ray Train's ``TensorflowTrainer`` writes ``TF_CONFIG`` into every worker before
the training function runs; the raylet that started the worker process sets
``RAY_RAYLET_PID`` and ``RAY_JOB_ID`` (the nil id ``ffffffff`` in a worker Ray
started before it had a job, as it usually does: then there is no job id here).
Ray owns restarts (from its own checkpoints, :mod:`tfstrategy.integrations.ray`),
so the restart count here is 0. Reading these variables never imports Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from tfstrategy.environments.base import ClusterEnvironment
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import ClusterConfig, load_cluster_config

__all__ = ["Ray"]

#: ``RAY_JOB_ID`` of a worker started before Ray gave it a job (JobID.nil()).
NIL_JOB_ID = "ffffffff"


class Ray(ClusterEnvironment):
    """A worker of a Ray Train ``TensorflowTrainer``.

    Raises:
        ClusterConfigError: the ``TF_CONFIG`` Ray wrote is invalid.
    """

    name: ClassVar[str] = "Ray"
    tasks_phrase: ClassVar[str] = "TF_CONFIG describes"
    job_id_variable: ClassVar[str | None] = "RAY_JOB_ID"

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(environ)
        config = load_cluster_config(self.environ)
        if config is None:
            raise ClusterConfigError(
                "Received a Ray worker (RAY_RAYLET_PID is set) without TF_CONFIG; Ray Train's TensorflowTrainer "
                "writes it before the training function runs. Run the code inside that training function."
            )
        self._config = config

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("RAY_RAYLET_PID", "").strip() and environ.get("TF_CONFIG", "").strip())

    def cluster_config(self) -> ClusterConfig:
        return self._config

    def job_id(self) -> str | None:
        """``ray-<RAY_JOB_ID>``: the driver's job, the same for every worker and after Ray restarts the group."""
        value = self.environ.get("RAY_JOB_ID", "").strip()
        return f"ray-{value}" if value and value.lower() != NIL_JOB_ID else None

    def describe(self) -> str:
        job = self.job_id()
        return f"Ray{f' job {job[4:]}' if job else ''}: worker {self.task_index} of {self.num_workers} at {self._config.address}"
