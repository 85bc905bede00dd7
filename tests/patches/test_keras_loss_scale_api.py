"""TensorFlow's mixed-precision guide's custom loop on 2 replicas, with the Keras 2 loss-scale calls.

The shape of the guide's "Training the model with a custom training loop" as tensorflow/tensorflow#64124
and keras-team/keras#20894 run it under Keras 3: ``mixed_float16``, a float32 softmax output,
``LossScaleOptimizer``, ``get_scaled_loss`` inside the tape and ``get_unscaled_gradients`` before
``apply_gradients``, in a ``tf.function`` (here through ``strategy.run``). keras-team/keras#19479 is the
port without those two calls, which Keras 3 runs with a step 32768 times too small.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.diagnostics.equivalence import TOLERANCES
from tfstrategy.errors import TrainingError
from tfstrategy.patches import keras_loss_scale_api as api

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or api.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow: tf_keras has the Keras 2 calls",
    ),
]

GLOBAL_BATCH = 16


@pytest.fixture
def policy():
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="module")
def strategy():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


def _loop(strategy, mixed: bool, scaled_calls: bool = True):
    """Returns (weights before, weights after) of three steps of the guide's loop."""
    keras.utils.set_random_seed(2)
    with strategy.scope():
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        outputs = keras.layers.Activation("softmax", dtype="float32")(keras.layers.Dense(3)(hidden))
        model = keras.Model(inputs, outputs)
        optimizer = keras.optimizers.SGD(0.5)
        if mixed:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        loss_object = keras.losses.SparseCategoricalCrossentropy(reduction="none")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3 * GLOBAL_BATCH, 8)).astype("float32")
    y = rng.integers(0, 3, size=(3 * GLOBAL_BATCH,))
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))

    def train_step(batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(labels, model(features, training=True)),
                                              global_batch_size=GLOBAL_BATCH)
            if mixed and scaled_calls:
                loss = optimizer.get_scaled_loss(loss)
        gradients = tape.gradient(loss, model.trainable_variables)
        if mixed and scaled_calls:
            gradients = optimizer.get_unscaled_gradients(gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    @tf.function
    def distributed_step(batch):
        strategy.run(train_step, args=(batch,))

    before = [w.copy() for w in model.get_weights()]
    for batch in dataset:
        distributed_step(batch)
    return before, model.get_weights()


def _difference(left, right) -> float:
    return max(float(np.max(np.abs(a - b))) for a, b in zip(left, right))


def test_the_guides_mixed_loop_on_two_replicas_equals_float32_on_one_device(strategy, policy):
    start, reference = _loop(tf.distribute.OneDeviceStrategy("/cpu:0"), mixed=False)
    policy("mixed_float16")
    _, mixed = _loop(strategy, mixed=True)
    assert _difference(reference, start) > 1e-2  # it trains
    assert _difference(mixed, reference) <= TOLERANCES["mixed_float16"]
    assert api.PATCH.status().installed == api.PATCH.targets


def test_gradients_of_an_unscaled_loss_are_refused_before_the_weights_change(strategy, policy):
    policy("mixed_float16")
    with pytest.raises(TrainingError, match=r"not scaled.*32768.*keras-team/keras#19479.*optimizer.scale_loss\(loss\)"):
        _loop(strategy, mixed=True, scaled_calls=False)


def test_upstream_keras_still_lacks_the_keras2_calls():
    """Fails once Keras' LossScaleOptimizer has get_scaled_loss again: drop keras_loss_scale_api."""
    assert api.LossScaleApiPatch().needed() is True
