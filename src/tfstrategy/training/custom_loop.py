"""A custom training loop step that gives the same answer on 1 or N replicas.

The how-to's step 4 ends with "custom training loops need additional
``strategy.run()`` handling". The handling is about *scale*: each replica sees
``global_batch / N`` examples, and the optimizer *sums* the replicas'
gradients. So each replica must divide its summed per-example loss by the
**global** batch (``tf.nn.compute_average_loss(..., global_batch_size=...)``),
and regularisation losses, added once per replica, by N
(``tf.nn.scale_regularization_loss``). A loss that averages over the replica's
own batch (Keras' default ``sum_over_batch_size``, tf.keras' ``AUTO``) gives
gradients N times too large: the run silently diverges from 1 replica.
:func:`make_train_step` builds the step that gets this right and refuses such
losses up front.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfstrategy._tf import tf
from tfstrategy.errors import BatchError, LossReductionError, TrainingError
from tfstrategy.training.batching import BatchPlan, replicas_of
from tfstrategy.training.precision import require_loss_scaling
from tfstrategy.training.sentinel import Sentinel, resolve_sentinel

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset, Model, Optimizer, Strategy

__all__ = ["TrainStep", "make_train_step"]

#: Reductions that keep one loss per example, so the step can weight them and
#: divide by the global batch itself.
_PER_EXAMPLE_REDUCTIONS = (None, "none")


def _loss_name(loss: Any) -> str:
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__


def resolve_loss(loss: Any) -> Callable[..., object]:
    """Turn a loss (object, function or Keras name) into a per-example loss function.

    Raises:
        LossReductionError: the loss averages over the batch itself.
    """
    keras = tf().keras
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if not callable(loss):
        raise LossReductionError(
            f"Received loss={loss!r}; expected a Keras loss with reduction='none', a function returning one loss per "
            "example, or a Keras loss name such as 'mse'."
        )
    if hasattr(loss, "reduction"):
        reduction = loss.reduction
        text = getattr(reduction, "value", reduction)
        text = text.lower() if isinstance(text, str) else text
        if text not in _PER_EXAMPLE_REDUCTIONS:
            if text == "sum":
                why = "it sums over each replica's batch, leaving no per-example losses to weight and divide by the global batch."
            else:
                why = (
                    "under a distribution strategy it averages over each replica's own batch, and the optimizer "
                    "then sums the replicas' gradients, so updates come out N times too large for N replicas."
                )
            raise LossReductionError(
                f"Received loss {_loss_name(loss)} with reduction={text!r}; expected reduction='none', because {why} "
                f"Pass {type(loss).__name__}(reduction='none'): make_train_step divides by the global batch itself."
            )
    resolved: Callable[..., object] = loss
    return resolved


def _per_example(loss_fn: Callable[..., Any], labels: Any, predictions: Any, name: str) -> Any:
    values = loss_fn(labels, predictions)
    if values.shape.rank == 0:
        raise LossReductionError(
            f"Received loss {name}, which returned a scalar; expected one loss per example (shape [batch]). A "
            "scalar is usually a per-replica mean, which makes updates N times too large for N replicas. "
            "Return the per-example losses and let make_train_step average over the global batch."
        )
    return values


class TrainStep:
    """A distributed training step: call it with one batch from a distributed dataset.

    Built by :func:`make_train_step`; returns ``{"loss": ..., <metric>: ...}``
    where the loss is the global-batch mean (plus regularisation) and each
    metric is reduced over all replicas.
    """

    def __init__(
        self,
        model: Model,
        *,
        strategy: Strategy,
        global_batch: int,
        loss: Callable[..., object],
        optimizer: Optimizer,
        metrics: Sequence[Any],
        sentinel: Any = None,
        report: Any = None,
    ) -> None:
        self.model = model
        #: A :class:`~tfstrategy.performance.report.Tracker` timing each run_epoch's steps, or None.
        self.report = report
        #: A :class:`~tfstrategy.training.sentinel.Sentinel` checked at each run_epoch's end, or None.
        self.sentinel = sentinel
        self.strategy = strategy
        self.global_batch = global_batch
        self.loss = loss
        self.optimizer = optimizer
        self.metrics = list(metrics)
        #: How the loss is scaled for mixed precision (see tfstrategy.training.precision.loss_scaling).
        self.loss_scaling = require_loss_scaling(model, optimizer)
        # No autograph: the step has no tensor-dependent Python control flow,
        # and autograph would wrap our errors in its StagingError.
        self._function = tf().function(self._distributed_step, autograph=False)

    def _replica_step(self, batch: Any) -> Any:
        tf_ = tf()
        features, labels, weights = (tuple(batch) + (None,))[:3] if isinstance(batch, (tuple, list)) else (batch, None, None)
        if labels is None:
            raise BatchError("Received batches without labels; expected (features, labels) or (features, labels, sample_weight).")
        with tf_.GradientTape() as tape:
            predictions = self.model(features, training=True)
            per_example = _per_example(self.loss, labels, predictions, _loss_name(self.loss))
            if per_example.dtype != tf_.float32 and per_example.dtype.is_floating:
                # A half-precision loss would sum the global batch in 3 digits.
                per_example = tf_.cast(per_example, tf_.float32)
            # Divide by the *global* batch: the optimizer sums the replicas' gradients.
            loss = tf_.nn.compute_average_loss(per_example, sample_weight=weights, global_batch_size=self.global_batch)
            if self.model.losses:
                # Regularisation is added once per replica, so divide it by the replicas.
                regularisation = tf_.add_n([tf_.cast(value, tf_.float32) for value in self.model.losses])
                loss += tf_.nn.scale_regularization_loss(regularisation)
            # Mixed precision: scale inside the tape, so the float16 gradients do not underflow.
            if self.loss_scaling == "tf_keras":
                scaled = self.optimizer.get_scaled_loss(loss)
            elif self.loss_scaling == "keras3":
                scaled = self.optimizer.scale_loss(loss)  # its apply() divides the gradients back
            else:
                scaled = loss
        variables = self.model.trainable_variables
        gradients = tape.gradient(scaled, variables)
        if self.loss_scaling == "tf_keras":
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(zip(gradients, variables))
        for metric in self.metrics:
            metric.update_state(labels, predictions, sample_weight=weights)
        return loss

    def _distributed_step(self, batch: Any) -> dict[str, Any]:
        per_replica = self.strategy.run(self._replica_step, args=(batch,))
        logs = {"loss": self.strategy.reduce(tf().distribute.ReduceOp.SUM, per_replica, axis=None)}
        # Metric variables sum over replicas when read here, in cross-replica context.
        logs.update({metric.name: metric.result() for metric in self.metrics})
        return logs

    def __call__(self, batch: Any) -> dict[str, Any]:
        logs: dict[str, Any] = self._function(batch)
        return logs

    def reset_metrics(self) -> None:
        """Reset every metric, e.g. at the start of an epoch."""
        for metric in self.metrics:
            metric.reset_state()

    def backup(self, backup_dir: str | os.PathLike[str] | None = None, *, save_freq: Any = "epoch",
               delete_at_finish: bool = True) -> Any:
        """Coordinated backups for this loop: every worker resumes from the newest step all of them saved.

        Args:
            backup_dir: the job's backup directory; defaults to ``TFSTRATEGY_BACKUP_DIR`` (set by
                ``tfstrategy launch``); without either, the returned object does nothing.
            save_freq: ``"epoch"`` or a number of batches.
            delete_at_finish: remove the backup when ``finish()`` is called.

        Returns:
            A :class:`~tfstrategy.multiworker.backups.LoopBackup`.

        Raises:
            TrainingError: the model was not compiled with this step's optimizer, so a backup
                would miss the optimizer's state.

        Example:
            >>> backup = step.backup()
            >>> start = backup.restore()
            >>> for epoch in range(start.epoch, epochs):
            ...     for batch, data in enumerate(dist_dataset):
            ...         if not start.done(epoch, batch):
            ...             step(data)
            ...             backup.batch_done(epoch, batch)
            ...     backup.epoch_done(epoch)
            >>> backup.finish()
        """
        from tfstrategy.multiworker.backups import LoopBackup
        from tfstrategy.settings import BACKUP_DIR

        base = backup_dir if backup_dir is not None else BACKUP_DIR.text(os.environ)
        if base is not None and getattr(self.model, "optimizer", None) is not self.optimizer:
            raise TrainingError(
                f"Received a model whose optimizer is {type(getattr(self.model, 'optimizer', None)).__name__}, not this "
                f"step's {type(self.optimizer).__name__}; a backup holds the model's optimizer state. Call "
                "model.compile(optimizer=optimizer) in the scope before make_train_step."
            )
        return LoopBackup(self.model, strategy=self.strategy, backup_dir=base, save_freq=save_freq,
                          delete_at_finish=delete_at_finish)

    def run_epoch(self, dataset: Dataset, steps: int | None = None) -> dict[str, float]:
        """Run one pass (or ``steps`` steps) over a distributed dataset; return the last logs as floats."""
        self.reset_metrics()
        logs: dict[str, Any] = {}
        batches = self.report.steps(dataset) if self.report is not None else dataset
        for index, batch in enumerate(batches):
            if steps is not None and index >= steps:
                break
            logs = self(batch)
        result = {name: float(value) for name, value in logs.items()}
        if self.sentinel is not None:
            self.sentinel.check(step=int(self.optimizer.iterations.numpy()), loss=result.get("loss"))
        if self.report is not None and self.report.due(self.strategy, final=True):
            self.report.report(self.model, None, global_batch=self.global_batch, steps_per_execution=1,
                               step_function=self._function)
        return result


def _build_optimizer(optimizer: Optimizer, model: Model, strategy: Strategy) -> None:
    """Create an unbuilt optimizer's slot variables now, in the scope.

    Keras optimizers build lazily on the first ``apply_gradients``; in a custom
    loop that is inside ``strategy.run``, where on 2+ replicas the tutorial's Adam
    fails with "You must feed a value for placeholder tensor" (TF 2.21, Keras 3.15).
    """
    if getattr(optimizer, "built", True) or not hasattr(optimizer, "build"):
        return
    variables = list(getattr(model, "trainable_variables", None) or [])
    if not variables:
        raise TrainingError(
            f"Received optimizer {type(optimizer).__name__} that is not built yet and model "
            f"{getattr(model, 'name', type(model).__name__)!r} with no variables to build it for; expected a built model. "
            "Give the model its input shape (keras.Input(shape=...)) or call model.build(shape) in the scope first."
        )
    with strategy.scope():
        optimizer.build(variables)


def make_train_step(
    model: Model,
    *,
    strategy: Strategy,
    global_batch: int | BatchPlan,
    loss: Any,
    optimizer: Optimizer | None = None,
    metrics: Sequence[object] = (),
    sentinel: bool | None = None,
    report: bool | None = None,
) -> TrainStep:
    """Build a custom-loop training step that matches 1-replica training on N replicas.

    Under mixed precision (``precision="mixed_float16"``) pass a
    ``LossScaleOptimizer``: the step scales the loss before the gradient
    (Keras 3's ``scale_loss``; tf_keras' ``get_scaled_loss`` and
    ``get_unscaled_gradients``). Create ``model``, ``optimizer`` and ``metrics`` inside ``strategy.scope()``
    first; metric names (``"mae"``) are created here, inside it, and an optimizer
    not built yet is built here, in the scope, for the model's trainable variables.

    Args:
        model: a Keras model built in the strategy's scope.
        strategy: a strategy or a :class:`~tfstrategy.Selection`.
        global_batch: the global batch, or the :class:`BatchPlan` of the data.
        loss: a Keras loss with ``reduction="none"``, a function returning one
            loss per example, or a Keras loss name (``"mse"``).
        optimizer: defaults to ``model.optimizer``.
        metrics: Keras metric objects or names.
        sentinel: check at the end of each :meth:`TrainStep.run_epoch` that all
            replicas hold the same finite weights (``TFSTRATEGY_SENTINEL``;
            :class:`~tfstrategy.training.sentinel.Sentinel`). Call
            ``step.sentinel.check(step=...)`` yourself in a loop of your own.
        report: time each :meth:`TrainStep.run_epoch`'s steps and report where their time goes
            (input, reduction, compute; :mod:`tfstrategy.performance`) after the first epoch and
            every 10 minutes; default: on under ``tfstrategy run/launch --profile``
            (``TFSTRATEGY_PROFILE``). In a loop of your own, iterate ``step.report.steps(batches)``
            and call ``step.report.report(model, None, global_batch=...)`` when ``step.report.due(...)``.

    Raises:
        LossReductionError: the loss averages per replica (``AUTO`` /
            ``SUM_OVER_BATCH_SIZE``), which scales gradients by the replicas.
        BatchError: the global batch does not fit the strategy.
        TrainingError: no optimizer, an unbuilt one for a model without variables,
            or a model computing in float16 with an optimizer that does not
            scale the loss (pass a ``LossScaleOptimizer``).

    Example:
        >>> with strategy.scope():
        ...     model, optimizer = build_model(), keras.optimizers.SGD(0.01)
        >>> step = make_train_step(model, strategy=strategy, global_batch=256, loss="mse", optimizer=optimizer)
        >>> for batch in strategy.experimental_distribute_dataset(train_ds):
        ...     logs = step(batch)
    """
    strategy = getattr(strategy, "strategy", strategy)
    replicas = replicas_of(strategy)
    if isinstance(global_batch, BatchPlan):
        if global_batch.replicas != replicas:
            raise BatchError(
                f"Received a batch plan for {global_batch.replicas} replicas with a strategy of {replicas}; "
                "expected the same. Make the plan with this strategy."
            )
        global_batch = global_batch.global_batch
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < replicas or global_batch % replicas:
        raise BatchError(
            f"Received global_batch={global_batch!r} for {replicas} replicas; expected a multiple of {replicas}, "
            "the batch of one step across all replicas. Use tfstrategy.plan_batch to choose it."
        )
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if optimizer is None:
        raise TrainingError(
            "Received no optimizer and a model that was not compiled; expected optimizer=... created in the "
            "strategy's scope (e.g. keras.optimizers.SGD(0.01))."
        )
    _build_optimizer(optimizer, model, strategy)
    keras = tf().keras
    built: list[object] = []
    with strategy.scope():
        for metric in metrics:
            if isinstance(metric, str):
                # Named as given ("mae"), like the logs of Keras' compile(metrics=[...]).
                found = keras.metrics.get(metric)
                if isinstance(found, keras.metrics.Metric):
                    metric = type(found).from_config({**found.get_config(), "name": metric})
                else:
                    metric = keras.metrics.MeanMetricWrapper(found, name=metric)
            built.append(metric)
    watch = Sentinel(strategy, model.weights) if resolve_sentinel(sentinel) else None
    return TrainStep(model, strategy=strategy, global_batch=global_batch, loss=resolve_loss(loss), optimizer=optimizer,
                     metrics=built, sentinel=watch, report=_tracker(report))


def _tracker(report: bool | None) -> object:
    from tfstrategy.performance.environment import tracker_from_environment

    settings = tracker_from_environment()
    if report is False or (report is None and settings is None):
        return None
    from tfstrategy.performance.report import Tracker  # the report's probes load only when it is wanted

    return Tracker(**(settings or {}))
