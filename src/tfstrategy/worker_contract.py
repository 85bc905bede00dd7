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

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from tfstrategy.contract.exits import EXIT_STOPPED as EXIT_STOPPED  # re-exported: it moved there
from tfstrategy.errors import LaunchError
from tfstrategy.settings import (
    AUDIT,
    BACKUP_DIR,
    CPU_REPLICAS,
    DEBUG,
    DEVICES,
    ERROR_FILE,
    HOOK,
    HOOK_PID,
    HOOK_SUMMARY,
    JOB_ID,
    JOB_TAG,
    JOIN_FILE,
    LAUNCHER_PID,
    LIFELINE_FD,
    NODE_RANK,
    NUM_WORKERS,
    PRECISION,
    PRECISIONS,
    PROFILE,
    PROFILE_EVERY,
    PROFILE_PROBES,
    PROGRESS_FILE,
    RESTART,
    SENTINEL,
    WORKER_INDEX,
    Variable,
)

__all__ = ["WorkerSettings", "WorkerContract", "SUPERVISION_VARIABLES", "PRECISIONS", "STACK_SIGNAL",
           "FROZEN_STACK_SIGNAL", "STARTUP_DIR", "hook_environment", "STOP_PREFIXES", "EXIT_STOPPED", "stop_line"]

#: The directory whose ``sitecustomize`` installs the start-up hook; first on the workers' PYTHONPATH.
STARTUP_DIR = Path(__file__).resolve().parent / "runtime" / "startup"
#: The signal on which a launched Python worker prints every thread's stack to its stderr.
STACK_SIGNAL = signal.SIGUSR2
#: The same for a frozen worker (its heartbeat stopped: a thread holds Python's lock inside a C extension), which
#: cannot run the thread that answers :data:`STACK_SIGNAL`: ``faulthandler``'s own handler prints the stacks from
#: inside the signal, without the lock. Unsafe while Python runs, safe enough when no Python thread can.
FROZEN_STACK_SIGNAL = signal.SIGUSR1
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

#: The variables only the worker itself acts on; the hook removes them once taken (see the module's note).
SUPERVISION_VARIABLES = (ERROR_FILE.name, PROGRESS_FILE.name, LAUNCHER_PID.name, LIFELINE_FD.name)
_FIX = "they are set by tfstrategy launch; unset the variable or fix its value"

T = TypeVar("T")


def _variable(spec: Variable, default: object = None, *, as_text: bool = False) -> Any:
    """A field carried by ``spec`` (its declaration in :mod:`tfstrategy.settings` parses and names it); ``as_text``:
    the variable's text, handed on as the user wrote it for the worker's hook to parse (and to quote)."""
    return field(default=default, metadata={"variable": spec, "as_text": as_text})


def _to_environ(record: object, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables of ``record``'s fields that are set, each written by its Variable (``None``/``False`` left out)."""
    environ: dict[str, str] = {}
    for item in fields(record):  # type: ignore[arg-type]
        spec = item.metadata.get("variable")
        if spec is not None and item.name not in skip:
            environ.update(spec.to_environ(getattr(record, item.name)))
    return environ


def _from_environ(kind: type[T], environ: Mapping[str, str], **given: object) -> T:
    """``kind`` with each field read from its variable in ``environ`` (checked), but those ``given``; a field
    whose variable is unset or blank keeps its default."""
    values = {item.name: spec.text(environ) if item.metadata["as_text"] else spec.read(environ, error=LaunchError, fix=_FIX)
              for item in fields(kind)  # type: ignore[arg-type]
              if (spec := item.metadata.get("variable")) is not None and item.name not in given
              and spec.text(environ) is not None}
    return kind(**values, **given)


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """The job-wide settings every worker of a launch gets (each may also come from the user's environment)."""

    #: Variables outside the strategy's scope before ``fit``: ``warn``, ``stop`` or ``off``.
    audit: str | None = _variable(AUDIT)
    #: Print the hook's one summary line at exit.
    summary: bool = _variable(HOOK_SUMMARY, False)
    #: ``--debug``: the summary names the hook's steps, tracebacks keep tfstrategy's own frames.
    debug: bool = _variable(DEBUG, False)
    #: The Keras global dtype policy (one of :data:`PRECISIONS`).
    precision: str | None = _variable(PRECISION)
    #: The divergence sentinel: ``"epoch"``, a step interval (``"100"``) or ``"off"``.
    sentinel: str | None = _variable(SENTINEL)
    #: The performance report's directory (``--profile``), and the minutes between reports.
    profile_dir: Path | None = _variable(PROFILE)
    profile_every: float | None = _variable(PROFILE_EVERY)
    #: The share of the time trained the report's probes may take (``--profile-probes``).
    profile_probes: float | None = _variable(PROFILE_PROBES)
    #: The job's backup directory, and its identity in the backups.
    backup_dir: Path | None = _variable(BACKUP_DIR)
    job_id: str | None = _variable(JOB_ID)
    #: The logical CPU split and the device list the hook applies.
    cpu_replicas: int | None = _variable(CPU_REPLICAS)
    devices: str | None = _variable(DEVICES, as_text=True)

    def to_environ(self) -> dict[str, str]:
        """The variables of the settings that are set."""
        return _to_environ(self)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkerSettings:
        """The settings ``environ`` carries, each checked.

        Raises:
            LaunchError: a value that is not valid; the message names its variable.
        """
        return _from_environ(cls, environ)


@dataclass(frozen=True, kw_only=True)
class WorkerContract:
    """Everything ``tfstrategy launch`` tells one worker, besides ``TF_CONFIG``.

    Example:
        >>> contract = WorkerContract.from_environ(os.environ)
        >>> contract.launched, contract.index, contract.restart
        (True, 1, 0)
    """

    #: This worker's global index (``task.index`` in ``TF_CONFIG``) and the job's number of workers.
    index: int | None = _variable(WORKER_INDEX)
    num_workers: int | None = _variable(NUM_WORKERS)
    #: 0 on the first start, k after the k-th restart of the group.
    restart: int = _variable(RESTART, 0)
    #: Written by tfstrategy once this worker's strategy exists (``<file>.starting`` while it is created).
    join_file: Path | None = _variable(JOIN_FILE)
    #: Supervision: the first uncaught exception, the heartbeat and batch counts, the launcher's pid and the
    #: descriptor that reaches end-of-file when it dies.
    error_file: Path | None = _variable(ERROR_FILE)
    progress_file: Path | None = _variable(PROGRESS_FILE)
    launcher_pid: int | None = _variable(LAUNCHER_PID)
    lifeline_fd: int | None = _variable(LIFELINE_FD)
    #: A tag every process of the job carries (the reaper finds them by it).
    job_tag: str | None = _variable(JOB_TAG)
    #: This machine's rank in a job of several (``--nnodes``).
    node_rank: int | None = _variable(NODE_RANK)
    settings: WorkerSettings = field(default_factory=WorkerSettings)

    @property
    def launched(self) -> bool:
        """Whether this process is a worker of ``tfstrategy launch``."""
        return self.index is not None

    def to_environ(self) -> dict[str, str]:
        """The variables of this contract (those set), to put into the worker's environment."""
        return {**self.settings.to_environ(), **_to_environ(self, skip=() if self.launched else ("restart",))}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> WorkerContract:
        """The contract ``environ`` carries, every value checked (absent ones are ``None``).

        Raises:
            LaunchError: a value that is not valid, or an index without the number of workers or
                outside it; the message names the variable.
        """
        contract = _from_environ(cls, environ, settings=WorkerSettings.from_environ(environ))
        if contract.index is not None and (contract.num_workers is None or contract.index >= contract.num_workers):
            raise LaunchError(f"Received {WORKER_INDEX.name}={contract.index} with {NUM_WORKERS.name}="
                              f"{NUM_WORKERS.text(environ) or ''!r}; expected an index below the number of workers "
                              f"({_FIX}).")
        return contract


def hook_environment(settings: WorkerSettings | None = None, *, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that runs a process with the start-up hook (what ``run`` and ``launch`` set).

    Args:
        settings: the job's settings, written by :meth:`WorkerSettings.to_environ` (``--audit warn`` alone when
            omitted); ``run`` and ``launch`` build them from their flags.
        env: the environment to extend (``os.environ`` when omitted).
    """
    settings = WorkerSettings(audit="warn") if settings is None else settings
    env = dict(os.environ if env is None else env)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(STARTUP_DIR) + (os.pathsep + path if path else "")
    env.update(HOOK.to_environ(True))
    env.pop(HOOK_PID.name, None)  # the process started with this environment is the one to hook
    env.update(settings.to_environ())
    return env
