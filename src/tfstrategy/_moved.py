"""The one way a module's names that moved keep resolving: a module ``__getattr__`` that warns, then loads.

The old module stays a few lines (``__getattr__ = moved_names(__name__, "new.home", (...))``) and imports
nothing of its new home until a moved name is read, so it adds no import back up the layers.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["REMOVED_IN", "moved_names"]

#: The release that removes the old names (each resolves with a DeprecationWarning until then).
REMOVED_IN = "0.4"


def moved_names(module: str, new_home: str, names: tuple[str, ...]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: each of ``names`` warns that it moved to ``new_home`` and is read there."""

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {new_home} (from {new_home} import {name}); the old name is "
                      f"removed in tfstrategy {REMOVED_IN}.", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new_home), name)

    return __getattr__
