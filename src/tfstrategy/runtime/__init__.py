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

from tfstrategy._moved import moved_names

__getattr__ = moved_names(__name__, "tfstrategy.state", ("RUNTIME", "Override", "ProcessRuntime", "reset"))
