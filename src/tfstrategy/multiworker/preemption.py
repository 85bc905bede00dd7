"""Stop every worker at one agreed step on SIGTERM, so a requeued job resumes exactly.

Slurm warns a job before ending it (preemption, ``scancel --signal=TERM``,
``--signal=B:TERM@60`` before the time limit). The signal reaches the workers
at slightly different moments, while each is somewhere in a step; a worker that
simply exits leaves its peers stuck in a collective, and one that exits after a
half-written backup leaves nothing to resume from.

:class:`PreemptionWatcher` records the signal in a flag, and at each batch end
every worker sums the flags of all workers in one small all-reduce: they all
see the same sum after the same step, so they all stop there (TensorFlow's
``PreemptionCheckpointHandler`` agrees through the coordination service
instead; a collective needs no extra service and cannot race). A worker
stopping mid-epoch keeps the last committed backup
(:func:`tfstrategy.backup_callbacks`: every epoch's end, or every ``save_freq``
batches), and every worker resumes from that step after the restart (the data
order is fixed, so the result is the same); a stop agreed on an epoch's last
batch waits for that epoch's backup. The process then exits
with :data:`PREEMPTED_EXIT_CODE`, which ``examples/slurm/train.sbatch`` turns
into ``scontrol requeue`` (or set ``RequeueExit=75`` in slurm.conf).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.contract.exits import EXIT_PREEMPTED as PREEMPTED_EXIT_CODE  # re-exported: it moved there
from tfstrategy.environments import preemption_signal, restart_count
from tfstrategy.errors import PlatformError

if TYPE_CHECKING:
    from tfstrategy._protocols import Logs, Strategy

__all__ = ["preemption_callbacks"]


class PreemptionWatcher:
    """Turns SIGTERM into a flag, and the flags of all workers into one agreed decision.

    Args:
        signals: the signals that ask to stop (default: the cluster environment's preemption signal,
            SIGTERM unless it says otherwise: :func:`tfstrategy.environments.preemption_signal`).
    """

    def __init__(self, signals: tuple[int, ...] | None = None) -> None:
        self.signals = signals if signals is not None else (preemption_signal(),)
        self.received_at: float | None = None
        self._previous: dict[int, Any] = {}
        self._agree_fn: Any = None

    def install(self) -> None:
        """Handle the signals in this process (main thread only) until :meth:`uninstall`."""
        for number in self.signals:
            if number not in self._previous:
                self._previous[number] = signal.signal(number, self._handle)

    def uninstall(self) -> None:
        """Put the previous handlers back."""
        while self._previous:
            number, handler = self._previous.popitem()
            signal.signal(number, handler)

    def _handle(self, number: int, frame: object) -> None:
        if self.received_at is None:
            self.received_at = time.time()

    @property
    def received(self) -> bool:
        """Whether this worker received a signal."""
        return self.received_at is not None

    def agreed(self, strategy: Strategy) -> bool:
        """Whether any worker received a signal; a collective every worker must call at the same step."""
        if self._agree_fn is None:
            self._agree_fn = _make_agree_fn(strategy)
        flag = tf().constant(1.0 if self.received else 0.0)
        return bool(self._agree_fn(flag).numpy() > 0)


def _make_agree_fn(strategy: Strategy) -> object:
    tf_ = tf()

    def sum_flags(flag: object) -> object:
        # identity() places the value on this replica's device; the all-reduce needs one to send from.
        return tf_.distribute.get_replica_context().all_reduce(tf_.distribute.ReduceOp.SUM, tf_.identity(flag))

    def agree(flag: object) -> object:
        return strategy.experimental_local_results(strategy.run(sum_flags, args=(flag,)))[0]

    return tf_.function(agree)


def preemption_callback(watcher: PreemptionWatcher | None = None) -> object:
    """A Keras callback: on SIGTERM, stop every worker at one agreed step and exit with status 75.

    Place it after the backup callback (as :func:`tfstrategy.preemption_callbacks` does), so a stop
    agreed on an epoch's last batch exits after that epoch's backup.
    """
    _require_main_thread()
    keras = _compat.keras_for()
    watcher = watcher or PreemptionWatcher()
    return _stop_on_preemption(keras.callbacks.Callback, watcher)


def _stop_on_preemption(base: Any, watcher: PreemptionWatcher) -> object:
    class StopOnPreemption(base):
        """Stops fit at the step every worker agreed on after a SIGTERM, then exits with status 75."""

        def __init__(self) -> None:
            super().__init__()
            self.watcher = watcher
            self._epoch = 0
            self._exit_after_epoch = False

        def on_train_begin(self, logs: Logs = None) -> None:
            watcher.install()
            restart = restart_count()
            if restart:
                _say(f"restart {restart}: training resumes from the backup at {time.time():.3f}")

        def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
            self._epoch = epoch

        def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
            if not watcher.agreed(_compat.model_strategy(self.model)):
                return
            steps, epochs = self.params.get("steps"), self.params.get("epochs")
            last_batch = steps is not None and batch + 1 >= steps
            if last_batch and epochs is not None and self._epoch + 1 >= epochs:
                return  # the training is done: let fit and the saving after it finish
            if last_batch:
                self._exit_after_epoch = True  # the backup callback saves this epoch first
                self.model.stop_training = True
                return
            self._exit(f"epoch {self._epoch + 1} batch {batch + 1}; every worker resumes from the last committed backup "
                       "after the restart")

        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            if self._exit_after_epoch:
                self._exit(f"the end of epoch {epoch + 1}, after its backup")

        def on_train_end(self, logs: Logs = None) -> None:
            watcher.uninstall()

        def _exit(self, where: str) -> None:
            watcher.uninstall()
            name = signal.Signals(watcher.signals[0]).name
            mine = f"{name} here at {watcher.received_at:.3f}" if watcher.received else f"{name} on another worker"
            _say(f"{mine}; every worker stops at {where}; exit status {PREEMPTED_EXIT_CODE} asks for a requeue")
            sys.exit(PREEMPTED_EXIT_CODE)

    return StopOnPreemption()


def _require_main_thread() -> None:
    thread = threading.current_thread()
    if thread is not threading.main_thread():
        raise PlatformError(
            f"Received a call to preemption_callbacks() in thread {thread.name!r}; Python handles SIGTERM in the main "
            "thread only. Ray Train runs the training function in such a thread and stops and restarts its workers "
            "itself (the group resumes from the last committed checkpoint): there, use the callback of "
            "tfstrategy.integrations.ray instead. Elsewhere, call fit from the main thread."
        )


def _say(text: str) -> None:
    print(f"tfstrategy: {text}", file=sys.stderr, flush=True)


def preemption_callbacks(backup_dir: str | os.PathLike[str] | None = None, **options: object) -> list[object]:
    """:func:`tfstrategy.backup_callbacks` plus a callback that stops all workers at one step on SIGTERM.

    Pass the result to ``model.fit(callbacks=[*tfstrategy.preemption_callbacks(), ...])``. On
    SIGTERM (Slurm preemption, ``scancel --signal=TERM``, ``--signal=B:TERM@60``) every worker
    stops after the same step, keeping the last backup, and exits with status 75
    (:data:`PREEMPTED_EXIT_CODE`); the requeued job resumes from the backup and ends with
    the weights of an uninterrupted run. ``[]`` when no backup directory is configured.

    Args:
        backup_dir: base directory; defaults to ``TFSTRATEGY_BACKUP_DIR``.
        **options: passed to :func:`tfstrategy.backup_callbacks` (e.g. ``save_freq=50``).

    Raises:
        ClusterConfigError: ``TF_CONFIG`` is set but invalid.
        PlatformError: called outside the main thread (Ray Train's training thread), where Python
            cannot catch SIGTERM; under Ray use ``tfstrategy.integrations.ray``.

    Example:
        >>> model.fit(dataset, epochs=20, callbacks=tfstrategy.preemption_callbacks())
    """
    from tfstrategy.multiworker.worker_protocol import backup_callbacks

    callbacks = backup_callbacks(backup_dir, **options)
    return [*callbacks, preemption_callback()] if callbacks else []
