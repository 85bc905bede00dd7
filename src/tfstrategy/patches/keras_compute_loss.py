"""Make a custom ``train_step``/``test_step``'s ``compute_loss`` report the loss one device reports.

The bug (TensorFlow 2.21, Keras 3.15.1; the tf.keras form is keras-team/keras#16285, "distributed
training with tensorflow on 'x' gpu makes loss 1/x"): a ``train_step`` and ``test_step`` written as
keras.io's "Customizing what happens in fit()" guide writes them (``loss = self.compute_loss(...)``,
``self.loss_tracker.update_state(loss)``), under a MirroredStrategy of 2 replicas: the loss in History
and ``evaluate`` is exactly half of one device's (3.848 vs 7.696). The weights and the other metrics
are right.

Root cause. Keras divides each replica's loss by the replica count where it reduces it
(``losses.loss.reduce_values`` calls ``scale_loss_for_distribution``), so that the all-reduce, which
sums the replicas' gradients, sums to the gradient of the global mean. ``compute_loss`` returns that
scaled value. Keras' own ``train_step``/``test_step`` multiply it back before their loss tracker sees it
(``unscale_loss_for_distribution``); the guide's step cannot know it has to, and its tracker averages
the scaled values.

The fix. ``Trainer.compute_loss``, called by a model whose class overrides ``train_step`` or
``test_step``, in a replica context of 2+ replicas, and not from Keras' own steps (which reach it
through ``Trainer._compute_loss``, and unscale themselves), returns a tensor whose *value* is the
unscaled loss (this replica's mean, as Keras' own tracker receives it) and whose *gradient* is the scaled
loss's: ``stop_gradient(unscaled) + (scaled - stop_gradient(scaled))``. The gradient reaching the
weights is the same, bit for bit (the added term's gradient is 1), so the step is Keras' own; only the
reported number changes. One replica, Keras' own steps, and a model that keeps Keras' steps get Keras'
function unchanged. A ``compute_loss`` call from a custom ``strategy.run`` loop on a model that also
overrides ``train_step`` gets the unscaled value too: sum the replicas' values there with ``MEAN``.

The probe. Keras' own ``compute_loss`` of a squared error of 4, inside ``strategy.run`` of a 2-replica
``MirroredStrategy`` over two devices of this host: the bug returns 2. It runs TensorFlow ops, so it
waits until a custom step first computes a loss on 2+ replicas. The upstream canary
``test_upstream_keras_still_returns_the_scaled_loss`` fails once Keras fixes it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

COMPUTE_LOSS = "trainers.trainer.Trainer.compute_loss"
KERAS_STEPS_CALL = "trainers.trainer.Trainer._compute_loss"

#: How deep this thread is in Keras' own ``_compute_loss`` (its steps' call, which unscales by itself).
_KERAS_OWN = threading.local()


def _inside_keras_steps() -> bool:
    return bool(getattr(_KERAS_OWN, "depth", 0))


def overrides_a_step(model: Model) -> bool:
    """Whether ``model``'s class has a ``train_step`` or ``test_step`` of its own (not Keras' TensorFlow trainer's)."""
    trainer = _compat.keras3_tensorflow_trainer()
    if trainer is None:
        return False
    keras_trainer = trainer.TensorFlowTrainer
    return any(getattr(type(model), step, None) is not getattr(keras_trainer, step, None)
               for step in ("train_step", "test_step"))


def reported_loss(scaled: Any, replicas: int) -> object:
    """The unscaled value of ``scaled``, with ``scaled``'s gradient (exactly: the added term's gradient is 1)."""
    tf_ = tf()
    unscaled = scaled * tf_.cast(replicas, scaled.dtype)
    return tf_.stop_gradient(unscaled) + (scaled - tf_.stop_gradient(scaled))


class ComputeLossPatch(TrainingApiPatch):
    """A custom step's ``compute_loss`` reports the unscaled loss, with the same gradient."""

    name = "keras_compute_loss"
    change_text = ("a custom train_step/test_step's compute_loss reports the loss one device reports, not the loss "
                   "divided by the replica count (keras#16285); its gradients are unchanged")
    upstream = "keras-team/keras#16285: custom train_step on x replicas reports the loss / x"
    targets = (COMPUTE_LOSS, KERAS_STEPS_CALL)

    def probe_on(self, strategy: Strategy) -> ProbeResult:
        import keras

        tf_ = tf()
        with strategy.scope():
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        compute_loss = self.original(COMPUTE_LOSS)

        losses = tf_.function(
            lambda: strategy.run(lambda: compute_loss(model, y=tf_.ones((1, 1)), y_pred=tf_.fill((1, 1), 3.0))))
        values = {round(float(value), 4) for value in strategy.experimental_local_results(losses())}
        if values not in ({4.0}, {2.0}):
            raise RuntimeError(f"the probe's squared error of 4 was reported as {sorted(values)}, expected 4 or 2")
        return ProbeResult({COMPUTE_LOSS: values == {2.0}, KERAS_STEPS_CALL: values == {2.0}})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        if target == KERAS_STEPS_CALL:
            @functools.wraps(original)
            def _compute_loss(model: Model, *args: object, **kwargs: object) -> object:
                _KERAS_OWN.depth = getattr(_KERAS_OWN, "depth", 0) + 1
                try:
                    return original(model, *args, **kwargs)
                finally:
                    _KERAS_OWN.depth -= 1

            return _compute_loss

        @functools.wraps(original)
        def compute_loss(model: Model, *args: object, **kwargs: object) -> object:
            loss = original(model, *args, **kwargs)
            context = tf().distribute.get_replica_context()
            if (loss is None or _inside_keras_steps() or context is None or context.num_replicas_in_sync < 2
                    or not overrides_a_step(model) or not PATCH.acts_on(context.strategy)):
                return loss
            PATCH.acted()
            return reported_loss(loss, context.num_replicas_in_sync)

        return compute_loss


PATCH = ComputeLossPatch()
