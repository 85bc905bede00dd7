"""Moved to :mod:`tfstrategy.environments.slurm`; these names resolve with a DeprecationWarning until 0.4."""

from __future__ import annotations

from tfstrategy._moved import moved_names

__getattr__ = moved_names(__name__, "tfstrategy.environments.slurm", (
    "SlurmStep", "SlurmStepCluster", "cluster_from_slurm_step", "parse_port_list", "read_slurm_step",
    "slurm_task_index", "step_ports", "tf_config_from_slurm"))
