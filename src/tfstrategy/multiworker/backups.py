"""The user's side of coordinated backups: a Keras callback for ``fit`` and a helper for custom loops.

Both wrap :class:`~tfstrategy.multiworker.coordinated.CoordinatedBackup`: every
worker saves its part of the same step, the step counts once every worker has
written it, and a restart resumes every worker from the newest step they all have.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import SaveError
from tfstrategy.multiworker.coordinated import CoordinatedBackup, ResumePoint

if TYPE_CHECKING:
    from tfstrategy._protocols import Logs, Model, Strategy

__all__ = ["backup_callback", "validate_save_freq", "LoopBackup"]


def validate_save_freq(save_freq: object) -> Any:
    """``"epoch"`` or a positive number of batches.

    Raises:
        SaveError: anything else.
    """
    if save_freq == "epoch" or (isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq > 0):
        return save_freq
    raise SaveError(f"Received save_freq={save_freq!r}; expected 'epoch' (a backup at each epoch's end) or a number "
                    "of batches > 0, e.g. save_freq=50.")


def backup_callback(base: str | os.PathLike[str], *, save_freq: Any = "epoch", delete_checkpoint: bool = True) -> object:
    """A Keras callback doing ``BackupAndRestore``'s job with the commit rule (see :func:`tfstrategy.backup_callbacks`)."""
    keras = _compat.keras_for()
    save_freq = validate_save_freq(save_freq)

    class CoordinatedBackupAndRestore(keras.callbacks.Callback):  # type: ignore[name-defined]  # an untyped TensorFlow/Keras class
        """Resume every worker from one committed step; back up at each epoch end or every ``save_freq`` batches."""

        def __init__(self) -> None:
            super().__init__()
            self.backup_dir = Path(base)
            self.save_freq = save_freq
            self.backup: CoordinatedBackup | None = None
            self.resumed = ResumePoint()
            self._epoch = 0
            self._saved_at = 0

        def __repr__(self) -> str:
            return f"CoordinatedBackupAndRestore on {self.backup_dir}"

        def on_train_begin(self, logs: Logs = None) -> None:
            strategy = _compat.model_strategy(self.model) or tf().distribute.get_strategy()
            self.backup = CoordinatedBackup(self.backup_dir, strategy)
            self.resumed = self.backup.restore(self.model)
            if self.resumed.step:
                _compat.set_initial_epoch(self.model, self.resumed.epoch, self.resumed.batch)
                _compat.skip_keras3_steps(self.model, self.resumed.batch)

        def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
            self._epoch = epoch
            self._saved_at = self.resumed.batch if epoch == self.resumed.epoch else 0

        def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
            if self.save_freq == "epoch" or self.backup is None:
                return
            done = batch + 1
            steps = self.params.get("steps")
            if steps is not None:
                done = min(done, steps)
            if done <= self._saved_at or done // self.save_freq == self._saved_at // self.save_freq:
                return  # a batch trained before the restart (being skipped), or no backup due yet
            self._saved_at = done
            if steps is not None and done >= steps:
                self.backup.save(self.model, epoch=self._epoch + 1, batch=0)
            else:
                self.backup.save(self.model, epoch=self._epoch, batch=done)

        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            if self.backup is not None and self.save_freq == "epoch":
                self.backup.save(self.model, epoch=epoch + 1, batch=0)

        def on_train_end(self, logs: Logs = None) -> None:
            _compat.clear_initial_epoch(self.model)
            if self.backup is None:
                return
            if delete_checkpoint:
                self.backup.delete()
            self.backup.close()

    return CoordinatedBackupAndRestore()


class LoopBackup:
    """Coordinated backups for a custom training loop (:meth:`tfstrategy.TrainStep.backup`).

    Call :meth:`restore` once before the loop, :meth:`batch_done` after each step
    (it backs up every ``save_freq`` batches), :meth:`epoch_done` after each epoch,
    and :meth:`finish` at the end. Every worker must make the same calls: saving
    and restoring are collectives. Without a backup directory every call is a no-op.

    Args:
        model: the model, compiled with the loop's optimizer (the backup holds its state).
        strategy: the strategy the loop runs under.
        backup_dir: the job's backup directory; ``None``: no backups.
        save_freq: ``"epoch"`` or a number of batches.
        delete_at_finish: remove the backup when :meth:`finish` is called.
    """

    def __init__(self, model: Model, *, strategy: Strategy, backup_dir: str | os.PathLike[str] | None,
                 save_freq: object = "epoch", delete_at_finish: bool = True) -> None:
        self.model = model
        self.save_freq = validate_save_freq(save_freq)
        self.delete_at_finish = delete_at_finish
        self.backup = None if backup_dir is None else CoordinatedBackup(backup_dir, strategy)
        self.resumed = ResumePoint()

    @property
    def enabled(self) -> bool:
        """Whether a backup directory is configured."""
        return self.backup is not None

    def restore(self) -> ResumePoint:
        """Agree with every worker on the newest committed step and load it; where to resume.

        Raises:
            BackupError: a backup is refused or cannot be loaded on every worker.
        """
        if self.backup is not None:
            self.resumed = self.backup.restore(self.model)
        return self.resumed

    def batch_done(self, epoch: int, batch: int) -> bool:
        """After step ``batch`` (0-based) of ``epoch``: back up when ``save_freq`` batches are due.

        Returns:
            Whether a step was committed.
        """
        if self.backup is None or self.save_freq == "epoch" or (batch + 1) % self.save_freq:
            return False
        return self.backup.save(self.model, epoch=epoch, batch=batch + 1)

    def epoch_done(self, epoch: int) -> bool:
        """After epoch ``epoch`` (0-based): back up its end (with ``save_freq="epoch"``)."""
        if self.backup is None or self.save_freq != "epoch":
            return False
        return self.backup.save(self.model, epoch=epoch + 1, batch=0)

    def finish(self) -> None:
        """Training is done: remove the backup (``delete_at_finish``) and release the directory."""
        if self.backup is None:
            return
        if self.delete_at_finish:
            self.backup.delete()
        self.backup.close()
