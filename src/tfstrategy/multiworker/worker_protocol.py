"""The worker's side of ``tfstrategy launch``: the variables it receives and the signals it sends.

``tfstrategy launch`` starts each worker with ``TF_CONFIG`` and the variables of one typed
contract, :class:`tfstrategy.worker_contract.WorkerContract` (read here with
:meth:`~tfstrategy.worker_contract.WorkerContract.from_environ`, every value checked), among them:

========================== ===============================================================
``TFSTRATEGY_NUM_WORKERS``  workers in the job
``TFSTRATEGY_WORKER_INDEX`` this worker's index (also ``task.index`` in ``TF_CONFIG``)
``TFSTRATEGY_RESTART``      0 on the first start, k after the k-th restart of the group
``TFSTRATEGY_JOIN_FILE``    written by tfstrategy once this worker's strategy exists
``TFSTRATEGY_BACKUP_DIR``   the job's backup directory (each worker's part in ``<dir>/<task>``)
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

from tfstrategy.contract.files import starting_file
from tfstrategy.errors import SaveError
from tfstrategy.multiworker.cluster import load_cluster_config
from tfstrategy.settings import BACKUP_DIR
from tfstrategy.worker_contract import WorkerContract

__all__ = ["signal_joined", "signal_starting", "backup_callbacks"]


def signal_joined(env: Mapping[str, str] | None = None) -> bool:
    """Tell ``tfstrategy launch`` this worker's strategy exists; a no-op outside it.

    Returns:
        Whether a join file was written.
    """
    join_file = WorkerContract.from_environ(os.environ if env is None else env).join_file
    return _touch(None if join_file is None else str(join_file))


def signal_starting(env: Mapping[str, str] | None = None) -> bool:
    """Tell ``tfstrategy launch`` this worker is creating its strategy (waiting for its peers)."""
    join_file = WorkerContract.from_environ(os.environ if env is None else env).join_file
    return _touch(None if join_file is None else str(starting_file(join_file)))


def _touch(path: str | None) -> bool:
    if not path:
        return False
    # Write then rename, so the launcher never sees a half-written file.
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(f"{os.getpid()}\n")
    os.replace(tmp, path)
    return True


def worker_backup_dir(backup_dir: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """This task's own part of the job's backups, ``<backup_dir>/<task>`` (e.g. ``.../worker-1``).

    Every worker writes its own part (a save is a collective every worker takes
    part in), so one shared file would fail on HDF5's file lock with ``BlockingIOError``. ``backup_dir`` defaults to ``TFSTRATEGY_BACKUP_DIR``;
    ``None`` when neither is set.

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is set but invalid.
    """
    env = os.environ if env is None else env
    base = backup_dir if backup_dir is not None else WorkerContract.from_environ(env).settings.backup_dir
    if base is None:
        return None
    config = load_cluster_config(env)
    return Path(base) / (config.task_name if config else "worker-0")


def backup_callbacks(backup_dir: str | os.PathLike[str] | None = None, **options: object) -> list[object]:
    """A coordinated ``BackupAndRestore`` for this job, or ``[]`` if no backup directory is configured.

    Pass the result to ``model.fit(callbacks=[*tfstrategy.backup_callbacks(), ...])``: under
    ``tfstrategy launch --max-restarts K``, a Slurm requeue or a plain ``TF_CONFIG`` restart,
    every worker resumes from the newest step that *every* worker backed up (committed), never
    from its own newer or older copy. Each worker writes its part to ``<backup_dir>/<task>``;
    a part that is missing, truncated or altered is never loaded, a backup of another job is
    refused, and a directory other users can write is refused.

    Args:
        backup_dir: the job's backup directory; defaults to ``TFSTRATEGY_BACKUP_DIR``.
        **options: ``save_freq`` (``"epoch"``, the default, or a number of batches) and
            ``delete_checkpoint`` (default True: remove the backup once ``fit`` completes), as
            Keras' ``BackupAndRestore``; ``double_checkpoint`` is accepted and always on (the
            previous committed step is kept until the next one is complete).

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is set but invalid.
        SaveError: the directory cannot be created or written, or an unknown option.
        UntrustedBackupError: the directory is another user's or writable by other users.

    Example:
        >>> model.fit(dataset, epochs=20, callbacks=tfstrategy.backup_callbacks())
    """
    from tfstrategy.multiworker import commit
    from tfstrategy.multiworker.backups import backup_callback

    directory = worker_backup_dir(backup_dir)
    if directory is None:
        return []
    unknown = sorted(set(options) - {"save_freq", "delete_checkpoint", "double_checkpoint"})
    if unknown:
        raise SaveError(f"Received backup option(s) {', '.join(unknown)}; expected save_freq, delete_checkpoint or "
                        "double_checkpoint (as keras.callbacks.BackupAndRestore).")
    try:
        commit.make_private_dir(directory)
        commit.check_trusted(directory.parent)
        if not os.access(directory, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "permission denied", str(directory))
    except OSError as error:
        source = "backup_dir" if backup_dir is not None else BACKUP_DIR.name
        base = backup_dir if backup_dir is not None else BACKUP_DIR.text(os.environ)
        raise SaveError(
            f"Received {source}={str(base)!r}; the backup directory {str(directory)!r} cannot be created or written "
            f"({error.strerror or error}: {error.filename or directory}). Pass a writable directory "
            "(tfstrategy launch --backup-dir DIR)."
        ) from error
    return [backup_callback(directory.parent, save_freq=options.get("save_freq", "epoch"),
                            delete_checkpoint=bool(options.get("delete_checkpoint", True)))]
