"""Save a model from every worker without deadlocking a multi-worker job.

Under MultiWorkerMirroredStrategy, saving reads variables, and reading a
variable that is synchronised on read (metrics, some optimizer slots) is a
collective op: every worker must take part. ``if chief: model.save(path)``
therefore leaves the chief waiting for peers that never join the all-reduce.
:func:`save_model` is called by every worker and writes through
:func:`~tfstrategy.multiworker.chief_files.chief_write`, the rule Keras' own
writers follow under tfstrategy: the chief writes the real path, the others
the same thing to a private temporary directory that is removed afterwards,
so the collectives match, only one file appears, and no worker returns
before the chief's file is complete.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tfstrategy.errors import SaveError
from tfstrategy.multiworker.chief_files import chief_write
from tfstrategy.multiworker.cluster import load_cluster_config

if TYPE_CHECKING:
    from tfstrategy._protocols import Model

__all__ = ["save_model"]

SUFFIXES = (".keras", ".weights.h5")


def validate_save_path(path: object) -> Path:
    """``path`` as a ``Path`` if it names a whole model (``.keras``) or its weights (``.weights.h5``).

    Raises:
        SaveError: anything else.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise SaveError(f"Received path={path!r} ({type(path).__name__}); expected a file path such as 'out/model.keras'.")
    path = Path(path)
    if not path.name.endswith(SUFFIXES):
        raise SaveError(
            f"Received path={str(path)!r}; expected a file ending in {' or '.join(SUFFIXES)} "
            "(a whole model or its weights), e.g. 'out/model.keras'."
        )
    return path


def save_model(model: Model, path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> Path | None:
    """Save ``model`` (``.keras``) or its weights (``.weights.h5``); call it on every worker.

    Args:
        model: a Keras model.
        path: the file the chief writes; parent directories are created.
        env: environment to read ``TF_CONFIG`` from (``os.environ`` when omitted).

    Returns:
        ``path`` on the chief (and in a single process), ``None`` on other workers.

    Raises:
        SaveError: unsupported file name.
        ClusterConfigError: ``TF_CONFIG`` is invalid.

    Example:
        >>> tfstrategy.save_model(model, "out/model.keras")  # same line on every worker
    """
    if not (hasattr(model, "save") and hasattr(model, "save_weights")):
        raise SaveError(
            f"Received model of type {type(model).__name__}; expected a Keras model (with save and save_weights)."
        )
    config = load_cluster_config(env)
    path = validate_save_path(path)
    with chief_write(path, env=env) as target:
        try:
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, "it is a directory", str(target))
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.name.endswith(".weights.h5"):
                model.save_weights(str(target), overwrite=True)
            else:
                model.save(str(target), overwrite=True)
        except OSError as error:
            blocker = next((p for p in (target.parent, *target.parent.parents) if p.exists() and not p.is_dir()), None)
            reason = (f"{blocker} is a file, not a directory" if blocker
                      else f"{error.strerror or error} ({error.filename or target})")
            raise SaveError(
                f"Received path={str(path)!r}, which cannot be written: {reason}. Pass a path in a writable directory, "
                "or fix the permissions."
            ) from error
    return path if config is None or config.is_chief or config.num_workers < 2 else None
