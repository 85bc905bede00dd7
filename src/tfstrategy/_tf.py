"""Lazy access to TensorFlow.

TensorFlow takes seconds to import and must not start its runtime before
``cpu_replicas`` splits the CPU, so modules import it through :func:`tf`
inside the functions that need it, never at module level.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tfstrategy.errors import MissingDependencyError

INSTALL_HINT = (
    "Install it with the extra that fits this host: "
    "pip install 'tfstrategy[cpu]' (CPU only, tensorflow-cpu) or "
    "pip install 'tfstrategy[gpu]' (tensorflow with CUDA)."
)


def ensure_tensorflow_installed() -> None:
    """Raise a helpful error if no TensorFlow wheel is installed (cheap: no import)."""
    if importlib.util.find_spec("tensorflow") is None:
        raise MissingDependencyError(f"tfstrategy needs TensorFlow, which is not installed. {INSTALL_HINT}")


def tf() -> ModuleType:
    """Return the ``tensorflow`` module, importing it on first use."""
    try:
        import tensorflow
    except ImportError as error:  # pragma: no cover - exercised only without TF
        raise MissingDependencyError(f"tfstrategy could not import TensorFlow ({error}). {INSTALL_HINT}") from error
    return tensorflow  # type: ignore[no-any-return]  # TensorFlow ships no types
