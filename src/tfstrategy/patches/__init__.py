"""Workarounds for upstream Keras bugs that break distributed training, all of one shape.

Each module here holds one :class:`~tfstrategy.patches.mechanism.Patch` with
its bug's root cause written out: :mod:`~tfstrategy.patches.keras_mwms` (Keras 3
``fit`` on a multi-worker MultiWorkerMirroredStrategy),
:mod:`~tfstrategy.patches.keras_steps_per_execution` (``steps_per_execution > 1``
on 2+ replicas), :mod:`~tfstrategy.patches.keras_chief_files` (Keras' file
writers on every worker of a multi-worker job: only the chief writes the path),
:mod:`~tfstrategy.patches.keras_end_of_data` (an optimizer step counted past the
end of data of unknown size) and :mod:`~tfstrategy.patches.keras_loss_scale`
(``LossScaleOptimizer`` applying a step that overflowed on another replica) and
:mod:`~tfstrategy.patches.keras_uneven_batches` (each replica's loss weighted by
its share of an uneven batch) and :mod:`~tfstrategy.patches.keras_lazy_optimizer`
(optimizer variables created outside the traced step, keras-team/keras#23087) and
:mod:`~tfstrategy.patches.keras_loss_scale_api` (Keras 2's ``get_scaled_loss``/``get_unscaled_gradients``;
no step from gradients of an unscaled loss) and :mod:`~tfstrategy.patches.keras_legacy_optimizers`
(``tf.keras.optimizers.legacy.SGD``/``Adam`` as Keras 3's) and
:mod:`~tfstrategy.patches.keras_compile_scope` (``compile()`` outside the scope runs in the model's) and
:mod:`~tfstrategy.patches.keras_jit_compile` (``jit_compile=True`` on 2+ local replicas: XLA off, in one line) and
:mod:`~tfstrategy.patches.keras_predict_on_batch` (``predict_on_batch`` split over the replicas) and
:mod:`~tfstrategy.patches.keras_compute_loss` (a custom step's ``compute_loss`` reports one device's loss, keras-team/keras#16285) and
:mod:`~tfstrategy.patches.keras_clipping` (``clipnorm``/``global_clipnorm``/``clipvalue`` clip the summed gradient) and
:mod:`~tfstrategy.patches.keras_gradient_accumulation` (``gradient_accumulation_steps`` on 2+ replicas, keras-team/keras#20582) and
:mod:`~tfstrategy.patches.keras_replica_seeds` (random layers draw other numbers on each replica) and
:mod:`~tfstrategy.patches.keras_stateful_rnn` (a stateful RNN on 2+ replicas refused in one line) and
:mod:`~tfstrategy.patches.keras_generator_peek` (``fit`` on a Python generator under a strategy skips no batch) and
:mod:`~tfstrategy.patches.keras_batch_norm_statistics` (``BatchNormalization``'s moving statistics one value on
every replica) and :mod:`~tfstrategy.patches.keras_cross_replica_loss` (a loss object called in a strategy's scope,
outside ``strategy.run``, returns one device's loss).
:func:`apply_patches` is what ``tfstrategy.select`` and the start-up hook call;
:func:`patch_status` reports each one, and every other replacement of upstream
code installed in this process (the start-up hook's rewrites, instance overrides:
see :mod:`tfstrategy.runtime`); ``tfstrategy env`` prints it.

Example:
    >>> for status in apply_patches():
    ...     print(status.line())
    keras_mwms: installed (TensorFlowTrainer._maybe_symbolic_build, reduce_per_replica); keras 3.15.1
    keras_steps_per_execution: installed (TensorFlowTrainer._make_function); keras 3.15.1; probes when a model first needs it
    keras_chief_files: installed (saving.saving_lib.save_model, ...); keras 3.15.1
    keras_end_of_data: installed (TensorFlowTrainer.make_train_function); keras 3.15.1; probes when a model first needs it
    keras_loss_scale: installed (LossScaleOptimizer.check_finite); keras 3.15.1; probes when a model first needs it
    keras_uneven_batches: installed (backend.tensorflow.trainer.TensorFlowTrainer.train_step, ...); keras 3.15.1; probes when a model first needs it
    keras_lazy_optimizer: installed (TFOptimizer.add_variable); keras 3.15.1; probes when a model first needs it
    keras_loss_scale_api: installed (LossScaleOptimizer.get_scaled_loss, ...); keras 3.15.1
    keras_legacy_optimizers: installed (keras.SGD, ...); keras 3.15.1
    keras_compile_scope: installed (Trainer.compile); keras 3.15.1; probes when a model first needs it
    keras_jit_compile: installed (Trainer.jit_compile); keras 3.15.1; probes when a model first needs it
    keras_predict_on_batch: installed (backend.tensorflow.trainer.TensorFlowTrainer.predict_on_batch); keras 3.15.1; probes when a model first needs it
    keras_compute_loss: installed (trainers.trainer.Trainer.compute_loss, ...); keras 3.15.1; probes when a model first needs it
    keras_clipping: installed (optimizers.base_optimizer.BaseOptimizer._clip_gradients, ...); keras 3.15.1; probes when a model first needs it
    keras_gradient_accumulation: installed (backend.tensorflow.optimizer.TFOptimizer._backend_apply_gradients); keras 3.15.1; probes when a model first needs it
    keras_replica_seeds: installed (backend.tensorflow.random.draw_seed, ...); keras 3.15.1; probes when a model first needs it
    keras_stateful_rnn: installed (layers.rnn.rnn.RNN.call); keras 3.15.1; probes when a model first needs it
    keras_generator_peek: installed (models.model.Model._maybe_symbolic_build); keras 3.15.1; probes when a model first needs it
    keras_batch_norm_statistics: installed (layers.normalization.batch_normalization.BatchNormalization.add_weight); keras 3.15.1; probes when a model first needs it
    keras_cross_replica_loss: installed (losses.loss.scale_loss_for_distribution, ...); keras 3.15.1; probes when a model first needs it
"""

from __future__ import annotations

from tfstrategy.patches import (
    keras_batch_norm_statistics,
    keras_chief_files,
    keras_clipping,
    keras_compile_scope,
    keras_compute_loss,
    keras_cross_replica_loss,
    keras_end_of_data,
    keras_generator_peek,
    keras_gradient_accumulation,
    keras_jit_compile,
    keras_lazy_optimizer,
    keras_legacy_optimizers,
    keras_loss_scale,
    keras_loss_scale_api,
    keras_mwms,
    keras_predict_on_batch,
    keras_replica_seeds,
    keras_stateful_rnn,
    keras_steps_per_execution,
    keras_uneven_batches,
)
from tfstrategy.patches.mechanism import Patch, PatchStatus
from tfstrategy.state.registry import RUNTIME

#: Every patch, by name, in the order they are applied.
PATCHES: dict[str, Patch] = {
    keras_mwms.PATCH.name: keras_mwms.PATCH,
    keras_steps_per_execution.PATCH.name: keras_steps_per_execution.PATCH,
    keras_chief_files.PATCH.name: keras_chief_files.PATCH,
    keras_end_of_data.PATCH.name: keras_end_of_data.PATCH,
    keras_loss_scale.PATCH.name: keras_loss_scale.PATCH,
    keras_uneven_batches.PATCH.name: keras_uneven_batches.PATCH,
    keras_lazy_optimizer.PATCH.name: keras_lazy_optimizer.PATCH,
    keras_loss_scale_api.PATCH.name: keras_loss_scale_api.PATCH,
    keras_legacy_optimizers.PATCH.name: keras_legacy_optimizers.PATCH,
    keras_compile_scope.PATCH.name: keras_compile_scope.PATCH,
    keras_jit_compile.PATCH.name: keras_jit_compile.PATCH,
    keras_predict_on_batch.PATCH.name: keras_predict_on_batch.PATCH,
    keras_compute_loss.PATCH.name: keras_compute_loss.PATCH,
    keras_clipping.PATCH.name: keras_clipping.PATCH,
    keras_gradient_accumulation.PATCH.name: keras_gradient_accumulation.PATCH,
    keras_replica_seeds.PATCH.name: keras_replica_seeds.PATCH,
    keras_stateful_rnn.PATCH.name: keras_stateful_rnn.PATCH,
    keras_generator_peek.PATCH.name: keras_generator_peek.PATCH,
    keras_batch_norm_statistics.PATCH.name: keras_batch_norm_statistics.PATCH,
    keras_cross_replica_loss.PATCH.name: keras_cross_replica_loss.PATCH,
}


#: The plan step that installs the workarounds (:class:`tfstrategy.runtime.steps.ApplyPatches`).
APPLY_STEP = "apply_patches"


def apply_patches(*names: str) -> tuple[PatchStatus, ...]:
    """Install every workaround the installed Keras needs, or only those ``names`` (process-wide, idempotent).

    The one way a workaround is installed: code that needs one fix before a plan took its ``apply_patches``
    step, or without a plan (a strategy the script built itself, a second job after ``reset()``), calls this
    with its name, so the fix is counted as that step's wherever it was installed from: ``tfstrategy env``, the
    exit summary and the step's undo see it with the others, and ``reset()`` removes it.

    Never raises because of the library: a patch whose probe fails warns once
    and leaves Keras alone. A tf_keras (``TF_USE_LEGACY_KERAS=1``) process gets
    no patch, as tf_keras has none of these bugs.

    Returns:
        The status of each patch asked for, in the order asked (all of them: :data:`PATCHES` order).
    """
    chosen = [PATCHES[name] for name in names] if names else list(PATCHES.values())
    with RUNTIME.taking(APPLY_STEP):
        return tuple(patch.apply() for patch in chosen)


def patch_status() -> tuple[PatchStatus, ...]:
    """What each patch found and installed so far, then every other replacement installed in this process.

    No probing, no installing. The others are the start-up hook's rewrites and the
    overrides of one object's attribute (:meth:`tfstrategy.state.ProcessRuntime.override_attribute`).
    """
    others = tuple(item.status() for item in RUNTIME.replacements() if item.name not in PATCHES)
    return tuple(patch.status() for patch in PATCHES.values()) + others


def _forget_probes() -> None:
    for patch in PATCHES.values():
        patch.remove()
        patch.forget()


RUNTIME.own_state("patches: probe results", _forget_probes)
