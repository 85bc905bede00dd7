"""What ``tfstrategy launch`` runs and how it supervises it: :class:`LaunchOptions`, validated before anything starts,
and what they make of each worker (:func:`worker_spec`) and of the monitor's thresholds (:func:`policy_of`)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tfstrategy.contract.files import WorkerFiles
from tfstrategy.errors import LaunchError
from tfstrategy.launch.console import ConsoleView
from tfstrategy.launch.diagnosis import LOOPBACK
from tfstrategy.launch.processes import WorkerSpec
from tfstrategy.launch.rendezvous import NodeOptions, validate_node_options
from tfstrategy.launch.ticks import Policy
from tfstrategy.parsing import parse_port_range as parse_port_range  # re-exported, as the one below: they moved there
from tfstrategy.parsing import parse_run_id as parse_run_id
from tfstrategy.settings import validate_audit_mode
from tfstrategy.worker_contract import WorkerContract, WorkerSettings, hook_environment

__all__ = ["LaunchOptions", "validate_launch_options", "worker_settings", "parse_port_range", "parse_run_id",
           "new_run_id", "worker_tf_config", "cluster_tf_config"]


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """What to run and how to supervise it."""

    command: tuple[str, ...]
    #: Workers to start on this machine (with ``-n MIN:MAX``, MAX).
    num_workers: int
    #: ``-n MIN:MAX``: a worker lost (killed, its device gone) re-forms the group with the others while MIN remain.
    min_workers: int | None = None
    max_restarts: int = 0
    backup_dir: Path | None = None
    join_timeout: float | None = 300.0
    #: Seconds workers get to exit after the launcher passes on SIGINT/SIGTERM.
    grace: float = 10.0
    #: What the workers' start-up hook does about variables outside the scope: warn, stop or off.
    audit: str = "warn"
    #: This machine's place in a multi-node job (``--nnodes``); ``None``: every worker here.
    nodes: NodeOptions | None = None
    #: Floor of the seconds without progress before a stall is reported (scaled by the step time).
    stall_report: float = 30.0
    #: Seconds without progress that fail the group (exit 125, or a restart); ``None``: never for a stall.
    stall_timeout: float | None = 120.0
    #: Each worker's stdout/stderr to ``DIR/RUN_ID/attempt-K/worker-I/{stdout,stderr}.log``; ``None``: console only.
    log_dir: Path | None = None
    #: The run's folder under ``log_dir`` (``--run-id``); ``None``: a new one (:func:`new_run_id`) once validated.
    run_id: str | None = None
    #: With ``log_dir``: also copy the output to the console.
    tee: bool = False
    #: Only these workers' lines on the console (``None``: every worker's).
    console_workers: frozenset[int] | None = None
    #: Whose progress the console draws live, repeats shown once, noise off (``--console-workers``, ``--debug``).
    console_view: ConsoleView = ConsoleView()
    #: The workers' ports come from ``low..high`` on each machine (``None``: the kernel's ephemeral range).
    port_range: tuple[int, int] | None = None
    #: The Keras global dtype policy every worker sets (``None``: ``TFSTRATEGY_PRECISION``, else Keras' own).
    precision: str | None = None
    #: The divergence sentinel's interval: ``epoch``, a step count, or ``off``.
    sentinel: str = "epoch"
    #: ``--profile``: the performance reports' directory (``None``: no report unless ``TFSTRATEGY_PROFILE``).
    profile_dir: Path | None = None
    #: Minutes between performance reports on long jobs.
    profile_every: float = 10.0
    #: ``--profile-probes``: the share of the time trained the report's probes may take (``None``: the default).
    profile_probes: str | float | None = None

    @property
    def run_log_dir(self) -> Path | None:
        """This run's folder, ``log_dir/run_id`` (``None`` without ``log_dir``)."""
        if self.log_dir is None:
            return None
        return self.log_dir / (self.run_id or "")

    def attempt_log_dir(self, attempt: int) -> Path | None:
        """Attempt ``attempt``'s folder in this run's, ``log_dir/run_id/attempt-K`` (``None`` without ``log_dir``)."""
        run_log_dir = self.run_log_dir
        return None if run_log_dir is None else run_log_dir / f"attempt-{attempt}"

    def on_console(self, index: int) -> bool:
        """Whether worker ``index``'s lines go to the console: ``--console-workers`` names workers for it, with
        ``--log-dir`` too (no ``--tee`` needed)."""
        shown = self.console_workers
        return (self.log_dir is None or self.tee or shown is not None) and (shown is None or index in shown)


def new_run_id(now: float | None = None) -> str:
    """A new run's id, its start time and a short random part: ``20261206-103000-3f9a`` (as torchrun's rdzv_id names
    a run), so a second run with the same ``--log-dir`` writes a folder of its own."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{secrets.token_hex(2)}"


def validate_launch_options(options: LaunchOptions) -> LaunchOptions:
    """Check the options before anything starts; creates the backup directory.

    Returns:
        ``options``, with a new :attr:`~LaunchOptions.run_id` when ``log_dir`` is given without one.

    Raises:
        LaunchError: no command or one that cannot be run, fewer than one worker,
            a negative restart count, a timeout that is not a positive number,
            a run id that is no folder name (or without a log directory),
            or a backup directory that cannot be created or written.
    """
    example = "tfstrategy launch -n 2 -- python train.py"
    if not options.command:
        raise LaunchError(f"Received no command to run; expected it after '--', e.g. {example}.")
    if options.num_workers < 1:
        raise LaunchError(f"Received -n {options.num_workers}; expected 1 or more workers, e.g. {example}.")
    if options.max_restarts < 0:
        raise LaunchError(f"Received --max-restarts {options.max_restarts}; expected 0 (never restart) or more.")
    _check_elastic_workers(options)
    if options.nodes is not None and options.nodes.elastic and options.backup_dir is None:
        raise LaunchError(
            f"Received --nnodes {options.nodes.shape} without --backup-dir; an elastic job resumes every re-formed group "
            "from the job's backup, which every node must read: pass --backup-dir DIR on a file system every node "
            "shares (the same path on each), and save with callbacks=tfstrategy.preemption_callbacks().")
    timeout = options.join_timeout
    if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
        raise LaunchError(
            f"Received --timeout {timeout:g}; expected seconds > 0 for every worker to join, e.g. --timeout 120 "
            "(or 0 for no limit)."
        )
    if not math.isfinite(options.grace) or options.grace < 0:
        raise LaunchError(f"Received --grace {options.grace:g}; expected seconds >= 0, e.g. --grace 30.")
    if not math.isfinite(options.stall_report) or options.stall_report <= 0:
        raise LaunchError(f"Received --stall-report {options.stall_report:g}; expected seconds > 0 without progress "
                          "before a stall is reported, e.g. --stall-report 30.")
    stall = options.stall_timeout
    if stall is not None and (not math.isfinite(stall) or stall <= 0):
        raise LaunchError(f"Received --stall-timeout {stall:g}; expected seconds > 0 without progress before the job "
                          "fails, e.g. --stall-timeout 120 (or 0 to only report stalls).")
    if options.run_id is not None and options.log_dir is None:
        raise LaunchError("Received --run-id without --log-dir; expected --log-dir DIR too (the run's output goes to "
                          "DIR/RUN_ID), or drop --run-id.")
    if options.run_id is not None:
        parse_run_id(options.run_id)
    elif options.log_dir is not None:
        options = dataclasses.replace(options, run_id=new_run_id())
    if options.tee and options.log_dir is None:
        raise LaunchError("Received --tee without --log-dir; expected --log-dir DIR too (--tee copies the log files' "
                          "lines to the console), or drop --tee.")
    if options.console_workers is not None:
        total = options.num_workers * (options.nodes.nnodes if options.nodes is not None else 1)
        outside = sorted(i for i in options.console_workers if not 0 <= i < total)
        if outside:
            raise LaunchError(f"Received --console-workers with {', '.join(map(str, outside))}; expected worker "
                              f"indices 0..{total - 1}, e.g. --console-workers 0.")
    if options.port_range is not None:
        _check_port_range(options.port_range, options.num_workers)
    try:
        validate_audit_mode(options.audit)
    except Exception as error:
        raise LaunchError(str(error)) from None
    worker_settings(options, {})  # the settings' own errors (a bad --precision, --sentinel or --profile-every)
    _require_runnable(options.command[0], example)
    if options.nodes is not None:
        validate_node_options(options.nodes)
    for name, directory in (("--backup-dir", options.backup_dir), ("--log-dir", options.log_dir)):
        if directory is not None:
            _require_writable_directory(directory, name)
    return options


def worker_settings(options: LaunchOptions, environ: Mapping[str, str]) -> WorkerSettings:
    """What every worker of the job is told besides its own place: the one mapping from options to variables.

    ``environ`` is the launcher's environment: a setting the options leave open comes from its
    variable there (checked), and one both set differently is refused.

    Raises:
        PrecisionError, TrainingError: a bad precision, sentinel or profile interval (naming the flag or variable).
        SettingsConflictError: ``precision`` and ``TFSTRATEGY_PRECISION`` differ.
        LaunchError: another ``TFSTRATEGY_*`` setting in ``environ`` is not valid.
    """
    from tfstrategy.performance.environment import profile_settings, tracker_from_environment
    from tfstrategy.training.precision import parse_precision, resolve_precision
    from tfstrategy.training.sentinel import parse_sentinel

    given = WorkerSettings.from_environ(environ)
    precision = None if options.precision is None else parse_precision(options.precision, name="--precision")
    precision, _ = resolve_precision(precision, environ)
    sentinel = parse_sentinel(options.sentinel, name="--sentinel")
    profile_dir: Path | None
    profile_every: float | None
    probes: float | None = None
    if options.profile_dir is not None:
        profile_dir, profile_every, probes = profile_settings(True, options.profile_dir, options.profile_every,
                                                              options.profile_probes)
    else:
        profile_settings(False, ".", options.profile_every, options.profile_probes)  # --profile-probes alone
        tracker = tracker_from_environment(dict(environ))
        profile_dir = None if tracker is None else Path(tracker["directory"])
        profile_every = None if tracker is None else float(tracker["every_minutes"])
    if probes is None:  # the variable of the launcher's environment, checked, when no option set it
        probes = given.profile_probes
    return dataclasses.replace(
        given, audit=validate_audit_mode(options.audit), summary=True, precision=precision,
        debug=options.console_view.debug or given.debug,
        sentinel="off" if sentinel is None else str(sentinel), profile_dir=profile_dir, profile_every=profile_every,
        profile_probes=probes,
        backup_dir=options.backup_dir if options.backup_dir is not None else given.backup_dir,
    )


def _check_elastic_workers(options: LaunchOptions) -> None:
    """``-n MIN:MAX``: counts in order, a shared backup to resume from, one machine.

    Raises:
        LaunchError: MIN outside 1..MAX, no ``--backup-dir``, or ``--nnodes`` as well.
    """
    low, high = options.min_workers, options.num_workers
    if low is None:
        return
    if not 1 <= low <= high:
        raise LaunchError(f"Received -n {low}:{high}; expected -n MIN:MAX with 1 <= MIN <= MAX, e.g. -n 2:4 "
                          "(start 4 workers, go on while 2 or more remain).")
    if options.nodes is not None:
        raise LaunchError(f"Received -n {low}:{high} with --nnodes {options.nodes.shape}; a job of several machines "
                          f"is elastic by its nodes: pass --nnodes MIN:MAX with -n {high}.")
    if options.backup_dir is None:
        raise LaunchError(f"Received -n {low}:{high} without --backup-dir; the workers that remain resume from the "
                          "job's backup: pass --backup-dir DIR and save with callbacks=tfstrategy.preemption_callbacks().")


def _check_port_range(port_range: tuple[int, int], num_workers: int) -> None:
    low, high = port_range
    shown = f"--port-range {low}-{high}"
    if not 1024 <= low <= high <= 65535:
        raise LaunchError(f"Received {shown}; expected 1024 <= LOW <= HIGH <= 65535 (ports below 1024 need root), "
                          "e.g. --port-range 29500-29599.")
    if high - low + 1 < num_workers:
        raise LaunchError(f"Received {shown}, {high - low + 1} port(s) for -n {num_workers}; expected at least one "
                          f"port per worker on each machine, e.g. --port-range {low}-{low + max(num_workers, 100) - 1}.")


def _require_runnable(program: str, example: str) -> None:
    found = shutil.which(program)
    if found is not None:
        return
    path = Path(program)
    if os.sep in program and path.is_file():
        raise LaunchError(
            f"Received the command {program!r}, a file that is not executable; expected a program, e.g. {example}. "
            f"Run it through its interpreter ('{sys.executable} {program}') or chmod +x it."
        )
    raise LaunchError(
        f"Received the command {program!r}, which is not an executable on PATH; "
        f"expected e.g. {example} (use '{sys.executable}' for this Python)."
    )


def _require_writable_directory(directory: Path, name: str) -> None:
    if directory.exists() and not directory.is_dir():
        raise LaunchError(f"Received {name} {directory}, which is a file; pass a directory (it is created).")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise LaunchError(
            f"Received {name} {directory}, which cannot be created ({error.strerror}); pass a directory "
            "you can write to."
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise LaunchError(f"Received {name} {directory}, which is not writable; pass a directory you can write to.")


def worker_tf_config(ports: Sequence[int], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` in a local cluster on ``ports``."""
    return cluster_tf_config([f"{LOOPBACK}:{port}" for port in ports], index)


def cluster_tf_config(addresses: Sequence[str], index: int) -> str:
    """The ``TF_CONFIG`` of worker ``index`` of the workers at ``addresses`` (``host:port``)."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


def worker_spec(options: LaunchOptions, contract: WorkerContract, files: WorkerFiles, addresses: Sequence[str],
                port: int, *, env: Mapping[str, str]) -> WorkerSpec:
    """How to start the worker ``contract`` describes, one of the cluster ``addresses``, on ``port``.

    Its environment: ``env`` (the launcher's, without its secret), the start-up hook's, its contract's and its
    ``TF_CONFIG``; its files; its log files with ``--log-dir``; whether its lines go to the console.
    """
    index = contract.index if contract.index is not None else 0
    worker_env = {
        **hook_environment(contract.settings, env=env),
        **contract.to_environ(),
        "TF_CONFIG": cluster_tf_config(list(addresses), index),
        # Line-by-line output, so prefixes and failure tails are current; UTF-8 whatever the
        # terminal's encoding, as the launcher reads it (and re-encodes for the terminal).
        "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8",
    }
    log_dir = options.attempt_log_dir(contract.restart)
    logs = None if log_dir is None else (log_dir / f"worker-{index}" / "stdout.log",
                                         log_dir / f"worker-{index}" / "stderr.log")
    return WorkerSpec(index=index, command=options.command, env=worker_env, port=port, join_file=files.join_file,
                      error_file=files.error_file, progress_file=files.progress_file, logs=logs,
                      console=options.on_console(index))


def policy_of(options: LaunchOptions) -> Policy:
    """The monitor's thresholds from the launch options."""
    return Policy(join_timeout=options.join_timeout, stall_report=options.stall_report,
                  stall_timeout=options.stall_timeout,
                  heartbeat_timeout=max(2.0, min(10.0, options.stall_report)))
