"""Lazy access to TensorFlow.

TensorFlow takes seconds to import and must not start its runtime before
``cpu_replicas`` splits the CPU, so modules import it through :func:`tf`
inside the functions that need it, never at module level.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tfstrategy.errors import MissingDependencyError

INSTALL_HINT = (
    "Install it with the extra that fits this host: "
    "pip install 'tfstrategy[cpu]' (CPU only, tensorflow-cpu) or "
    "pip install 'tfstrategy[gpu]' (tensorflow with CUDA)."
)


def not_installed_message(needed_by: str = "tfstrategy") -> str:
    """``needed_by needs TensorFlow, which is not installed in this Python (...)``, with the extras to install."""
    return f"{needed_by} needs TensorFlow, which is not installed in this Python ({sys.executable}). {INSTALL_HINT}"


def ensure_tensorflow_installed(needed_by: str = "tfstrategy") -> None:
    """Raise a helpful error if no TensorFlow wheel is installed (cheap: no import).

    Args:
        needed_by: what needs it, for the message (``tfstrategy check``).

    Raises:
        MissingDependencyError: ``tensorflow`` cannot be found.
    """
    if importlib.util.find_spec("tensorflow") is None:
        raise MissingDependencyError(not_installed_message(needed_by))


def tf() -> ModuleType:
    """Return the ``tensorflow`` module, importing it on first use.

    Raises:
        MissingDependencyError: TensorFlow is not installed or fails to import.
    """
    try:
        import tensorflow
    except ImportError as error:
        if isinstance(error, ModuleNotFoundError) and error.name == "tensorflow":
            raise MissingDependencyError(not_installed_message()) from error
        raise MissingDependencyError(f"tfstrategy could not import TensorFlow ({error}). {INSTALL_HINT}") from error
    return tensorflow  # type: ignore[no-any-return]  # TensorFlow ships no types
