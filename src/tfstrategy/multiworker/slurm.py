"""Moved to :mod:`tfstrategy.environments.slurm`; these names resolve with a DeprecationWarning until 0.4."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_NEW_HOME = "tfstrategy.environments.slurm"
_REMOVED_IN = "0.4"
_NAMES = ("SlurmStep", "SlurmStepCluster", "cluster_from_slurm_step", "parse_port_list", "read_slurm_step",
          "slurm_task_index", "step_ports", "tf_config_from_slurm")


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} moved to {_NEW_HOME} (from {_NEW_HOME} import {name}); the old module is "
                  f"removed in tfstrategy {_REMOVED_IN}.", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_NEW_HOME), name)
