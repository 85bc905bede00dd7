"""The commit rule of coordinated backups, as plain values and files (no TensorFlow).

A coordinated backup (:mod:`tfstrategy.multiworker.coordinated`) is a set of
*parts*, one per worker, for the same training step. A part is a Keras
``step-<S>.weights.h5`` file and its ``step-<S>.json`` sidecar (size, sha256,
job, epoch, batch), both written to a temporary name, fsynced and renamed.
After writing, the workers compare the steps they wrote (one collective); only
when every worker wrote step S does each write ``commit.json`` (atomically),
naming S as committed and keeping the previous committed step, whose parts stay
on disk until the next step is committed. So a crash at any point of a save
leaves every worker able to resume from one step that every worker has.

This module holds the pure parts of that rule, testable without processes:

- the records and how they are read and validated (:func:`read_record`,
  :func:`check_part`), every failure naming the file and the step;
- which step to resume from, given what each worker reported (:func:`choose_resume`);
- the job's identity (:func:`job_identity`) and the directory lock that keeps a
  second job out (:class:`DirectoryLock`);
- trust: a directory or file owned by another user, or writable by other users,
  is refused in one line, as ssh refuses a key file others can read
  (:func:`check_trusted`); new directories are created 0700 (:func:`make_private_dir`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import stat
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tfstrategy import environments
from tfstrategy.errors import BackupError, BackupLockedError, UntrustedBackupError
from tfstrategy.settings import ENV_JOB_ID

__all__ = [
    "FORMAT",
    "Part",
    "CommitRecord",
    "Resume",
    "read_record",
    "write_record",
    "read_part",
    "check_part",
    "choose_resume",
    "job_identity",
    "DirectoryLock",
    "check_trusted",
    "make_private_dir",
    "atomic_write_text",
]

#: Version of the record and sidecar formats; a record of another version is refused.
FORMAT = 1
RECORD_NAME = "commit.json"
JOB_FILE = "job.json"
LOCK_NAME = "lock"


def part_name(step: int) -> str:
    """The weights file of a part: ``step-<S>.weights.h5``."""
    return f"step-{step}.weights.h5"


def sidecar_name(step: int) -> str:
    """The sidecar of a part: ``step-<S>.json``."""
    return f"step-{step}.json"


# --- atomic files ------------------------------------------------------------------------


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a whole or not at all: temporary file, fsync, ``os.replace``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def file_digest(path: Path) -> tuple[int, str]:
    """``(size, sha256 hex)`` of a file."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


# --- records -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Part:
    """One worker's part of one step: what its sidecar says."""

    job_id: str
    step: int
    epoch: int
    batch: int
    size: int
    sha256: str
    #: The state of each of the model's random seed generators (Keras 3 ``SeedGenerator``), in the model's order:
    #: ``save_weights`` does not write them. Empty for a model without any, and in backups of tfstrategy 0.3.
    seeds: tuple[tuple[int, ...], ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "job_id": self.job_id, "step": self.step, "epoch": self.epoch,
                "batch": self.batch, "size": self.size, "sha256": self.sha256, "seeds": [list(s) for s in self.seeds]}


@dataclass(frozen=True, kw_only=True)
class CommitRecord:
    """A worker's ``commit.json``: the newest committed step and the one before it (kept on disk)."""

    job_id: str
    workers: int
    #: Committed steps, newest first (at most two).
    steps: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "job_id": self.job_id, "workers": self.workers, "committed": list(self.steps)}


def _load_json(path: Path, what: str) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BackupError(f"The {what} {path} cannot be read ({_reason(error)}); it is truncated or not written by "
                          "tfstrategy. It is not loaded.") from error
    if not isinstance(data, dict):
        raise BackupError(f"The {what} {path} holds {type(data).__name__} {str(data)[:40]!r}; expected a JSON object "
                          "written by tfstrategy. It is not loaded.")
    if data.get("format") != FORMAT:
        raise BackupError(f"The {what} {path} has format {data.get('format')!r}; this tfstrategy reads format {FORMAT}. "
                          "It is not loaded.")
    return data


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return str(error).splitlines()[0][:200]


def _int(data: Mapping[str, object], key: str, path: Path, what: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackupError(f"The {what} {path} has {key}={value!r}; expected an integer >= 0. It is not loaded.")
    return value


def read_record(path: Path) -> CommitRecord:
    """Read and validate a ``commit.json``.

    Raises:
        BackupError: unreadable, unparsable, or with missing or malformed fields (naming the file).
    """
    data = _load_json(path, "commit record")
    job, steps = data.get("job_id"), data.get("committed")
    if not isinstance(job, str) or not job:
        raise BackupError(f"The commit record {path} has job_id={job!r}; expected the job's id. It is not loaded.")
    if (not isinstance(steps, list) or not 1 <= len(steps) <= 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in steps)
            or steps != sorted(set(steps), reverse=True)):
        raise BackupError(f"The commit record {path} has committed={steps!r}; expected one or two steps, newest first. "
                          "It is not loaded.")
    return CommitRecord(job_id=job, workers=_int(data, "workers", path, "commit record"), steps=tuple(steps))


def write_record(directory: Path, record: CommitRecord) -> None:
    """Write ``directory/commit.json`` atomically."""
    atomic_write_text(directory / RECORD_NAME, json.dumps(record.to_json()) + "\n")


def read_part(directory: Path, step: int) -> Part:
    """Read and validate the sidecar of ``step`` in ``directory``.

    Raises:
        BackupError: missing, unreadable or malformed (naming the file and the step).
    """
    path = directory / sidecar_name(step)
    if not path.exists():
        raise BackupError(f"{path} is missing: this worker has no backup of step {step}.")
    data = _load_json(path, f"backup sidecar of step {step}")
    job, digest = data.get("job_id"), data.get("sha256")
    if not isinstance(job, str) or not isinstance(digest, str) or len(digest) != 64:
        raise BackupError(f"The backup sidecar {path} lacks job_id or sha256; it is not loaded (step {step}).")
    seeds = data.get("seeds", [])
    if not isinstance(seeds, list) or not all(
            isinstance(state, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in state)
            for state in seeds):
        raise BackupError(f"The backup sidecar {path} has seeds={str(seeds)[:60]}; expected a list of lists of "
                          f"integers (random generators' states). It is not loaded (step {step}).")
    part = Part(job_id=job, step=_int(data, "step", path, "sidecar"), epoch=_int(data, "epoch", path, "sidecar"),
                batch=_int(data, "batch", path, "sidecar"), size=_int(data, "size", path, "sidecar"), sha256=digest,
                seeds=tuple(tuple(state) for state in seeds))
    if part.step != step:
        raise BackupError(f"The backup sidecar {path} says step {part.step}; its name says step {step}. It is not loaded.")
    return part


def check_part(directory: Path, step: int, job_id: str) -> Part:
    """The part of ``step`` in ``directory`` if its weights file is whole and of this job; else raise.

    Raises:
        BackupError: sidecar or weights file missing, truncated (size), altered (sha256), or of another job.
    """
    part = read_part(directory, step)
    if part.job_id != job_id:
        raise BackupError(f"{directory / sidecar_name(step)} belongs to job {part.job_id!r}, not this job {job_id!r}; "
                          f"step {step} is not loaded.")
    weights = directory / part_name(step)
    try:
        size, digest = file_digest(weights)
    except OSError as error:
        raise BackupError(f"{weights} (step {step}) cannot be read ({_reason(error)}); it is not loaded.") from error
    if size != part.size:
        raise BackupError(f"{weights} (step {step}) has {size} bytes; its sidecar says {part.size}: it is truncated or "
                          "partly written. It is not loaded.")
    if digest != part.sha256:
        raise BackupError(f"{weights} (step {step}) does not match the sha256 its sidecar records: it was altered or "
                          "partly written. It is not loaded.")
    return part


# --- which step to resume from ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Resume:
    """The step every worker resumes from (``None``: start from scratch), and why."""

    step: int | None
    reason: str


def candidates(committed: Sequence[Sequence[int]]) -> list[int]:
    """Every step some worker recorded as committed, newest first.

    A step is committed only after every worker wrote its part, so one worker's
    record is enough to make a step a candidate; whether every worker can still
    load it is the next question (:func:`choose_resume`).
    """
    return sorted({step for steps in committed for step in steps}, reverse=True)


def refusal(problems: Sequence[str | None]) -> str | None:
    """One line naming every worker whose backup must not be used, or ``None``."""
    refused = [f"worker {i}: {problem}" for i, problem in enumerate(problems) if problem]
    return ("The backup cannot be used: " + "; ".join(refused) + ".") if refused else None


def choose_resume(committed: Sequence[Sequence[int]], loadable: Sequence[Sequence[bool]],
                  problems: Sequence[str | None]) -> Resume:
    """The newest committed step every worker can load.

    Args:
        committed: per worker, the steps its ``commit.json`` names (empty without one).
        loadable: per worker, for each of ``candidates(committed)``, whether it has a whole part of it.
        problems: per worker, a reason its backup must not be used at all (another job's, untrusted,
            locked), or ``None``.

    Returns:
        The step to resume (``None``: nothing was ever committed, start from scratch).

    Raises:
        BackupError: a worker's backup is refused, or steps were committed but none can be loaded
            by every worker (the message names the workers; each worker's own error names its files).
    """
    refused = refusal(problems)
    if refused:
        raise BackupError(refused)
    steps = candidates(committed)
    if not steps:
        return Resume(step=None, reason="no step was committed yet: every worker starts from scratch")
    for k, step in enumerate(steps):
        missing = [i for i, flags in enumerate(loadable) if not flags[k]]
        if not missing:
            skipped = steps[:k]
            why = f"step {step} is the newest committed step every worker has"
            if skipped:
                why += f" (step {', '.join(map(str, skipped))} was committed but not every worker can load it)"
            return Resume(step=step, reason=why)
    raise BackupError(f"Steps {', '.join(map(str, steps))} were committed, but no step can be loaded by every worker "
                      f"(workers without a whole part of step {steps[0]}: "
                      f"{', '.join(str(i) for i, f in enumerate(loadable) if not f[0])}). Each worker's error names "
                      "its files; restore them, or remove the backup directory to start from scratch.")


# --- identity, lock, trust ----------------------------------------------------------------


def job_identity(env: Mapping[str, str], base: Path) -> tuple[str, str]:
    """The job's id and where it came from: :func:`tfstrategy.environments.job_identity`, or ``base/job.json``.

    Without either variable the id is the backup directory's own, created once by
    whichever worker comes first (``O_EXCL``): a job restarted on the same
    directory is the same job; a second job at the same time is kept out by the lock.
    """
    identity = environments.job_identity(env)
    if identity is not None:
        return identity
    path = base / JOB_FILE
    for _ in range(50):
        try:
            data = json.loads(path.read_text())
            if isinstance(data, dict) and isinstance(data.get("job_id"), str):
                return data["job_id"], str(path)
            raise BackupError(f"{path} holds {str(data)[:60]!r}; expected the job id tfstrategy wrote. Remove it "
                              f"or set {ENV_JOB_ID}.")
        except FileNotFoundError:
            pass
        except json.JSONDecodeError:
            time.sleep(0.02)  # another worker is between creating and writing it
            continue
        job = f"dir-{uuid.uuid4().hex[:12]}"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            time.sleep(0.02)
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps({"job_id": job}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return job, str(path)
    raise BackupError(f"{path} stayed unreadable; remove it or set {ENV_JOB_ID}.")


class DirectoryLock:
    """An exclusive ``fcntl`` lock on ``directory/lock`` for as long as this process uses the directory.

    The file says who holds it (job, pid, host), so a second job is refused with
    a message naming the holder. The kernel releases the lock when the process
    dies, so a SIGKILLed worker never leaves a stale lock behind.
    """

    #: Locks this process holds, by path: a second ``fit`` in the same process (after a caught
    #: SystemExit, say) takes over the lock instead of refusing itself.
    _held: dict[str, int] = {}

    def __init__(self, directory: Path, job_id: str, *, name: str = LOCK_NAME, what: str = "worker") -> None:
        self.path = directory / name
        self.job_id = job_id
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock.

        Raises:
            BackupLockedError: another process holds it (the message names its job, pid and host).
        """
        import fcntl

        if self._fd is not None:
            return
        key = os.path.realpath(self.path)
        if key in DirectoryLock._held:
            self._fd = DirectoryLock._held[key]
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = _read_holder(fd)
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise BackupLockedError(
                f"{self.path.parent} is in use by job {holder.get('job_id', '?')!r} ({holder.get('what', 'a process')} "
                f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}); this is job {self.job_id!r}. "
                "Wait for it to end, or pass another backup directory."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"job_id": self.job_id, "pid": os.getpid(), "host": socket.gethostname(),
                                  "what": self.what}).encode(), 0)
        self._fd = fd
        DirectoryLock._held[key] = fd

    def release(self) -> None:
        """Let go of the lock (also done by the kernel when the process ends)."""
        if self._fd is not None:
            DirectoryLock._held.pop(os.path.realpath(self.path), None)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def check_trusted(path: Path, *, uid: int | None = None) -> None:
    """Refuse ``path`` if another user owns it or others may write it (as ssh refuses a key file).

    A backup is code-adjacent: loading one sets every weight and the epoch to
    resume from, so a file another user can write is a model another user chose.

    Raises:
        UntrustedBackupError: owned by another user, or group/world writable (one line, with the fix).
    """
    uid = os.geteuid() if uid is None else uid
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise UntrustedBackupError(f"Refusing backup {path}: it is a symbolic link; pass the real directory.")
    if info.st_uid != uid:
        raise UntrustedBackupError(
            f"Refusing backup {path}: it is owned by uid {info.st_uid} ({_user(info.st_uid)}), not by this user "
            f"(uid {uid}); another user's backup could hold any model. Use a directory of your own.")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedBackupError(
            f"Refusing backup {path}: mode {stat.S_IMODE(info.st_mode):04o} lets other users write it. "
            f"Run chmod go-w {path} (or use a private directory, e.g. mkdir -m 700).")


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return "unknown user"


def make_private_dir(directory: Path) -> None:
    """Create ``directory`` (and missing parents) with mode 0700; refuse an existing untrusted one.

    Raises:
        UntrustedBackupError: it exists and is another user's or writable by others.
        OSError: it cannot be created.
    """
    missing = [p for p in (directory, *directory.parents) if not p.exists()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    check_trusted(directory)


def check_tree(directory: Path) -> None:
    """:func:`check_trusted` on ``directory`` and every file directly in it."""
    check_trusted(directory)
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(directory.iterdir()):
            check_trusted(entry)
