"""The worker's side of ``tfstrategy launch``: the variables it receives and the signals it sends.

``tfstrategy launch`` starts each worker with ``TF_CONFIG`` and these variables:

========================== ===============================================================
``TFSTRATEGY_NUM_WORKERS``  workers in the job
``TFSTRATEGY_WORKER_INDEX`` this worker's index (also ``task.index`` in ``TF_CONFIG``)
``TFSTRATEGY_RESTART``      0 on the first start, k after the k-th restart of the group
``TFSTRATEGY_JOIN_FILE``    written by tfstrategy once this worker's strategy exists
``TFSTRATEGY_BACKUP_DIR``   base directory of the per-worker BackupAndRestore state
========================== ===============================================================

Joining: MultiWorkerMirroredStrategy's constructor returns only once every
worker has connected, so :func:`tfstrategy.select` (and :func:`tfstrategy.scope.build`)
writes ``<TFSTRATEGY_JOIN_FILE>.starting`` just before creating it and
``TFSTRATEGY_JOIN_FILE`` right after. The launcher counts a worker as joined
when the second file exists, and uses the first (or the worker's port
accepting connections) to tell a worker still waiting for its peers from one
that never got as far as creating its strategy. A script that creates the
strategy itself calls :func:`signal_joined` afterwards.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfstrategy.errors import SaveError
from tfstrategy.multiworker.cluster import load_cluster_config
from tfstrategy.settings import ENV_BACKUP_DIR, ENV_JOIN_FILE, ENV_RESTART

__all__ = ["signal_joined", "signal_starting", "backup_callbacks"]


def signal_joined(env: Mapping[str, str] | None = None) -> bool:
    """Tell ``tfstrategy launch`` this worker's strategy exists; a no-op outside it.

    Returns:
        Whether a join file was written.
    """
    env = os.environ if env is None else env
    return _touch(env.get(ENV_JOIN_FILE))


def signal_starting(env: Mapping[str, str] | None = None) -> bool:
    """Tell ``tfstrategy launch`` this worker is creating its strategy (waiting for its peers)."""
    env = os.environ if env is None else env
    path = env.get(ENV_JOIN_FILE)
    return _touch(f"{path}.starting" if path else None)


def _touch(path: str | None) -> bool:
    if not path:
        return False
    # Write then rename, so the launcher never sees a half-written file.
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(f"{os.getpid()}\n")
    os.replace(tmp, path)
    return True


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times ``tfstrategy launch`` restarted the group before this start (0 outside it)."""
    env = os.environ if env is None else env
    try:
        return int(env.get(ENV_RESTART, "0") or 0)
    except ValueError:
        return 0


def worker_backup_dir(backup_dir: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """This task's own BackupAndRestore directory, ``<backup_dir>/<task>`` (e.g. ``.../worker-1``).

    Every worker needs its own directory: with one shared directory the workers
    write the same ``latest.weights.h5`` and HDF5's file lock fails with
    ``BlockingIOError``. ``backup_dir`` defaults to ``TFSTRATEGY_BACKUP_DIR``;
    ``None`` when neither is set.

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is set but invalid.
    """
    env = os.environ if env is None else env
    base = backup_dir if backup_dir is not None else env.get(ENV_BACKUP_DIR) or None
    if base is None:
        return None
    config = load_cluster_config(env)
    return Path(base) / (config.task_name if config else "worker-0")


def backup_callbacks(backup_dir: str | os.PathLike[str] | None = None, **options: Any) -> list[Any]:
    """``[keras.callbacks.BackupAndRestore]`` on this task's own directory, or ``[]`` if none is configured.

    Pass the result to ``model.fit(callbacks=[*tfstrategy.backup_callbacks(), ...])``: under
    ``tfstrategy launch --max-restarts K`` a restarted group resumes from the last
    finished epoch (or every ``save_freq`` steps), each worker from its own state.

    Args:
        backup_dir: base directory; defaults to ``TFSTRATEGY_BACKUP_DIR``.
        **options: passed to ``BackupAndRestore`` (e.g. ``save_freq=4``). ``double_checkpoint``
            defaults to True: a worker killed while writing its backup leaves the previous one usable.

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is set but invalid.
        SaveError: the directory cannot be created or written.
    """
    directory = worker_backup_dir(backup_dir)
    if directory is None:
        return []
    import keras

    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied", str(directory))
    except OSError as error:
        source = "backup_dir" if backup_dir is not None else ENV_BACKUP_DIR
        base = backup_dir if backup_dir is not None else os.environ.get(ENV_BACKUP_DIR)
        raise SaveError(
            f"Received {source}={str(base)!r}; the backup directory {str(directory)!r} cannot be created or written "
            f"({error.strerror or error}: {error.filename or directory}). Pass a writable directory "
            "(tfstrategy launch --backup-dir DIR)."
        ) from error
    options.setdefault("double_checkpoint", True)
    from tfstrategy.multiworker.chief_files import keep_per_worker

    # Its own directory per worker: every worker writes it (not only the chief, as for a shared one).
    return [keep_per_worker(keras.callbacks.BackupAndRestore(backup_dir=str(directory), **options))]
