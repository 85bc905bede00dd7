"""What a launched worker is told: the one typed contract of the ``TFSTRATEGY_*`` variables ``tfstrategy launch`` sets.

The launcher (:mod:`tfstrategy.launch`) builds a :class:`WorkerContract` per worker and writes it
with :meth:`WorkerContract.to_environ`; the worker's side (:mod:`tfstrategy.multiworker.worker_protocol`,
the start-up hook's supervision) reads it back with :meth:`WorkerContract.from_environ`, which
checks every value and names the variable of a bad one. The job-wide part, the same for every
worker, is :class:`WorkerSettings`; the CLI and :func:`tfstrategy.launch.library.launch` build it
the same way (:func:`tfstrategy.launch.options.worker_settings`).

Every field may be absent: a process outside ``launch`` has none of them, a user may set the
settings (``TFSTRATEGY_BACKUP_DIR`` under Slurm), and the hook removes the supervision variables
once it has taken them, so that a Python child of the worker does not act as the worker.

This module imports nothing but the standard library, :mod:`tfstrategy.settings` and the contract's
exit statuses (:mod:`tfstrategy.contract.exits`).
"""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tfstrategy.contract.exits import EXIT_STOPPED as EXIT_STOPPED  # re-exported: it moved there
from tfstrategy.errors import LaunchError
from tfstrategy.settings import (
    AUDIT_MODES,
    ENV_AUDIT,
    ENV_BACKUP_DIR,
    ENV_CPU_REPLICAS,
    ENV_DEBUG,
    ENV_DEVICES,
    ENV_ERROR_FILE,
    ENV_HOOK,
    ENV_HOOK_PID,
    ENV_HOOK_SUMMARY,
    ENV_JOB_ID,
    ENV_JOB_TAG,
    ENV_JOIN_FILE,
    ENV_LAUNCHER_PID,
    ENV_LIFELINE_FD,
    ENV_NODE_RANK,
    ENV_NUM_WORKERS,
    ENV_PRECISION,
    ENV_PROFILE,
    ENV_PROFILE_EVERY,
    ENV_PROFILE_PROBES,
    ENV_PROGRESS_FILE,
    ENV_RESTART,
    ENV_SENTINEL,
    ENV_WORKER_INDEX,
    validate_audit_mode,
)

__all__ = ["WorkerSettings", "WorkerContract", "SUPERVISION_VARIABLES", "PRECISIONS", "STACK_SIGNAL", "STARTUP_DIR",
           "hook_environment", "STOP_PREFIXES", "EXIT_STOPPED", "stop_line"]

#: The directory whose ``sitecustomize`` installs the start-up hook; first on the workers' PYTHONPATH.
STARTUP_DIR = Path(__file__).resolve().parent / "runtime" / "startup"
#: The signal on which a launched Python worker prints every thread's stack to its stderr.
STACK_SIGNAL = signal.SIGUSR2
#: How a worker's one line begins when the hook stops it on a user error (a refused strategy, a missing device),
#: and its exit status (:data:`EXIT_STOPPED`, from :mod:`tfstrategy.contract.exits`): the launcher makes that line
#: its headline, once, and does not restart the job.
#: (The scope audit's "tfstrategy stopped fit() ..." is an exception the script sees, not one of these.)
STOP_PREFIXES = ("tfstrategy refused ", "tfstrategy stopped MirroredStrategy(", "tfstrategy stopped Model.fit() ",
                 "tfstrategy stopped the script ")


def stop_line(returncode: int | None, lines: Sequence[str]) -> str | None:
    """The hook's stop line of a worker that exited :data:`EXIT_STOPPED`, or ``None``."""
    if returncode != EXIT_STOPPED:
        return None
    return next((line.strip() for line in reversed(lines) if line.strip().startswith(STOP_PREFIXES)), None)

#: The values of ``TFSTRATEGY_PRECISION`` (as :func:`tfstrategy.training.precision.parse_precision` accepts them).
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
#: The variables only the worker itself acts on; the hook removes them once taken (see the module's note).
SUPERVISION_VARIABLES = (ENV_ERROR_FILE, ENV_PROGRESS_FILE, ENV_LAUNCHER_PID, ENV_LIFELINE_FD)
_FIX = "they are set by tfstrategy launch; unset the variable or fix its value"

T = TypeVar("T")


def _read(environ: Mapping[str, str], name: str, parse: Callable[[str], T | None], expected: str) -> T | None:
    """``environ[name]`` parsed (``None`` when unset or blank).

    Raises:
        LaunchError: ``parse`` refused it; the message names ``name`` and what was expected.
    """
    text = environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = parse(text)
    except ValueError:
        value = None
    if value is None:
        shown = text if len(text) <= 80 else f"{text[:80]}..."
        raise LaunchError(f"Received {name}={shown!r}; expected {expected} ({_FIX}).")
    return value


def _integer(low: int) -> Callable[[str], int | None]:
    def parse(text: str) -> int | None:
        value = int(text)
        return value if value >= low else None
    return parse


def _minutes(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) and value > 0 else None


def _sentinel(text: str) -> str | None:
    lowered = text.lower()
    if lowered in ("epoch", "on"):
        return "epoch"
    if lowered in ("off", "0", "none"):
        return "off"
    return str(int(lowered)) if lowered.isdigit() and int(lowered) > 0 else None


def _precision(text: str) -> str | None:
    lowered = text.lower().replace("-", "_")
    return lowered if lowered in PRECISIONS else None


def _one_of(values: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda text: text.lower() if text.lower() in values else None


def _put(environ: dict[str, str], name: str, value: object) -> None:
    if value is not None and value is not False:
        environ[name] = "1" if value is True else str(value)


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """The job-wide settings every worker of a launch gets (each may also come from the user's environment)."""

    #: Variables outside the strategy's scope before ``fit``: ``warn``, ``stop`` or ``off``.
    audit: str | None = None
    #: Print the hook's one summary line at exit.
    summary: bool = False
    #: ``--debug``: the summary names the hook's steps, tracebacks keep tfstrategy's own frames.
    debug: bool = False
    #: The Keras global dtype policy (one of :data:`PRECISIONS`).
    precision: str | None = None
    #: The divergence sentinel: ``"epoch"``, a step interval (``"100"``) or ``"off"``.
    sentinel: str | None = None
    #: The performance report's directory (``--profile``), and the minutes between reports.
    profile_dir: Path | None = None
    profile_every: float | None = None
    #: The share of the time trained the report's probes may take (``--profile-probes``).
    profile_probes: float | None = None
    #: The job's backup directory, and its identity in the backups.
    backup_dir: Path | None = None
    job_id: str | None = None
    #: The logical CPU split and the device list the hook applies.
    cpu_replicas: int | None = None
    devices: str | None = None

    def to_environ(self) -> dict[str, str]:
        """The variables of the settings that are set."""
        environ: dict[str, str] = {}
        for name, value in ((ENV_AUDIT, self.audit), (ENV_HOOK_SUMMARY, self.summary or None), (ENV_DEBUG, self.debug or None),
                            (ENV_PRECISION, self.precision), (ENV_SENTINEL, self.sentinel),
                            (ENV_PROFILE, self.profile_dir),
                            (ENV_PROFILE_EVERY, None if self.profile_every is None else f"{self.profile_every:g}"),
                            (ENV_PROFILE_PROBES, None if self.profile_probes is None else f"{self.profile_probes:g}"),
                            (ENV_BACKUP_DIR, self.backup_dir), (ENV_JOB_ID, self.job_id),
                            (ENV_CPU_REPLICAS, self.cpu_replicas), (ENV_DEVICES, self.devices)):
            _put(environ, name, value)
        return environ

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkerSettings:
        """The settings ``environ`` carries, each checked.

        Raises:
            LaunchError: a value that is not valid; the message names its variable.
        """
        profile = _read(environ, ENV_PROFILE, str, "a directory")
        return cls(
            audit=_read(environ, ENV_AUDIT, _one_of(AUDIT_MODES), f"one of {', '.join(AUDIT_MODES)}"),
            summary=environ.get(ENV_HOOK_SUMMARY, "").strip() == "1",
            debug=environ.get(ENV_DEBUG, "").strip() == "1",
            precision=_read(environ, ENV_PRECISION, _precision, f"one of {', '.join(PRECISIONS)}"),
            sentinel=_read(environ, ENV_SENTINEL, _sentinel, "epoch, a step interval such as 100, or off"),
            profile_dir=None if profile is None or profile.lower() == "off" else Path(profile),
            profile_every=_read(environ, ENV_PROFILE_EVERY, _minutes, "a number of minutes above 0"),
            profile_probes=_read(environ, ENV_PROFILE_PROBES, _minutes, "a share of the time trained above 0"),
            backup_dir=_read(environ, ENV_BACKUP_DIR, Path, "a directory"),
            job_id=_read(environ, ENV_JOB_ID, str, "the job's identity"),
            cpu_replicas=_read(environ, ENV_CPU_REPLICAS, _integer(1), "a number of logical CPU devices, 1 or more"),
            devices=_read(environ, ENV_DEVICES, str, "a device list"),
        )


@dataclass(frozen=True, kw_only=True)
class WorkerContract:
    """Everything ``tfstrategy launch`` tells one worker, besides ``TF_CONFIG``.

    Example:
        >>> contract = WorkerContract.from_environ(os.environ)
        >>> contract.launched, contract.index, contract.restart
        (True, 1, 0)
    """

    #: This worker's global index (``task.index`` in ``TF_CONFIG``) and the job's number of workers.
    index: int | None = None
    num_workers: int | None = None
    #: 0 on the first start, k after the k-th restart of the group.
    restart: int = 0
    #: Written by tfstrategy once this worker's strategy exists (``<file>.starting`` while it is created).
    join_file: Path | None = None
    #: Supervision: the first uncaught exception, the heartbeat and batch counts, the launcher's pid and the
    #: descriptor that reaches end-of-file when it dies.
    error_file: Path | None = None
    progress_file: Path | None = None
    launcher_pid: int | None = None
    lifeline_fd: int | None = None
    #: A tag every process of the job carries (the reaper finds them by it).
    job_tag: str | None = None
    #: This machine's rank in a job of several (``--nnodes``).
    node_rank: int | None = None
    settings: WorkerSettings = field(default_factory=WorkerSettings)

    @property
    def launched(self) -> bool:
        """Whether this process is a worker of ``tfstrategy launch``."""
        return self.index is not None

    def to_environ(self) -> dict[str, str]:
        """The variables of this contract (those set), to put into the worker's environment."""
        environ = self.settings.to_environ()
        for name, value in ((ENV_WORKER_INDEX, self.index), (ENV_NUM_WORKERS, self.num_workers),
                            (ENV_RESTART, self.restart if self.launched else None), (ENV_JOIN_FILE, self.join_file),
                            (ENV_ERROR_FILE, self.error_file), (ENV_PROGRESS_FILE, self.progress_file),
                            (ENV_LAUNCHER_PID, self.launcher_pid), (ENV_LIFELINE_FD, self.lifeline_fd),
                            (ENV_JOB_TAG, self.job_tag), (ENV_NODE_RANK, self.node_rank)):
            _put(environ, name, value)
        return environ

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkerContract:
        """The contract ``environ`` carries, every value checked (absent ones are ``None``).

        Raises:
            LaunchError: a value that is not valid, or an index without the number of workers or
                outside it; the message names the variable.
        """
        count = "a count of workers, 1 or more"
        index = _read(environ, ENV_WORKER_INDEX, _integer(0), "this worker's index, 0 or more")
        num_workers = _read(environ, ENV_NUM_WORKERS, _integer(1), count)
        if index is not None and (num_workers is None or index >= num_workers):
            raise LaunchError(f"Received {ENV_WORKER_INDEX}={index} with {ENV_NUM_WORKERS}="
                              f"{environ.get(ENV_NUM_WORKERS, '')!r}; expected an index below the number of workers "
                              f"({_FIX}).")
        return cls(
            index=index, num_workers=num_workers,
            restart=_read(environ, ENV_RESTART, _integer(0), "a restart count, 0 or more") or 0,
            join_file=_read(environ, ENV_JOIN_FILE, Path, "a file path"),
            error_file=_read(environ, ENV_ERROR_FILE, Path, "a file path"),
            progress_file=_read(environ, ENV_PROGRESS_FILE, Path, "a file path"),
            launcher_pid=_read(environ, ENV_LAUNCHER_PID, _integer(1), "the launcher's process id"),
            lifeline_fd=_read(environ, ENV_LIFELINE_FD, _integer(0), "a file descriptor"),
            job_tag=_read(environ, ENV_JOB_TAG, str, "the job's tag"),
            node_rank=_read(environ, ENV_NODE_RANK, _integer(0), "this machine's rank, 0 or more"),
            settings=WorkerSettings.from_environ(environ),
        )


def hook_environment(
    *,
    audit: str = "warn",
    cpu_replicas: int | None = None,
    devices: str | None = None,
    summary: bool = False,
    debug: bool = False,
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment that runs a process with the start-up hook (what ``run`` and ``launch`` set).

    Raises:
        TFStrategyError: ``audit`` is not one of :data:`~tfstrategy.settings.AUDIT_MODES`.
    """
    env = dict(os.environ if env is None else env)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(STARTUP_DIR) + (os.pathsep + path if path else "")
    env[ENV_HOOK] = "1"
    env.pop(ENV_HOOK_PID, None)  # the process started with this environment is the one to hook
    env[ENV_AUDIT] = validate_audit_mode(audit)
    if cpu_replicas is not None:
        env[ENV_CPU_REPLICAS] = str(cpu_replicas)
    if devices is not None:
        env[ENV_DEVICES] = devices
    if summary:
        env[ENV_HOOK_SUMMARY] = "1"
    if debug:
        env[ENV_DEBUG] = "1"
    return env
