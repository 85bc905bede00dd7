"""Ray Train: tfstrategy inside a ``TensorflowTrainer``'s training function.

Ray owns the processes, their placement, restarts (``FailureConfig``), logs and
the checkpoints' storage; it writes ``TF_CONFIG`` on every worker. tfstrategy
owns what runs inside a worker: the strategy (:func:`tfstrategy.select` reads
Ray's ``TF_CONFIG``), the Keras fixes it applies, the scope audit and the batch
plan. This module is the seam between the two, and nothing more:

- :func:`prepare` selects, builds the model in scope and, after a restart,
  restores every worker from ``ray.train.get_checkpoint()`` through the
  all-or-nothing restore of :func:`tfstrategy.build_in_scope`;
- :func:`report_epoch` (and the Keras callback :func:`report_callback`) reports
  an epoch's metrics with a checkpoint. Every worker writes the checkpoint,
  because reading a variable synchronised on read is a collective; only the
  chief's copy is handed to Ray, and Ray registers it once every worker has
  reported that epoch. A Ray checkpoint is therefore one committed epoch: the
  same on every worker, never half-written, and the only thing a restarted
  group resumes from.

Under Ray, stopping and restarting workers is Ray's: after a failure the group
restarts from the last committed checkpoint (within ``max_failures``). So
:func:`tfstrategy.preemption_callbacks` is not used there; it refuses to run in
the non-main thread Ray trains in. A SIGTERM sent to one worker process is not
acted on while it trains (Ray handles it in the worker's main thread); its peers
wait for it unless ``collective_timeout`` bounds the wait (none by default: TensorFlow
holds a thread per collective for that long, so keep it for slow steps).

Install with ``pip install 'tfstrategy[ray]'``. Importing tfstrategy never
imports Ray; this module imports it when called.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import CheckpointError, ClusterConfigError, MissingDependencyError
from tfstrategy.multiworker.cluster import load_cluster_config
from tfstrategy.runtime.select import Selection, select
from tfstrategy.scope.build import BuildReport, ModelSource, build_in_scope

if TYPE_CHECKING:
    from tfstrategy._protocols import Logs, Model

__all__ = ["RayRun", "prepare", "report_callback", "report_epoch"]

#: Inside a reported checkpoint directory: the tf.train.Checkpoint's name and tfstrategy's record of it.
CHECKPOINT_PREFIX = "ckpt"
STATE_FILE = "tfstrategy.json"


def _ray_train() -> Any:
    try:
        import ray.train
    except ImportError as error:
        raise MissingDependencyError(
            f"tfstrategy.integrations.ray needs Ray Train, which could not be imported ({error}). "
            "Install it with pip install 'tfstrategy[ray]'."
        ) from error
    return ray.train


def _require_worker(train: Any, name: str) -> None:
    try:
        train.get_context().get_world_rank()
    except Exception as error:  # Ray raises RuntimeError/AttributeError variants outside a worker
        raise ClusterConfigError(
            f"Received a call to tfstrategy.integrations.ray.{name}() outside a Ray Train worker ({error}). "
            "Call it inside the training function passed to ray.train.tensorflow.TensorflowTrainer."
        ) from error


@dataclass(frozen=True, kw_only=True)
class RayRun:
    """What :func:`prepare` made for this worker: the strategy, the model and where training resumes."""

    selection: Selection
    model: Any  # the user's model, all of it (the Model protocol has only what tfstrategy uses)
    build: BuildReport
    #: Epochs already done (pass it to ``fit(initial_epoch=...)``); 0 on a fresh start.
    initial_epoch: int = 0
    #: The Ray checkpoint this worker resumed from, or ``None``.
    resumed_from: str | None = None

    @property
    def strategy(self) -> Any:  # Selection.strategy (see there)
        return self.selection.strategy

    def callback(self) -> object:
        """The Keras callback that reports each epoch with a checkpoint (:func:`report_callback`)."""
        return report_callback()

    def report(self, epoch: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Report ``epoch`` (1-based, epochs done) of a custom loop with a checkpoint (:func:`report_epoch`)."""
        report_epoch(self.model, epoch, metrics)


def _read_state(directory: str, where: str) -> dict[str, Any]:
    path = os.path.join(directory, STATE_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
    except (OSError, ValueError) as error:
        raise CheckpointError(
            f"Received the Ray checkpoint {where!r} without a readable {STATE_FILE} ({error}); expected one "
            "reported by tfstrategy.integrations.ray (report_callback or report_epoch). Restore another "
            "checkpoint yourself with tfstrategy.build_in_scope(checkpoint=...)."
        ) from error
    prefix = state.get("prefix") if isinstance(state, dict) else None
    valid = isinstance(prefix, str) and os.path.basename(prefix) == prefix and prefix not in ("", ".", "..")
    if not valid or not isinstance(state.get("epoch"), int) or not isinstance(state.get("step"), int):
        raise CheckpointError(
            f"Received the Ray checkpoint {where!r} whose {STATE_FILE} is {state!r}; expected "
            '{"epoch": <int>, "step": <int>, "prefix": <file name>}, as report_epoch writes it.'
        )
    return dict(state)


def prepare(
    model: ModelSource,
    *,
    strategy: str | None = None,
    devices: Any = None,
    cpu_replicas: int | None = None,
    collective_timeout: float | str | None = None,
    guard: bool = True,
    **compile_args: Any,
) -> RayRun:
    """Select the strategy, build the model in its scope and resume from Ray's checkpoint: one call per worker.

    Call it first in the training function of a ``TensorflowTrainer``. It runs
    :func:`tfstrategy.select` (MultiWorkerMirroredStrategy over Ray's
    ``TF_CONFIG`` when there are 2+ workers, with the Keras fixes), then
    :func:`tfstrategy.build_in_scope`; when Ray restarted the group, every
    worker restores the same committed checkpoint (``ray.train.get_checkpoint()``),
    all or nothing.

    Args:
        model: a function returning a Keras model, or a ``.keras`` path (as for ``build_in_scope``).
        strategy: passed to :func:`tfstrategy.select`; ``None`` reads ``TFSTRATEGY_STRATEGY``, then ``auto``.
        devices: passed to :func:`tfstrategy.select`.
        cpu_replicas: passed to :func:`tfstrategy.select`. Refused with 2+ Ray workers (each is
            one MultiWorkerMirroredStrategy task on one CPU); with one worker it splits its CPU.
        collective_timeout: passed to :func:`tfstrategy.select`.
        guard: passed to :func:`tfstrategy.build_in_scope`.
        **compile_args: passed to ``model.compile`` in the scope (``optimizer``, ``loss``, ...).

    Returns:
        A :class:`RayRun`; fit with ``initial_epoch=run.initial_epoch`` and ``callbacks=[run.callback()]``.

    Raises:
        MissingDependencyError: Ray Train is not installed.
        ClusterConfigError: called outside a Ray Train worker.
        CheckpointError: Ray's checkpoint is not one tfstrategy reported, or does not match the model.

    Example:
        >>> run = tfstrategy.integrations.ray.prepare(build_model, optimizer="adam", loss="mse")
        >>> run.model.fit(dataset, epochs=5, initial_epoch=run.initial_epoch, callbacks=[run.callback()])
    """
    train = _ray_train()
    _require_worker(train, "prepare")
    selection = select(strategy, devices, cpu_replicas, collective_timeout=collective_timeout)
    checkpoint = train.get_checkpoint()
    if checkpoint is None:
        built, report = build_in_scope(selection, model, guard=guard, **compile_args)
        return RayRun(selection=selection, model=built, build=report)
    with checkpoint.as_directory() as directory:
        state = _read_state(directory, checkpoint.path)
        built, report = build_in_scope(
            selection, model, guard=guard, checkpoint=os.path.join(directory, state["prefix"]), **compile_args
        )
    restored_step = report.restore.step if report.restore else 0
    if restored_step != state["step"]:
        raise CheckpointError(
            f"Received the Ray checkpoint {checkpoint.path!r} recording step {state['step']}, but its "
            f"tf.train.Checkpoint restored step {restored_step}; its files were changed after it was reported. "
            "Resume from another checkpoint (RunConfig(storage_path=...)) or start afresh."
        )
    return RayRun(
        selection=selection, model=built, build=report, initial_epoch=state["epoch"], resumed_from=checkpoint.path
    )


def _metrics(epoch: int, step: int, metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in (metrics or {}).items():
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            values[name] = value
    return {**values, "epoch": epoch, "step": step}


def report_epoch(model: Model, epoch: int, metrics: Mapping[str, Any] | None = None) -> None:
    """Report ``metrics`` with a checkpoint of ``model`` after ``epoch`` epochs; call it on every worker.

    Every worker writes a ``tf.train.Checkpoint`` of the model and its optimizer
    (the collectives of a multi-worker read must match); the chief's goes to
    Ray (``ray.train.report``), the others' are deleted. Ray keeps it once
    every worker has reported this epoch.

    Args:
        model: the compiled Keras model (``RayRun.model``).
        epoch: epochs done, 1-based: a restart resumes with ``initial_epoch=epoch``.
        metrics: numbers to report (a Keras ``logs`` dict); ``epoch`` and ``step`` are added.

    Raises:
        MissingDependencyError: Ray Train is not installed.
        ClusterConfigError: called outside a Ray Train worker.
    """
    train = _ray_train()
    _require_worker(train, "report_epoch")
    config = load_cluster_config()
    chief = config is None or config.is_chief
    step = int(model.optimizer.iterations.numpy())
    directory = tempfile.mkdtemp(prefix="tfstrategy-ray-")
    try:
        # save(), not write(): its save_counter is what build_in_scope's restore expects to find.
        saved = tf().train.Checkpoint(model=model, optimizer=model.optimizer).save(
            os.path.join(directory, CHECKPOINT_PREFIX)
        )
        if chief:
            with open(os.path.join(directory, STATE_FILE), "w", encoding="utf-8") as handle:
                json.dump({"epoch": int(epoch), "step": step, "prefix": os.path.basename(saved)}, handle)
        checkpoint = train.Checkpoint.from_directory(directory) if chief else None
        train.report(_metrics(int(epoch), step, metrics), checkpoint=checkpoint)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def report_callback() -> object:
    """A Keras callback that calls :func:`report_epoch` at the end of every epoch.

    Example:
        >>> model.fit(dataset, epochs=5, initial_epoch=run.initial_epoch, callbacks=[report_callback()])
    """
    keras = _compat.keras_for()

    class RayReport(keras.callbacks.Callback):  # type: ignore[name-defined]  # an untyped TensorFlow/Keras class
        """Reports each epoch's logs to Ray Train with a checkpoint (the chief's)."""

        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            report_epoch(self.model, epoch + 1, logs)

    return RayReport()
