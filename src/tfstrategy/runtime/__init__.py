"""Everything that runs inside a training process, owned by one object: :data:`RUNTIME`.

- :mod:`~tfstrategy.runtime.inputs`: the plan's inputs, derived once from arguments and environment;
- :mod:`~tfstrategy.runtime.plan`, :mod:`~tfstrategy.runtime.steps`, :mod:`~tfstrategy.runtime.hook_steps`:
  the process-wide steps as objects that ``select()``, the start-up hook and ``tfstrategy env`` share;
- :mod:`~tfstrategy.runtime.process`: :class:`ProcessRuntime`, the registry of every replacement of
  upstream code and every job state, and the one :func:`reset`;
- the start-up hook (:mod:`~tfstrategy.runtime.worker_hook`, ``startup/sitecustomize.py``) and its
  steps' code (``hook_*``, :mod:`~tfstrategy.runtime.worker_watch`, :mod:`~tfstrategy.runtime.rewrites`,
  :mod:`~tfstrategy.runtime.one_job`).
"""

from __future__ import annotations

from tfstrategy.runtime.process import RUNTIME, Override, ProcessRuntime

__all__ = ["RUNTIME", "Override", "ProcessRuntime", "reset"]


def reset() -> None:
    """Undo every replacement tfstrategy installed in this process and clear every job state.

    A second job in the same process then starts as the first did (its plan is derived anew).
    """
    RUNTIME.reset()
