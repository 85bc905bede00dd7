"""The ground floor: what tfstrategy changed or remembers in this process, owned by one object, :data:`RUNTIME`.

- :mod:`~tfstrategy.state.registry`: :class:`ProcessRuntime` (:data:`RUNTIME`), the registry of every
  replacement of upstream code, every job state and every value kept per user object
  (:class:`Attachments`), and the one :func:`reset`;
- :mod:`~tfstrategy.state.replacement`: :class:`Replacement`, the undoable replacement of named
  targets that a patch and a hook rewrite both are;
- :mod:`~tfstrategy.state.status`: :class:`PatchStatus`, what each replacement reports.

It imports nothing of tfstrategy above it, so every layer may register here.
"""

from __future__ import annotations

from tfstrategy.state.registry import RUNTIME, Attachments, HookState, Override, ProcessRuntime, reset
from tfstrategy.state.replacement import Replacement
from tfstrategy.state.status import PatchStatus

__all__ = ["RUNTIME", "Attachments", "HookState", "Override", "PatchStatus", "ProcessRuntime", "Replacement", "reset"]
