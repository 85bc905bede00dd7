"""A ``TF_CONFIG`` someone else wrote: the user, a job template, an operator (TFJob).

It comes after the environments that write ``TF_CONFIG`` themselves (``tfstrategy
launch``, Ray Train) in the detect list, and before those tfstrategy derives a
``TF_CONFIG`` from (a Slurm step): an explicit ``TF_CONFIG`` always wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from tfstrategy.environments.base import ClusterEnvironment
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import ClusterConfig, read_tf_config, validate_tf_config

__all__ = ["TFConfig"]


class TFConfig(ClusterEnvironment):
    """``TF_CONFIG`` set by hand or by a tool tfstrategy does not know.

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is not valid (see :func:`tfstrategy.multiworker.cluster.validate_tf_config`).
    """

    name: ClassVar[str] = "TF_CONFIG"
    tasks_phrase: ClassVar[str] = "TF_CONFIG describes"

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(environ)
        config = read_tf_config(self.environ)
        if config is None:  # detect() was not asked first
            raise ClusterConfigError("Received no TF_CONFIG; expected the cluster as JSON. Set TF_CONFIG, or "
                                     "start the workers with tfstrategy launch.")
        self._config = validate_tf_config(config)

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("TF_CONFIG", "").strip())

    def cluster_config(self) -> ClusterConfig:
        return self._config

    def describe(self) -> str:
        config = self._config
        return f"TF_CONFIG: {config.task_name} of {config.num_workers} training task(s) at {config.address}"
