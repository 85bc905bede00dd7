"""Make ``gradient_accumulation_steps`` train on 2+ replicas, with one device's steps.

The bug (keras-team/keras#20582; TensorFlow 2.21, Keras 3.15.1): ``SGD(gradient_accumulation_steps=2)``
in ``fit`` (or a custom loop) under a MirroredStrategy of 2 replicas raises at the first step:
``RuntimeError: merge_call called while defining a new graph or a tf.function``.

Root cause. ``BaseOptimizer._backend_apply_gradients`` chooses "apply the accumulated step" or "add to
the accumulators" with an ``ops.cond`` in the replica context, and both branches synchronise the
replicas (the apply branch all-reduces the gradients, the add branch updates the accumulators through
``merge_call``). tf.distribute cannot cross replicas from inside control flow of a replica's step.

The fix. On 2+ replicas in sync, with accumulation set, ``TFOptimizer._backend_apply_gradients`` leaves
the replica context first (``merge_call``) and takes the same ``cond`` in the cross-replica context, as
Keras' own ``LossScaleOptimizer`` does for its apply-or-skip: the add branch adds each replica's
gradient to that replica's copy of its accumulator (as Keras' ``_backend_increment_gradient_accumulators``
does from a replica context); the
apply branch runs each replica's ``(gradient + accumulator) / steps`` through Keras' clipping, weight
decay and ``_backend_update_step`` (which all-reduces it: the sum over replicas is one device's
accumulated mean), then zeroes the accumulators. Accumulated per replica, all-reduced once, at apply
time, as one device accumulates and applies. One replica, an optimizer without accumulation, or a call
outside a replica context run Keras' own function unchanged.

Limits. The accumulators hold each replica's own sum between two applied steps, so a checkpoint written
between them keeps the first replica's (the optimizer's weights and step are exact). ``use_ema`` with
accumulation on 2+ replicas is refused (``TrainingError``, while the step is traced, before it runs):
Keras moves the average at every accumulation step, which this fix does not reproduce.

The probe. SGD(1.0, ``gradient_accumulation_steps=2``) applying a gradient in a 2-replica
``MirroredStrategy`` over two devices of this host: Keras' own function raises the ``merge_call``
error. It runs TensorFlow ops, so it waits until an accumulating optimizer first applies gradients on
2+ replicas. The upstream canary ``test_upstream_keras_still_fails_to_accumulate_on_two_replicas`` fails
once Keras' own step runs.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Optimizer, Strategy

TARGET = "backend.tensorflow.optimizer.TFOptimizer._backend_apply_gradients"

#: The probe's own optimizer: Keras' function runs for it as it is (the probe measures that).
_PROBING: weakref.WeakSet[Any] = weakref.WeakSet()


def _apply_accumulated(optimizer: Optimizer, context: Any, grads: list[object], variables: list[object]) -> None:
    """Keras' accumulate-or-apply ``cond``, taken in the cross-replica context (see the module docstring)."""
    tf_ = tf()
    steps = optimizer.gradient_accumulation_steps
    accumulators = _compat.gradient_accumulators(optimizer, variables)

    def replica_apply(local: list[object]) -> None:
        _compat.apply_step(optimizer, [(grad + accumulator) / steps for grad, accumulator in zip(local, accumulators)],
                           variables)

    def cross_replica(distribution: Any, per_replica: list[object]) -> None:
        def apply() -> None:
            distribution.extended.call_for_each_replica(replica_apply, args=(per_replica,))
            _compat.reset_gradient_accumulators(optimizer)

        def accumulate() -> None:
            # Each replica's gradient into that replica's copy of the accumulator (``update`` hands each device its
            # own part), as Keras' ``_backend_increment_gradient_accumulators`` does from a replica context.
            for grad, accumulator in zip(per_replica, accumulators):
                distribution.extended.update(accumulator.value, lambda variable, part: variable.assign_add(part),
                                             args=(grad,), group=False)

        tf_.cond((_compat.optimizer_calls(optimizer) + 1) % steps == 0, apply, accumulate)

    context.merge_call(cross_replica, args=(list(grads),))


class GradientAccumulationPatch(TrainingApiPatch):
    """``gradient_accumulation_steps`` on 2+ replicas: the accumulate-or-apply choice made across replicas."""

    name = "keras_gradient_accumulation"
    change_text = ("gradient_accumulation_steps accumulates per replica and all-reduces at the applied step, "
                   "instead of failing on 2+ replicas (keras#20582)")
    upstream = "keras-team/keras#20582: gradient accumulation raises merge_call errors under a tf.distribute strategy"
    targets = (TARGET,)

    def probe_on(self, strategy: Strategy) -> ProbeResult:
        import keras

        tf_ = tf()
        with strategy.scope():
            weight = keras.Variable([0.0], name="probe_accumulated")
            optimizer = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
            _PROBING.add(optimizer)
            optimizer.build([weight])

        try:
            tf_.function(lambda: strategy.run(lambda: optimizer.apply([tf_.constant([1.0])], [weight])))()
        except RuntimeError as error:
            if "merge_call" not in str(error):
                raise
            return ProbeResult({TARGET: True})
        return ProbeResult({TARGET: False})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def _backend_apply_gradients(optimizer: Optimizer, grads: Any, trainable_variables: Any) -> Any:
            context = tf().distribute.get_replica_context()
            if (not optimizer.gradient_accumulation_steps or context is None or context.num_replicas_in_sync < 2
                    or optimizer in _PROBING or not PATCH.acts_on(context.strategy)):
                return original(optimizer, grads, trainable_variables)
            if optimizer.use_ema:
                raise TrainingError(
                    f"Received {type(optimizer).__name__}(use_ema=True, gradient_accumulation_steps="
                    f"{optimizer.gradient_accumulation_steps}) on {context.num_replicas_in_sync} replicas; Keras cannot "
                    "accumulate on 2+ replicas (keras-team/keras#20582) and tfstrategy's fix does not move the average at "
                    "accumulation steps. Drop use_ema, or gradient_accumulation_steps (raise the batch size instead).")
            PATCH.acted()
            return _apply_accumulated(optimizer, context, list(grads), list(trainable_variables))

        return _backend_apply_gradients


PATCH = GradientAccumulationPatch()
