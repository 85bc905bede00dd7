"""The launcher's side of coordinated backups: a private directory that outlives it, and a lock.

- ``--backup-dir DIR`` is created 0700 and refused when another user owns it or
  others can write it (:func:`checked_backup_dir`, one line, before anything starts).
- ``--max-restarts K`` without ``--backup-dir`` gets a private directory of its
  own that is removed only when the job succeeds: a job that exits 75 (saved,
  requeue me) or fails keeps it, and the launcher prints its path and the command
  that resumes from it (:class:`JobBackup`). A job a worker stopped (a user error,
  ``Outcome.STOPPED``) would stop again on the same command: its backup, if a worker
  wrote one, is kept with "fix what the line above says, then resume"; an empty one is removed.
- While the job runs, the launcher holds ``DIR/launch-node-<rank>.lock``, so a
  second ``tfstrategy launch`` on the same directory is refused, naming the job
  that holds it (the workers lock their own ``DIR/<task>/lock`` as well, which is
  what keeps a second job out under Slurm or a plain ``TF_CONFIG``).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tfstrategy.errors import BackupError, LaunchError
from tfstrategy.launch.states import Outcome
from tfstrategy.multiworker import commit

__all__ = ["checked_backup_dir", "JobBackup", "run_with_backup"]

_Result = TypeVar("_Result")


def checked_backup_dir(directory: Path | None) -> Path | None:
    """``--backup-dir``, created 0700 if missing, and trusted (ours, not writable by others).

    Raises:
        LaunchError: a file, cannot be created, or untrusted (one line naming the path and the fix).
    """
    if directory is None:
        return None
    if directory.exists() and not directory.is_dir():
        raise LaunchError(f"Received --backup-dir {directory}, which is a file; pass a directory (it is created).")
    try:
        commit.make_private_dir(directory)
        commit.check_tree(directory)
    except BackupError as error:
        raise LaunchError(f"Received --backup-dir {directory}: {error}") from None
    except OSError as error:
        raise LaunchError(f"Received --backup-dir {directory}, which cannot be created ({error.strerror}); pass a "
                          "directory you can write to.") from None
    return directory


class JobBackup:
    """The backup directory of one ``tfstrategy launch``: made if needed, locked while the job runs.

    Args:
        backup_dir: ``--backup-dir`` (already checked), or ``None``.
        max_restarts: ``--max-restarts``; without a directory and with restarts, one is made.
        node_rank: this launcher's node (each node of a job locks its own file).
        env: the launcher's environment (the job id's: :func:`tfstrategy.environments.job_id`).
    """

    def __init__(self, backup_dir: Path | None, *, max_restarts: int, node_rank: int = 0,
                 env: Mapping[str, str] | None = None) -> None:
        self.generated = backup_dir is None and max_restarts > 0
        if self.generated:
            backup_dir = Path(tempfile.mkdtemp(prefix="tfstrategy-backup-"))  # 0700, ours
        self.path = backup_dir
        self.node_rank = node_rank
        self.env = dict(os.environ if env is None else env)
        self._lock: commit.DirectoryLock | None = None

    def __enter__(self) -> JobBackup:
        if self.path is None:
            return self
        try:
            job, _ = commit.job_identity(self.env, self.path)
            lock = commit.DirectoryLock(self.path, job, name=f"launch-node-{self.node_rank}.lock",
                                        what="tfstrategy launch")
            lock.acquire()
        except BackupError as error:
            if self.generated:
                shutil.rmtree(self.path, ignore_errors=True)
            raise LaunchError(f"Received --backup-dir {self.path}: {error}") from None
        self._lock = lock
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def finish(self, returncode: int, resume_command: list[str], *, restartable: bool = True) -> str | None:
        """Remove a generated directory after success; else keep it. What to tell the user (or ``None``).

        ``restartable=False`` (a worker stopped the job on a user error): the same command would stop
        again, so the line asks for the fix first, and a directory no worker wrote a backup in is removed.
        """
        if not self.generated or self.path is None:
            return None
        if returncode == 0 or (not restartable and not _holds_a_backup(self.path)):
            shutil.rmtree(self.path, ignore_errors=True)
            return None
        kept = f"the job's backup is kept in {self.path} (exit status {returncode})"
        if not restartable:
            return (f"{kept}; the same command would stop again: fix what the line above says, then resume from "
                    f"it with: {shlex.join(resume_command)}")
        return f"{kept}; resume from it with: {shlex.join(resume_command)}"


def _holds_a_backup(directory: Path) -> bool:
    """Whether a worker wrote its part of a backup in ``directory`` (each in a directory of its own)."""
    try:
        return any(entry.is_dir() for entry in directory.iterdir())
    except OSError:
        return True  # unreadable: keep it, the user decides


def resume_command(*, num_workers: int, max_restarts: int, timeout: float, backup_dir: Path,
                   command: tuple[str, ...], nodes: list[str] | None = None) -> list[str]:
    """The ``tfstrategy launch`` line that resumes this job from ``backup_dir``."""
    return ["tfstrategy", "launch", "-n", str(num_workers), "--max-restarts", str(max_restarts),
            "--timeout", f"{timeout:g}", *(nodes or []), "--backup-dir", str(backup_dir), "--", *command]


def run_with_backup(options: Any, run: Callable[[Any], _Result], *, say: Callable[[str], object],
                    env: Mapping[str, str] | None = None, timeout: float | None = None,
                    nodes: list[str] | None = None) -> _Result:
    """Run a job (``run(options)``, a :class:`~tfstrategy.launch.supervisor.LaunchResult`) with its backup directory.

    Makes the directory when restarts need one, holds the lock while the job runs, removes a
    made directory after success and otherwise keeps it, saying its path and resume command.

    Raises:
        LaunchError: another job holds the directory.
    """
    job_backup = JobBackup(options.backup_dir, max_restarts=options.max_restarts,
                           node_rank=options.nodes.node_rank if options.nodes else 0, env=env)
    with job_backup:
        result = run(dataclasses.replace(options, backup_dir=job_backup.path))
    if job_backup.path is not None:
        line = resume_command(num_workers=options.num_workers, max_restarts=options.max_restarts,
                              timeout=0 if timeout is None else timeout, backup_dir=job_backup.path,
                              command=tuple(options.command), nodes=nodes)
        outcome = getattr(result, "reason", None)
        kept = job_backup.finish(int(getattr(result, "returncode", 1)), line,
                                 restartable=not isinstance(outcome, Outcome) or outcome.restartable)
        if kept:
            say(kept)
    return result
