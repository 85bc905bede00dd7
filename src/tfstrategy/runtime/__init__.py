"""Everything that runs inside a training process: the plans of process-wide steps and the start-up hook.

- :mod:`~tfstrategy.runtime.inputs`: the plan's inputs, derived once from arguments and environment;
- :mod:`~tfstrategy.runtime.plan`, :mod:`~tfstrategy.runtime.steps`, :mod:`~tfstrategy.runtime.hook_steps`:
  the process-wide steps as objects that ``select()``, the start-up hook and ``tfstrategy env`` share;
- the start-up hook (:mod:`~tfstrategy.runtime.worker_hook`, ``startup/sitecustomize.py``) and its
  steps' code (``hook_*``, :mod:`~tfstrategy.runtime.worker_watch`, :mod:`~tfstrategy.runtime.rewrites`,
  :mod:`~tfstrategy.runtime.one_job`).

What all of it installs registers with :data:`tfstrategy.state.RUNTIME`, on the ground floor
(:mod:`tfstrategy.state`), which this package's ``RUNTIME``, ``Override``, ``ProcessRuntime`` and
``reset`` of 0.2 now name, with a DeprecationWarning until 0.4.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_NEW_HOME = "tfstrategy.state"
_REMOVED_IN = "0.4"
_NAMES = ("RUNTIME", "Override", "ProcessRuntime", "reset")


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} moved to {_NEW_HOME} (from {_NEW_HOME} import {name}); the old name is "
                  f"removed in tfstrategy {_REMOVED_IN}.", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_NEW_HOME), name)
