"""Files written once in a multi-worker job: the chief writes the path, the others a private copy.

Every worker of a MultiWorkerMirroredStrategy job runs the same script, so
every worker reaches the same ``model.save(path)``. They must all take part
(saving reads variables that are synchronised on read, a collective), but only
one may write ``path``: on one machine, and on a cluster whose workers share a
home directory or NFS, they all write *one* file, and a reader sees it half
written (``BadZipFile``), h5py cannot lock it (``BlockingIOError``), or
``os.makedirs`` fails on the second worker (``FileExistsError``).

:func:`chief_write` is the one rule, used by tfstrategy's Keras patch
(:mod:`tfstrategy.patches.keras_chief_files`) and by :func:`tfstrategy.save_model`:

- In a single process, or when ``TF_CONFIG`` names one task, it yields ``path``.
- On the chief (``chief`` task, else ``worker`` 0: :func:`is_chief`) it yields
  ``path``, and once the write has finished it publishes that fact in the job's
  coordination service (the key-value store MultiWorkerMirroredStrategy starts).
- On every other task it yields a path of the same name in a fresh private
  directory under the system's temporary directory, removes that directory
  when the write is done, and then waits until the chief has published its own
  write of the same file name. So when ``save`` returns on any worker, the
  chief's file is complete: a worker that next reads "the newest checkpoint"
  reads a whole one, never a file in the middle of being written.

The chief's n-th write of a file name is matched with the other worker's n-th
write of the same name (whatever its directory), so the tutorial pattern of a
per-worker directory (``workertemp_1/model.keras``) matches too. A worker that
writes a name the chief never writes waits until the chief leaves the job, at most :data:`WAIT_LIMIT` seconds,
and says so. A chief that wrote the name and left the job before the worker looked is seen in the file
itself when the workers share a file system (a file of that name newer than this process): no line then.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tfstrategy.multiworker.cluster import ClusterConfig, load_cluster_config
from tfstrategy.state.registry import RUNTIME

__all__ = ["is_chief", "chief_write", "keep_per_worker", "private_directory", "remove_private_directory"]

#: After this long a waiting worker prints one line saying what it waits for.
WAIT_NOTICE = 30.0
#: A worker stops waiting for the chief's write of a name after this long (it may write a name the chief never does).
WAIT_LIMIT = 1800.0
#: The coordination-service keys of this mechanism.
KEY_PREFIX = "tfstrategy/chief_files"
#: Set on a writer (a callback) whose path is already this worker's own: it writes on every worker.
PER_WORKER = "_tfstrategy_per_worker"
#: When this module was loaded (with tfstrategy, before any training): a file newer than this that a worker did not
#: write itself (its own writes go to a private directory) was written by the chief during this job.
_LOADED = time.time()


def is_chief(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process is the one that writes files a multi-worker job keeps.

    True in a single process or a one-task ``TF_CONFIG``; in a multi-worker job,
    True on the ``chief`` task, or on ``worker`` 0 when the cluster has no chief
    (TensorFlow's own rule for who checkpoints).

    Args:
        env: environment to read ``TF_CONFIG`` from (``os.environ`` when omitted).

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is set but invalid.

    Example:
        >>> if tfstrategy.is_chief():
        ...     os.makedirs("results")  # the script's own files: one worker writes them
    """
    config = load_cluster_config(env)
    return config is None or config.is_chief


def shared_job(env: Mapping[str, str] | None = None) -> ClusterConfig | None:
    """This task's ``TF_CONFIG`` when it names 2+ training tasks (the files rule applies), else ``None``."""
    config = load_cluster_config(env)
    return config if config is not None and config.num_workers > 1 else None


def keep_per_worker(writer: object) -> Any:
    """Mark ``writer`` (e.g. a ``BackupAndRestore`` on ``<dir>/worker-<i>``) as writing this worker's own path.

    Its files are then written on every worker, as Keras itself would; ``backup_callbacks()`` marks its callbacks.
    """
    setattr(writer, PER_WORKER, True)
    return writer


def is_per_worker(writer: object) -> bool:
    """Whether :func:`keep_per_worker` marked ``writer``."""
    return bool(getattr(writer, PER_WORKER, False))


class _Local(threading.local):
    #: Nesting depth of chief_write on this thread: inner writes (ModelCheckpoint -> Model.save) pass through.
    depth = 0


_LOCAL = _Local()
_COUNTS: dict[str, int] = {}
_COUNTS_LOCK = threading.Lock()
_PRIVATE: set[str] = set()


def private_directory(config: ClusterConfig) -> Path:
    """A fresh directory only this task writes, removed at exit if still there."""
    path = tempfile.mkdtemp(prefix=f"tfstrategy-{config.task_name}-")
    _PRIVATE.add(path)
    return Path(path)


def remove_private_directory(path: str | os.PathLike[str] | None) -> None:
    """Remove a directory made by :func:`private_directory` (no error if gone)."""
    if path is None:
        return
    shutil.rmtree(path, ignore_errors=True)
    _PRIVATE.discard(str(path))


@atexit.register
def _remove_leftovers() -> None:
    for path in list(_PRIVATE):
        remove_private_directory(path)


def _forget() -> None:
    _remove_leftovers()
    with _COUNTS_LOCK:
        _COUNTS.clear()


RUNTIME.own_state("chief_files: write counts and private directories", _forget)


def _file_name(path: str) -> str:
    return path.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1] or "unnamed"


def write_key(name: str, count: int) -> str:
    """The coordination-service key of the chief's ``count``-th write of the file ``name``."""
    return f"{KEY_PREFIX}/{name}/{count}"


def _next_key(name: str) -> str:
    with _COUNTS_LOCK:
        _COUNTS[name] = _COUNTS.get(name, 0) + 1
        return write_key(name, _COUNTS[name])


@contextlib.contextmanager
def passing_through() -> Iterator[None]:
    """Inside the block, :func:`chief_write` yields paths unchanged (the caller already chose them)."""
    _LOCAL.depth += 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1


@contextlib.contextmanager
def chief_write(path: Any, *, env: Mapping[str, str] | None = None) -> Iterator[Any]:
    """Yield where this task writes ``path`` (see the module docstring); same type as ``path``.

    Anything that is not a ``str`` or ``os.PathLike`` (an open h5py file) is yielded unchanged.
    """
    config = shared_job(env) if _LOCAL.depth == 0 and isinstance(path, (str, os.PathLike)) else None
    if config is None:
        with passing_through():
            yield path
        return
    text = os.fspath(path)
    key = _next_key(_file_name(text))
    if config.is_chief:
        outcome = "failed"
        try:
            with passing_through():
                yield path
            outcome = "written"
        finally:
            _publish(key, outcome)
        return
    private = private_directory(config)
    try:
        target = os.path.join(private, _file_name(text))
        with passing_through():
            yield type(path)(target) if isinstance(path, Path) else target
    finally:
        remove_private_directory(private)
    _wait_for_chief(key, text, config)


def _publish(key: str, outcome: str) -> None:
    from tfstrategy import _compat

    store = _compat.coordination_store()
    if store is not None:
        store.set_config_key_value(key, outcome)


def _written_during_this_job(path: str) -> bool:
    try:
        return os.path.getmtime(path) >= _LOADED
    except OSError:
        return False


def _wait_for_chief(key: str, path: str, config: ClusterConfig) -> None:
    from tfstrategy import _compat

    store = _compat.coordination_store()
    if store is None:
        return  # no MultiWorkerMirroredStrategy in this process: no job-wide store to wait on
    deadline_error = _compat.deadline_exceeded_error()
    gone_error = _compat.unavailable_error()
    waited, noticed = 0.0, False
    while True:
        step = min(WAIT_NOTICE, WAIT_LIMIT - waited)
        try:
            store.get_config_key_value(key, timeout_in_ms=max(1, int(step * 1000)))
            return
        except deadline_error:
            waited += step
        except gone_error:
            # The chief left the job (its script ended): nothing more to wait for, and no error of this worker's.
            # Either it wrote the name and ended before this worker looked (seen in a shared file system), or
            # it never writes it (the per-worker export paths of tf_keras-era scripts): only that is said.
            if not _written_during_this_job(path):
                print(f"tfstrategy: {config.task_name} wrote {path} to a private copy; the chief left the job "
                      "before this worker saw it write that name, so there is nothing to wait for.",
                      file=sys.stderr, flush=True)
            return
        if waited >= WAIT_LIMIT:
            print(f"tfstrategy: {config.task_name} stopped waiting for the chief to write {path} after "
                  f"{waited:.0f}s; the chief may never write this name. Keras writes files on the chief only; "
                  "write per-worker files with your own code.", file=sys.stderr, flush=True)
            return
        if not noticed:
            noticed = True
            print(f"tfstrategy: {config.task_name} wrote {path} to a private copy and waits for the chief to "
                  "finish writing it (so no worker reads a partial file).", file=sys.stderr, flush=True)

