"""A custom loop whose Adam builds lazily inside ``strategy.run`` trains on 2 replicas like on one device.

The shape of TensorFlow's custom-training tutorial with tf.distribute, as keras-team/keras#23085 and
tensorflow/tensorflow#72686 run it: model and ``Adam`` created in ``strategy.scope()``, a per-replica
step with ``GradientTape``, ``tf.nn.compute_average_loss`` and ``apply_gradients``, called through
``strategy.run`` in a ``tf.function`` over a distributed dataset; no ``optimizer.build`` anywhere.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from helpers import mirrored
from tfstrategy import _versions
from tfstrategy.patches import keras_lazy_optimizer as lazy

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or lazy.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow: tf_keras creates optimizer slots under init_scope",
    ),
]

GLOBAL_BATCH = 8


def _tutorial_loop(strategy) -> list[np.ndarray]:
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(0.01)
        loss_object = keras.losses.MeanSquaredError(reduction="none")
    rng = np.random.default_rng(0)
    features = rng.normal(size=(4 * GLOBAL_BATCH, 4)).astype("float32")
    labels = rng.normal(size=(4 * GLOBAL_BATCH, 1)).astype("float32")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH))

    def train_step(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            per_example = loss_object(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(inputs):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)

    for _ in range(2):
        for batch in dataset:
            distributed_train_step(batch)
    return model.get_weights()


def _difference(left, right) -> float:
    return max(float(np.max(np.abs(a - b))) for a, b in zip(left, right))


def test_tutorial_loop_with_lazy_adam_on_two_replicas_equals_one_device():
    selection = tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={})  # applies the registry's patches
    two = _tutorial_loop(selection.strategy)
    one = _tutorial_loop(tf.distribute.OneDeviceStrategy("/cpu:0"))
    assert _difference(two, one) <= 1e-5
    assert lazy.PATCH.status().installed == (lazy.TARGET,)
    assert lazy.PATCH.needed() is True


def test_upstream_keras_still_builds_optimizers_in_the_step():
    """Fails once Keras creates optimizer variables under init_scope (keras-team/keras#23087): drop the patch."""
    installed = lazy.PATCH.status().installed
    lazy.PATCH.remove()
    try:
        assert lazy.LazyOptimizerPatch().needed() is True
        with pytest.raises(tf.errors.InvalidArgumentError, match="You must feed a value for placeholder"):
            _tutorial_loop(mirrored(2))
    finally:
        if installed:
            lazy.PATCH.apply()


def test_an_eager_build_keeps_keras_own_function():
    lazy.PATCH.apply()
    optimizer = keras.optimizers.Adam(0.01)
    variable = keras.Variable(np.zeros((2,), "float32"))
    optimizer.build([variable])  # eager: Keras' own add_variable, no init_scope needed
    assert optimizer.built and len(optimizer.variables) > 2
