"""Gradient clipping on 2 replicas clips the global gradient, as one device does (tensorflow/tensorflow#33929's point).

``fit`` is the matrix's (`optimizers:clipnorm`, `global_clipnorm`, `clipvalue`); here a custom loop as TensorFlow's
distributed tutorial writes it, with an ``Embedding`` (sparse ``IndexedSlices`` gradients), and an optimizer that does
not clip, which must train bit for bit as plain Keras.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_clipping as clipping

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or clipping.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]

BATCH = 8


def _loop(strategy, **options):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, size=(32, 3)).astype("int32")
    y = rng.normal(size=(32, 1)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4), keras.layers.Flatten(),
                                  keras.layers.Dense(1)])
        model.set_weights([np.linspace(-1, 1, w.size, dtype="float32").reshape(w.shape) for w in model.get_weights()])
        optimizer = keras.optimizers.SGD(0.5, **options)
        loss_object = keras.losses.MeanSquaredError(reduction="none")
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH))

    def replica_step(features, targets):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(targets, model(features)), global_batch_size=BATCH)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    @tf.function
    def step(batch):
        strategy.run(replica_step, args=batch)

    for batch in dataset:
        step(batch)
    return model.get_weights()


@pytest.fixture(scope="module")
def two_replicas():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


@pytest.mark.parametrize("options", [{"clipnorm": 0.1}, {"global_clipnorm": 0.1}, {"clipvalue": 0.02}],
                         ids=lambda options: next(iter(options)))
def test_a_custom_loop_with_sparse_gradients_clips_as_one_device(two_replicas, options):
    for two, one in zip(_loop(two_replicas, **options), _loop(tf.distribute.get_strategy(), **options)):
        np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_an_optimizer_that_does_not_clip_trains_bit_for_bit_as_plain_keras(two_replicas):
    fixed = _loop(two_replicas)
    clipping.PATCH.remove()
    try:
        plain = _loop(two_replicas)
    finally:
        clipping.PATCH.apply()
    for one, other in zip(fixed, plain):
        np.testing.assert_array_equal(one, other)


def test_upstream_keras_still_clips_before_the_all_reduce():
    """Fails once Keras clips the summed gradient on 2 replicas: drop keras_clipping."""
    assert clipping.ClippingPatch().needed() is True
