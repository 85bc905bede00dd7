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


def _loop(strategy, mixed: bool, scaled_calls: bool = True, by_hand: bool = False, eager: bool = False):
    """Returns (weights before, weights after) of three steps of the guide's loop.

    ``by_hand``: the loss is multiplied by ``optimizer.dynamic_scale`` (built first) in place of the
    Keras 2 calls; ``eager``: the step runs without ``tf.function``.
    """
    keras.utils.set_random_seed(2)
    with strategy.scope():
        inputs = keras.Input((8,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        outputs = keras.layers.Activation("softmax", dtype="float32")(keras.layers.Dense(3)(hidden))
        model = keras.Model(inputs, outputs)
        optimizer = keras.optimizers.SGD(0.5)
        if mixed:
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        if by_hand:
            optimizer.build(model.trainable_variables)
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
            if by_hand:
                loss = loss * tf.cast(optimizer.dynamic_scale, loss.dtype)
        gradients = tape.gradient(loss, model.trainable_variables)
        if mixed and scaled_calls:
            gradients = optimizer.get_unscaled_gradients(gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    def distributed_step(batch):
        strategy.run(train_step, args=(batch,))

    if not eager:
        distributed_step = tf.function(distributed_step)

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


def test_a_loss_multiplied_by_the_dynamic_scale_by_hand_is_not_refused(strategy, policy):
    """The graph shows the scale's variable among the loss's inputs: evidence that it was scaled."""
    start, reference = _loop(tf.distribute.OneDeviceStrategy("/cpu:0"), mixed=False)
    policy("mixed_float16")
    _, by_hand = _loop(strategy, mixed=True, scaled_calls=False, by_hand=True)
    assert _difference(by_hand, reference) <= TOLERANCES["mixed_float16"]


def test_gradients_made_by_hand_are_applied_as_keras_applies_them(strategy):
    """Keras' own tests pass ``grads * initial_scale`` straight to ``apply``: no tape took them, nothing is refused.

    The shape of ``LossScaleOptimizer`` tests in Keras (keras/src/optimizers/loss_scale_optimizer_test.py):
    eagerly, and here also traced inside ``strategy.run`` on 2 replicas.
    """
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    variable = keras.Variable([1.0, 2.0, 3.0, 4.0])
    optimizer.apply([tf.constant([1.0, 6.0, 7.0, 2.0]) * optimizer.initial_scale], [variable])
    np.testing.assert_allclose(variable.numpy(), [0.5, -1.0, -0.5, 3.0])

    with strategy.scope():
        optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.5))
        variable = keras.Variable([1.0, 2.0, 3.0, 4.0])
        optimizer.build([variable])

    @tf.function
    def step():
        # Each replica's gradient is half the step's; the all-reduce sums them.
        gradient = tf.constant([1.0, 6.0, 7.0, 2.0]) * optimizer.initial_scale / 2
        strategy.run(lambda: optimizer.apply([gradient], [variable]))

    step()
    np.testing.assert_allclose(variable.numpy(), [0.5, -1.0, -0.5, 3.0])


def test_an_eager_loop_without_scale_loss_is_warned_about_not_refused(strategy, policy):
    """Eagerly there is no graph to show how the loss was computed: a warning, and Keras' own step."""
    policy("mixed_float16")
    with pytest.warns(RuntimeWarning, match=r"no scale_loss call.*32768.*keras-team/keras#19479"):
        _loop(strategy, mixed=True, scaled_calls=False, eager=True)


def test_upstream_keras_still_lacks_the_keras2_calls():
    """Fails once Keras' LossScaleOptimizer has get_scaled_loss again: drop keras_loss_scale_api."""
    assert api.LossScaleApiPatch().needed() is True
