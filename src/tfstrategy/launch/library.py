"""``tfstrategy.launch()``: the launcher as a library call, for a notebook or a driver script.

It builds the same :class:`~tfstrategy.launch.options.LaunchOptions` as ``tfstrategy launch`` and runs a
:class:`~tfstrategy.launch.supervisor.Launcher` inside the job's backup directory
(:func:`~tfstrategy.launch.backup_dir.run_with_backup`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from tfstrategy.launch.backup_dir import checked_backup_dir, run_with_backup
from tfstrategy.launch.options import LaunchOptions
from tfstrategy.launch.rendezvous import NodeOptions
from tfstrategy.launch.states import RunResult
from tfstrategy.launch.supervisor import Launcher

__all__ = ["launch"]


def launch(
    command: Sequence[str],
    num_workers: int,
    *,
    min_workers: int | None = None,
    max_restarts: int = 0,
    backup_dir: str | os.PathLike[str] | None = None,
    join_timeout: float | None = 300.0,
    audit: str = "warn",
    grace: float = 10.0,
    nodes: NodeOptions | None = None,
    log_dir: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    precision: str | None = None,
    sentinel: str = "epoch",
    profile_dir: str | os.PathLike[str] | None = None,
    profile_every: float = 10.0,
    profile_probes: float | None = None,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> RunResult:
    """Run ``command`` as ``num_workers`` local workers of one MultiWorkerMirroredStrategy job.

    Args:
        command: the program and its arguments, e.g. ``["python", "train.py"]``.
        num_workers: processes to start, each with its own ``TF_CONFIG``.
        min_workers: with ``backup_dir``, go on without a worker killed with no error of its own (the OOM
            killer, its device gone) while this many remain: ``tfstrategy launch -n MIN:MAX``.
        max_restarts: times the whole group is restarted after a failure.
        backup_dir: the job's backup directory (:func:`tfstrategy.backup_callbacks`); with restarts
            and none given, a private one, removed when the job succeeds and kept (its path and
            resume command said) when it does not.
        join_timeout: seconds for every worker to join (``None``: no limit); a
            joined job is never stopped for taking long.
        audit: ``warn``, ``stop`` or ``off``: what each worker does before ``fit``
            when variables were made outside the model's strategy's scope.
        grace: seconds workers get to exit after SIGINT/SIGTERM is passed on.
        nodes: this machine's place in a job of several machines (``num_workers`` on each);
            ``None``: every worker on this machine.
        log_dir: each worker's stdout and stderr to files under this directory, in ``log_dir/run_id/attempt-K``.
        run_id: the run's folder under ``log_dir`` (default: its start time and a short random part).
        precision: the Keras global dtype policy every worker sets before building its model
            (``float32``, ``mixed_float16``, ``mixed_bfloat16``; default: ``TFSTRATEGY_PRECISION``).
        sentinel: the divergence sentinel's interval: ``epoch``, a step count, or ``off``.
        profile_dir: write performance reports there (as ``--profile --profile-dir``), every
            ``profile_every`` minutes on long jobs.
        profile_probes: the share of the time trained the report's probes may take (as ``--profile-probes``;
            default: ``TFSTRATEGY_PROFILE_PROBES``, else 0.1).
        env: the workers' base environment (``os.environ`` when omitted).
        out: where the workers' ``[worker i]`` stdout lines go (stdout); err: their stderr lines and the
            launcher's messages (stderr).

    Returns:
        A :class:`RunResult`; ``returncode`` is 0 when every worker exited 0, 1 when one
        failed, 124 when workers did not join in time, 125 when one stalled, 75 when every
        worker was preempted, 130/143 after SIGINT/SIGTERM (see :mod:`tfstrategy.launch.states`).

    Raises:
        LaunchError: invalid options, or a backup directory another job holds or another user
            could write (nothing is started).
    """
    options = LaunchOptions(
        command=tuple(command), num_workers=num_workers, min_workers=min_workers, max_restarts=max_restarts,
        backup_dir=checked_backup_dir(None if backup_dir is None else Path(backup_dir)), join_timeout=join_timeout,
        audit=audit, grace=grace, nodes=nodes, log_dir=None if log_dir is None else Path(log_dir), run_id=run_id,
        precision=precision, sentinel=sentinel, profile_dir=None if profile_dir is None else Path(profile_dir),
        profile_every=profile_every, profile_probes=profile_probes,
    )
    # A backup directory that outlives this call unless the job succeeds, locked while it runs.
    return run_with_backup(options, lambda opts: Launcher(opts, env=env, out=out, err=err).run(), env=env,
                           timeout=join_timeout, say=lambda text: (err or sys.stderr).write(f"tfstrategy launch: {text}\n"))

