"""Keep one value of ``BatchNormalization``'s moving statistics on every replica, as Keras' docs say it is.

The bug (TensorFlow 2.21, Keras 3.15.1; no Keras 3 report found; tensorflow/tensorflow#46488 reported the symptom,
a saved model predicting other numbers than the model in memory, against tf.keras 2.3): ``BatchNormalization()`` (the default,
``synchronized=False``) trained by ``fit`` under a MirroredStrategy of 2 replicas. No error. Each replica's copy
of ``moving_mean`` and ``moving_variance`` moves by its own part of the batch only, so the copies drift apart
(measured: 0.16 after 2 epochs of 4 batches); ``get_weights`` and a saved model hold replica 0's copy, while
``predict`` normalizes the examples replica 1 gets by replica 1's copy: the model in memory predicts other
numbers (up to 2.3 away) than the one saved, and than one device normalizing each replica's examples by their
own statistics (the documented behaviour, whose moving statistics move by the replicas' mean statistics).

Root cause. Keras 3 creates the moving statistics with ``add_weight`` and no ``aggregation``, so TensorFlow makes
them ``MirroredVariable``\\ s of ``VariableAggregation.NONE``; an ``assign`` in a replica context then writes only
the replica's own copy (``values._on_write_update_replica``). tf.keras made them ``ON_READ`` with ``MEAN``, so what it
saved was the replicas' mean.

The fix. ``add_weight`` of a ``BatchNormalization`` (or a subclass) with ``synchronized=False``, for its moving
statistics (``moving_mean``, ``moving_variance``; with ``renorm``, ``moving_stddev``, ``renorm_mean``,
``renorm_stddev``), made while the current strategy has 2+ replicas in sync, passes ``aggregation="mean"``: each
update in a replica context then writes the replicas' mean of their new values to every copy (one all-reduce per
variable and step). As the update is linear in the batch statistics, that mean is exactly the documented moving
statistics. Training's normalization (each replica by its own batch) is unchanged. One device (the default
strategy, any strategy of 1 replica), ``synchronized=True`` (its statistics are already the same on every
replica) and every other weight get Keras' own variables, bit for bit.

What it costs. Each update is a synchronisation point (``merge_call``) on MirroredStrategy, like the gradients'
all-reduce, which TensorFlow does not allow inside a ``tf.cond`` or ``tf.while_loop`` *inside* the function
given to ``strategy.run`` (nor for ``synchronized=True`` or an optimizer step there). Such a layer trained there
(plain Keras runs it, with the drift) is refused in one line, a ``TrainingError`` raised while the step is traced
(``BatchNormalization.call`` turns TensorFlow's "`merge_call` called while defining a new graph" of a layer this
fix made into it): call the layer outside the ``tf.cond``/``tf.while_loop``, normalize there with
``LayerNormalization``, or train on one device. ``fit``, ``steps_per_execution`` and a custom loop calling the
model in ``strategy.run`` are unaffected.

The probe. Keras' own ``BatchNormalization.build`` (with Keras' own ``add_weight``) in the scope of a 2-replica
``MirroredStrategy`` over two devices of this host, one training call per replica on different rows inside
``strategy.run``: the bug leaves the replicas' copies of the moving mean different. It runs TensorFlow ops, so it
waits until a model first builds such a layer on 2+ replicas. The upstream canary
``test_upstream_keras_still_lets_the_moving_statistics_drift`` fails once the copies stay one value.
"""

from __future__ import annotations

import functools
from typing import Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

TARGET = "layers.normalization.batch_normalization.BatchNormalization.add_weight"
#: Where a synchronisation TensorFlow refuses (inside control flow in ``strategy.run``) becomes a one-line refusal.
CALL = "layers.normalization.batch_normalization.BatchNormalization.call"

#: The weights Keras' ``BatchNormalization.build`` creates and its ``call`` moves in a replica context.
MOVING_STATISTICS = frozenset({"moving_mean", "moving_variance", "moving_stddev", "renorm_mean", "renorm_stddev"})


def control_flow_refusal(layer: Any) -> TrainingError:
    replicas = tf().distribute.get_strategy().num_replicas_in_sync
    return TrainingError(
        f"Received BatchNormalization {layer.name!r} trained inside a tf.cond or tf.while_loop within the function "
        f"given to strategy.run, on {replicas} replicas; its moving statistics are kept one value on every replica "
        "(tfstrategy's keras_batch_norm_statistics: Keras lets each replica's copy drift), which takes a "
        "synchronisation TensorFlow does not allow there. Call the layer outside the tf.cond/tf.while_loop, use "
        "LayerNormalization there, or train on one device.")


def _drifts(statistic: Any, strategy: Any) -> bool:
    import numpy as np

    copies = [np.asarray(one) for one in strategy.experimental_local_results(statistic.value)]
    return not np.array_equal(copies[0], copies[1])


class BatchNormStatisticsPatch(TrainingApiPatch):
    """``BatchNormalization(synchronized=False)``'s moving statistics made on 2+ replicas are mean-aggregated."""

    name = "keras_batch_norm_statistics"
    change_text = ("BatchNormalization's moving statistics are the replicas' mean, one value on every replica (Keras: "
                   "each replica's copy drifts, and predict uses a copy the saved model does not hold)")
    upstream = ("no Keras 3 report found; tensorflow/tensorflow#46488 reported the symptom (a saved model predicting "
                "other numbers than the model in memory) against tf.keras 2.3")
    targets = (TARGET, CALL)

    def probe_on(self, strategy: Any) -> ProbeResult:
        import keras
        import numpy as np

        class KerasOwn(keras.layers.BatchNormalization):  # Keras' build with Keras' own add_weight
            add_weight = self.original(TARGET)

        with strategy.scope():
            layer = KerasOwn(momentum=0.5)
            layer.build((None, 1))
        rows = tf().constant(np.arange(4, dtype="float32").reshape(2, 2, 1))  # replica 0: 0, 1; replica 1: 2, 3

        def step() -> Any:
            replica = tf().distribute.get_replica_context().replica_id_in_sync_group
            return layer(tf().gather(rows, replica), training=True)

        tf().function(lambda: strategy.run(step))()
        return ProbeResult({TARGET: _drifts(layer.moving_mean, strategy)})

    def replacement(self, target: str, original: Any) -> Any:
        if target == CALL:
            return _refusing_control_flow(original)

        @functools.wraps(original)
        def add_weight(layer: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("name") in MOVING_STATISTICS and kwargs.get("aggregation", "none") in ("none", None) \
                    and not kwargs.get("trainable", True) and not getattr(layer, "synchronized", True):
                strategy = tf().distribute.get_strategy()
                if strategy.num_replicas_in_sync > 1 and PATCH.acts_on(strategy):
                    PATCH.acted()
                    kwargs["aggregation"] = "mean"
            return original(layer, *args, **kwargs)

        return add_weight


def _refusing_control_flow(original: Any) -> Any:
    @functools.wraps(original)
    def call(layer: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(layer, *args, **kwargs)
        except RuntimeError as error:
            if "merge_call" not in str(error) or getattr(layer.moving_mean, "aggregation", None) != "mean":
                raise
            raise _compat.keep_keras_error_message(control_flow_refusal(layer)) from error

    return call


PATCH = BatchNormStatisticsPatch()
