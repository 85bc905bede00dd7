"""``tf.train.Checkpoint`` files written once in a multi-worker job (the hook's ``checkpoint_files`` step).

TensorFlow's single-worker tutorials save with ``checkpoint.save(prefix)`` (and
``tf.train.CheckpointManager``); run unchanged on two workers that share a
filesystem, both write ``prefix-N`` and its ``prefix-N_temp/`` shards, and the
first to merge deletes the other's shard: ``MergeV2Checkpoints ... allow_missing_files
was set to false and ./training_checkpoints/ckpt-1_temp/part-00000-of-00001 did not
exist`` (measured on the corpus' ``tf_custom_training.py`` under ``launch -n 2``).
TensorFlow's multi-worker tutorial avoids it with a per-worker ``write_filepath``
helper in the script; this step does the same for scripts that lack it.

``Checkpoint._write`` is where ``save``, ``write`` and ``CheckpointManager.save``
all write. On the chief it writes the path; on every other worker it writes a
private copy (:func:`~tfstrategy.multiworker.chief_files.chief_write`: the save
still runs, in case reading a variable is a collective), waits until the chief's
checkpoint is complete, and only then runs the bookkeeping callbacks (the
``checkpoint`` state file, ``CheckpointManager``'s list and clean-up) with the real
path, so ``save()`` returns the same path on every worker and
``tf.train.latest_checkpoint`` finds the chief's files. The state file is small
and written atomically by TensorFlow (temporary file and rename), so the second
worker's identical record never leaves it half written. An asynchronous save
(``CheckpointOptions(experimental_enable_async_checkpoint=True)``) returns at once
and is written later by TensorFlow's own thread, through ``_write`` again: the rule
applies there, in that thread.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable
from typing import Any

from tfstrategy import _compat
from tfstrategy.runtime.rewrites import Rewrite, install_rewrite
from tfstrategy.state.registry import RUNTIME

__all__ = ["checkpoint_files"]


def _written_once(original: Callable[..., object]) -> Callable[..., object]:
    from tfstrategy.multiworker import chief_files

    @functools.wraps(original)
    def _write(self: Any, file_prefix: Any, options: Any = None) -> object:
        if getattr(options, "experimental_enable_async_checkpoint", False):
            # TensorFlow's thread writes it later through this same method (without the flag): redirected there.
            return original(self, file_prefix, options)
        config = chief_files.shared_job()
        if config is None or config.is_chief or not isinstance(file_prefix, (str, os.PathLike)):
            with chief_files.chief_write(file_prefix) as target:
                return original(self, target, options)
        real = os.fspath(file_prefix)
        RUNTIME.hook.changed("checkpoint_files", "tf.train.Checkpoint files written by the chief only")
        callbacks = list(getattr(options, "experimental_write_callbacks", None) or [])
        private_options = copy.copy(options) if options is not None else None
        if private_options is not None:
            private_options.experimental_write_callbacks = None
        with chief_files.chief_write(real) as target:
            original(self, target, private_options)
        if callbacks:  # after the chief's files are complete, as the chief ran them
            # The save would have made the directory: a per-worker path of the script's own (TensorFlow's
            # multi-worker tutorial writes workertemp_<i>/ and removes it) then holds this worker's record.
            os.makedirs(os.path.dirname(real) or ".", exist_ok=True)
        for callback in callbacks:
            callback(real)
        return real

    return _write


def checkpoint_files() -> str:
    """Install the rewrite (the hook's ``checkpoint_files`` step, multi-worker only)."""
    install_rewrite(Rewrite("checkpoint_files", _compat.checkpoint_module,
                            {_compat.checkpoint_write_target(): _written_once}))
    return "tf.train.Checkpoint and CheckpointManager write on the chief; other workers write a private copy"
