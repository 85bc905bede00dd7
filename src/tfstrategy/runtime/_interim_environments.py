"""Stand-in for ``tfstrategy.environments`` until that package lands (same API, TF_CONFIG and Slurm only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tfstrategy.multiworker.cluster import ClusterConfig, load_cluster_config, read_tf_config
from tfstrategy.multiworker.slurm import cluster_from_slurm_step, read_slurm_step


class _TFConfig:
    name = "TF_CONFIG"
    sets_tf_config = False

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env

    def cluster_config(self) -> ClusterConfig | None:
        return load_cluster_config(self._env)

    def describe(self) -> str:
        return "TF_CONFIG"


class _Slurm:
    name = "Slurm"
    sets_tf_config = True

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env

    def cluster_config(self) -> ClusterConfig | None:
        cluster = cluster_from_slurm_step(self._env)
        return None if cluster is None else cluster.config

    def describe(self) -> str:
        cluster = cluster_from_slurm_step(self._env)
        return "a Slurm job step" if cluster is None else cluster.describe()


def detect_environment(env: Mapping[str, str]) -> Any:
    if read_tf_config(env) is not None:
        return _TFConfig(env)
    if read_slurm_step(env) is not None:
        return _Slurm(env)
    return None
