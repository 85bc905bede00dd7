"""Coordinated backups: a step counts only once every worker has written its part.

Keras' ``BackupAndRestore`` gives each worker its own backup and never compares
them: a worker killed before (or during) its save resumes one epoch behind its
peers, and the job trains on from mixed steps. :class:`CoordinatedBackup` adds
the commit rule of :mod:`tfstrategy.multiworker.commit`:

1. **save** (every worker, at the same step): write this worker's part
   (``step-S.weights.h5`` + ``step-S.json``, each to a temporary name, fsync,
   rename); then one collective all-gather of the step each worker wrote; when
   every worker wrote S, each writes ``commit.json`` = [S, previous] atomically
   and deletes parts older than the previous committed step.
2. **restore** (every worker, at the start): each reads its ``commit.json`` and
   checks its parts (size, sha256, job id, trust); two all-gathers share what each
   has; every worker resumes from the newest committed step that every worker
   can load (its own part, or a peer's on a shared file system: the weights of
   MultiWorkerMirroredStrategy's workers are identical), or every worker stops
   with the same :class:`~tfstrategy.errors.BackupError`, each naming its files.

The workers agree among themselves (collectives of the strategy they train
with), so this works the same under ``tfstrategy launch``, Slurm and a plain
``TF_CONFIG``. The files are Keras' own ``.weights.h5`` (what ``BackupAndRestore``
writes, readable by :func:`tfstrategy.restore_checkpoint`), one file per part so
one sha256 and one rename make it whole or absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.environments import restart_count
from tfstrategy.errors import BackupError, CheckpointError, TFStrategyError
from tfstrategy.multiworker import commit
from tfstrategy.multiworker.cluster import load_cluster_config
from tfstrategy.selection.names import strategy_name
from tfstrategy.settings import Side, Variable

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

__all__ = ["ResumePoint", "CoordinatedBackup", "FAULT_ENV"]

#: Test-only fault injection: ``POINT@WORKER:STEP`` SIGKILLs that worker at that point of the save of that
#: step, on the job's first start only; ``POINT@WORKER:STEP:node`` SIGKILLs its launcher first, as a machine
#: that dies mid-save (an elastic job goes on without it). Points: see :data:`FAULT_POINTS`.
FAULT = Variable(name="TFSTRATEGY_TEST_BACKUP_FAULT", side=Side.TEST, expected="POINT@WORKER:STEP[:node]",
                 help="SIGKILL a worker (or its launcher, :node) at a point of one step's coordinated save")
FAULT_ENV = FAULT.name
FAULT_POINTS = ("before", "weights", "renamed", "written", "agreed", "committed")


@dataclass(frozen=True)
class ResumePoint:
    """Where training resumes: global ``step`` (optimizer iterations), ``epoch`` and ``batch`` within it."""

    step: int = 0
    epoch: int = 0
    batch: int = 0

    def done(self, epoch: int, batch: int) -> bool:
        """Whether batch ``batch`` (0-based) of ``epoch`` was already trained before the backup."""
        return (epoch, batch) < (self.epoch, self.batch)


def _say(text: str) -> None:
    print(f"tfstrategy: {text}", file=sys.stderr, flush=True)


class CoordinatedBackup:
    """One worker's side of the coordinated backup under ``base/<task>``.

    Args:
        base: the job's backup directory (every worker's part is in ``base/<task>``).
        strategy: the strategy the workers train with (its collectives carry the agreement).
        env: environment (``TF_CONFIG``, the job id's: :func:`tfstrategy.environments.job_id`); ``os.environ``
            when omitted.

    Raises:
        UntrustedBackupError: the directory is another user's or writable by others.
        ClusterConfigError: ``TF_CONFIG`` is invalid.
    """

    def __init__(self, base: str | os.PathLike[str], strategy: Strategy, *, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)
        config = load_cluster_config(self.env)
        self.base = Path(base)
        self.task = config.task_name if config else "worker-0"
        # A rank over every training task (a chief, then the workers), unique even with a chief-0 and a worker-0.
        self.index = (len(config.cluster.get("chief", ())) * (config.task_type == "worker") + config.task_index
                      if config else 0)
        self.num_workers = config.num_workers if config else 1
        self.directory = self.base / self.task
        self.strategy = strategy
        self.job_id = ""
        self.job_source = ""
        self.committed: tuple[int, ...] = ()
        self._lock: commit.DirectoryLock | None = None
        self._gather_fn: Any = None
        self._fault_takes_node = self.env.get(FAULT_ENV, "").endswith(":node")
        self._fault = self._parse_fault(self.env.get(FAULT_ENV, "").removesuffix(":node"))

    # --- collectives ------------------------------------------------------------------

    def _width(self) -> int:
        return 2 * self.num_workers + 3

    def _gather(self, values: list[float]) -> list[list[float]]:
        """Every worker's ``values`` (padded to one width), by worker index; one all-gather."""
        width = self._width()
        row = [float(self.index), *values][:width] + [-1.0] * max(0, width - 1 - len(values))
        if self.num_workers == 1:
            return [row[1:]]
        tf_ = tf()
        if self._gather_fn is None:
            strategy = self.strategy

            def gather(value: object) -> object:
                # identity() puts the value on this replica's device, for the collective to send it from.
                return tf_.distribute.get_replica_context().all_gather(tf_.identity(value), axis=0)

            def run(value: object) -> object:
                return strategy.experimental_local_results(strategy.run(gather, args=(value,)))[0]

            self._gather_fn = tf_.function(run, autograph=False)
        rows = self._gather_fn(tf_.constant([row], dtype=tf_.float64)).numpy().tolist()
        by_worker: dict[int, list[float]] = {}
        for gathered in rows:  # several local replicas send the same row
            by_worker[int(gathered[0])] = gathered[1:]
        if len(by_worker) != self.num_workers:
            raise BackupError(
                f"TF_CONFIG names {self.num_workers} workers, but the model's strategy "
                f"({strategy_name(self.strategy)}) reaches {len(by_worker)}; the workers' backups can only be agreed "
                "on under the MultiWorkerMirroredStrategy of the whole job. Build the model in its scope "
                "(tfstrategy.select() or MultiWorkerMirroredStrategy()).")
        return [by_worker[i] for i in range(self.num_workers)]

    # --- faults (tests only) ------------------------------------------------------------

    def _parse_fault(self, text: str) -> tuple[str, int, int] | None:
        if not text or restart_count(self.env):
            return None
        point, _, where = text.partition("@")
        worker, _, step = where.partition(":")
        return point, int(worker), int(step)

    def _fault_point(self, point: str, step: int) -> None:
        if self._fault == (point, self.index, step):
            if self._fault_takes_node:  # the launcher started this worker: its parent
                _say(f"test fault: SIGKILL to this node's launcher at {point} of the save of step {step}")
                os.kill(os.getppid(), signal.SIGKILL)
            _say(f"test fault: SIGKILL at {point} of the save of step {step}")
            os.kill(os.getpid(), signal.SIGKILL)

    # --- restore -----------------------------------------------------------------------

    def open(self) -> None:
        """Check trust, take this worker's lock and the job's id (local; raises on this worker only)."""
        commit.make_private_dir(self.directory)
        commit.check_trusted(self.base)
        commit.check_tree(self.directory)
        self.job_id, self.job_source = commit.job_identity(self.env, self.base)
        if self._lock is None:
            lock = commit.DirectoryLock(self.directory, self.job_id)
            lock.acquire()
            self._lock = lock

    def _loadable(self, step: int) -> tuple[Path | None, str | None]:
        """This worker's whole part of ``step``, else a whole part of a peer's on this file system."""
        try:
            commit.check_part(self.directory, step, self.job_id)
            return self.directory / commit.part_name(step), None
        except BackupError as error:
            own = str(error)
        for peer in sorted(self.base.glob("*-*")):
            if peer == self.directory or not peer.is_dir():
                continue
            with contextlib.suppress(TFStrategyError, OSError):
                commit.check_tree(peer)
                commit.check_part(peer, step, self.job_id)
                return peer / commit.part_name(step), own
        return None, own

    def restore(self, model: Model) -> ResumePoint:
        """Agree with every worker on the step to resume and load it into ``model`` (a collective).

        Returns:
            Where training resumes (``ResumePoint()`` when nothing was committed).

        Raises:
            BackupError: this worker's or another's backup is refused or cannot be loaded (every
                worker raises; this worker's message names its own files).
        """
        problem: str | None = None
        record_note = ""
        try:
            self.open()
            record_path = self.directory / commit.RECORD_NAME
            if record_path.exists():
                try:
                    record = commit.read_record(record_path)
                except BackupError as error:
                    record_note = f"{error} Using the steps the other workers committed instead."
                else:
                    if record.job_id != self.job_id:
                        problem = (f"{record_path} belongs to job {record.job_id!r}, not this job {self.job_id!r} "
                                   f"(from {self.job_source}); pass another backup directory or remove this one")
                    else:
                        self.committed = record.steps
        except (TFStrategyError, OSError) as error:
            problem = str(error)
        own = [0.0 if problem is None else 1.0, *[float(s) for s in self.committed], *([-1.0] * (2 - len(self.committed))),
               1.0 if record_note else 0.0]
        first = self._gather(own)
        problems = [problem if i == self.index else ("refused its backup (see that worker's error)" if row[0] else None)
                    for i, row in enumerate(first)]
        committed = [[int(s) for s in row[1:3] if s >= 0] for row in first]
        refused = commit.refusal(problems)
        if refused:
            self.close()
            raise BackupError(refused)
        steps = commit.candidates(committed)[: self._width() - 1]
        if not steps and any(row[3] for row in first):
            self.close()
            unreadable = [str(i) for i, row in enumerate(first) if row[3]]
            raise BackupError(
                f"The commit record of worker {', '.join(unreadable)} cannot be read and no other worker has one, so "
                "which step was committed is unknown; nothing is loaded and training does not silently start over. "
                f"This worker ({self.task}): {record_note or 'its record is readable'} Remove the backup directory "
                "to start from scratch.")
        sources: list[tuple[Path | None, str | None]] = [self._loadable(step) for step in steps]
        second = self._gather([1.0 if path is not None else 0.0 for path, _ in sources])
        loadable = [[bool(row[k] > 0) for k in range(len(steps))] for row in second]
        if record_note:
            _say(record_note)
        try:
            resume = commit.choose_resume(committed, loadable, [None] * self.num_workers)
        except BackupError as error:
            own_errors = "; ".join(f"step {s}: {why}" for s, (path, why) in zip(steps, sources) if path is None and why)
            self.close()
            raise BackupError(f"{error} This worker ({self.task}): {own_errors or 'has every part'}.") from None
        if resume.step is None:
            return ResumePoint()
        for step, (path, why) in zip(steps, sources):
            if step > resume.step and path is None:
                _say(f"{self.task} does not resume from committed step {step}: {why}")
        path, why = sources[steps.index(resume.step)]
        if path is None:  # choose_resume picks only steps every worker can load
            raise BackupError(f"{self.task} has no part of step {resume.step}: {why}")
        if why:
            _say(f"{self.task}: {why} Loading the same step from {path} instead (the workers' weights are identical).")
        failure = ""
        try:
            part = commit.read_part(path.parent, resume.step)
            self._load(model, path)
            self._load_seeds(model, part)
            loaded_step = int(_optimizer_of(model).iterations.numpy()) if _optimizer_of(model) is not None else part.step
            if loaded_step != part.step:
                failure = f"{path} holds optimizer step {loaded_step}, its sidecar says step {part.step}"
        except (CheckpointError, OSError) as error:
            failure = str(error)
        third = self._gather([0.0 if not failure else 1.0])
        if any(row[0] for row in third):
            self.close()
            raise BackupError(f"Could not load committed step {resume.step} on every worker. This worker "
                              f"({self.task}): {failure or 'loaded it; see the other workers'}.")
        self.committed = tuple(committed_for(resume.step, committed))
        newer = [step for step in steps if step > resume.step]
        if newer:
            # Steps newer than the one every worker resumed from are void: remove this worker's parts of
            # them (first) and its record of them, so a part written before can never join a later resume.
            for step in newer:
                for name in (commit.sidecar_name(step), commit.part_name(step)):
                    (self.directory / name).unlink(missing_ok=True)
            commit.write_record(self.directory, commit.CommitRecord(job_id=self.job_id, workers=self.num_workers,
                                                                    steps=self.committed))
        _say(f"{self.task} resumes from committed step {part.step} (epoch {part.epoch}, batch {part.batch}): "
             f"{resume.reason}")
        return ResumePoint(step=part.step, epoch=part.epoch, batch=part.batch)

    def _load(self, model: Model, path: Path) -> None:
        from tfstrategy.scope.restore import restore_checkpoint

        optimizer = _optimizer_of(model)
        if optimizer is not None and not _compat.optimizer_built(optimizer):
            with self.strategy.scope():
                optimizer.build(model.trainable_variables)
        restore_checkpoint(model, path)

    def _load_seeds(self, model: Model, part: commit.Part) -> None:
        """The random seed generators' states of ``part`` into ``model``, so it draws what it would have drawn."""
        import numpy as np

        states = _compat.model_seed_states(model)
        if not part.seeds and not states:
            return
        if len(states) != len(part.seeds) or any(len(s) != int(np.prod(v.shape)) for v, s in zip(states, part.seeds)):
            _say(f"{self.task}: the backup of step {part.step} holds {len(part.seeds)} random seed generator "
                 f"state(s), the model has {len(states)}; the model's generators start from their seeds again")
            return
        for variable, values in zip(states, part.seeds):
            variable.assign(np.asarray(values).astype(variable.dtype).reshape(variable.shape))

    # --- save ----------------------------------------------------------------------------

    def save(self, model: Model, *, epoch: int, batch: int) -> bool:
        """Write this worker's part of the current step and commit it once every worker has (a collective).

        Args:
            model: the model (its optimizer's iterations are the step).
            epoch: epochs completed when ``batch`` is 0, else the epoch in progress.
            batch: batches of ``epoch`` completed (0 at an epoch's end).

        Returns:
            Whether the step was committed.
        """
        optimizer = _optimizer_of(model)
        step = int(optimizer.iterations.numpy()) if optimizer is not None else epoch
        wrote = -1.0
        try:
            self._write_part(model, step, epoch, batch)
            wrote = float(step)
        except (OSError, TFStrategyError) as error:
            _say(f"{self.task} could not write its backup of step {step} ({error}); the step is not committed "
                 f"and the last committed step ({self.committed[0] if self.committed else 'none'}) stays")
        self._fault_point("written", step)
        rows = self._gather([wrote])
        if any(row[0] != float(step) for row in rows):
            return False
        self._fault_point("agreed", step)
        previous = [s for s in self.committed if s != step][:1]
        steps = (step, *previous)
        commit.write_record(self.directory, commit.CommitRecord(job_id=self.job_id, workers=self.num_workers, steps=steps))
        self.committed = steps
        self._fault_point("committed", step)
        self._prune(keep=set(steps))
        return True

    def _write_part(self, model: Model, step: int, epoch: int, batch: int) -> None:
        self._fault_point("before", step)
        tmp = self.directory / f".tmp-{os.getpid()}-{commit.part_name(step)}"
        with _own_path():
            model.save_weights(str(tmp), overwrite=True)
        os.chmod(tmp, 0o600)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._fault_point("weights", step)
        size, digest = commit.file_digest(tmp)
        os.replace(tmp, self.directory / commit.part_name(step))
        commit.fsync_directory(self.directory)
        self._fault_point("renamed", step)
        import numpy as np

        seeds = tuple(tuple(int(x) for x in np.asarray(v.numpy()).ravel()) for v in _compat.model_seed_states(model))
        part = commit.Part(job_id=self.job_id, step=step, epoch=epoch, batch=batch, size=size, sha256=digest,
                           seeds=seeds)
        commit.atomic_write_text(self.directory / commit.sidecar_name(step), json.dumps(part.to_json()) + "\n")

    def _prune(self, keep: set[int]) -> None:
        newest = max(keep)
        for entry in self.directory.iterdir():
            name = entry.name
            if name.startswith(".tmp-"):
                entry.unlink(missing_ok=True)
                continue
            if name.startswith("step-"):
                step_text = name[len("step-"):].split(".", 1)[0]
                if step_text.isdigit() and int(step_text) not in keep and int(step_text) < newest:
                    entry.unlink(missing_ok=True)

    # --- end ------------------------------------------------------------------------------

    def delete(self) -> None:
        """Remove this worker's backup (after training finished)."""
        for entry in list(self.directory.iterdir()) if self.directory.exists() else []:
            if entry.name != commit.LOCK_NAME:
                entry.unlink(missing_ok=True)
        self.committed = ()

    def close(self) -> None:
        """Release this worker's directory lock."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def committed_for(step: int, committed: list[list[int]]) -> list[int]:
    """The committed steps to carry on from after resuming at ``step``: it and the newest before it."""
    older = [s for s in commit.candidates(committed) if s < step][:1]
    return [step, *older]


def _own_path() -> Any:
    """A block in which a Keras writer writes the path it is given on every worker.

    Each worker's part is its own file: it must not be redirected to the chief-only
    writing that :mod:`tfstrategy.multiworker.chief_files` gives paths shared by the workers.
    """
    from tfstrategy.multiworker.chief_files import passing_through

    return passing_through()


def _optimizer_of(model: Model) -> Any:
    return getattr(model, "optimizer", None)
