"""Moved to :mod:`tfstrategy.runtime.select` (``select()`` takes the plan's steps, so it stands with the plans,
above what it chooses and builds with); these names resolve with a DeprecationWarning until 0.4."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_NEW_HOME = "tfstrategy.runtime.select"
_REMOVED_IN = "0.4"
_NAMES = ("Request", "Selection", "resolve_request", "select")


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} moved to {_NEW_HOME} (from {_NEW_HOME} import {name}); the old module is "
                  f"removed in tfstrategy {_REMOVED_IN}.", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_NEW_HOME), name)
