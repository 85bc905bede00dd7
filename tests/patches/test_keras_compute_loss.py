"""A ``train_step``/``test_step`` in the shape of keras.io's "Customizing what happens in fit()" guide, on 2 replicas.

The shape of keras-team/keras#16285 in Keras 3: ``compute_loss`` + a ``Mean`` loss tracker. The reported loss is
one device's with the fix (plain Keras: half of it), and the weights are the ones plain Keras trains, bit for bit.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_compute_loss as compute

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or compute.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]


class GuideModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def test_step(self, data):
        x, y = data
        self.loss_tracker.update_state(self.compute_loss(y=y, y_pred=self(x, training=False)))
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


def _fit(strategy):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = rng.normal(size=(32, 1)).astype("float32")
    with strategy.scope():
        inputs = keras.Input((3,))
        model = GuideModel(inputs, keras.layers.Dense(1, kernel_initializer="ones")(inputs))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"][0], model.evaluate(x, y, batch_size=8, verbose=0)


@pytest.fixture(scope="module")
def two_replicas():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


def test_the_guides_step_reports_one_devices_loss_and_trains_bit_for_bit_as_plain_keras(two_replicas):
    weights, loss, evaluated = _fit(two_replicas)
    one_weights, one_loss, one_evaluated = _fit(tf.distribute.get_strategy())
    assert loss == pytest.approx(one_loss, rel=1e-5) and evaluated == pytest.approx(one_evaluated, rel=1e-5)
    compute.PATCH.remove()
    try:
        plain_weights, plain_loss, plain_evaluated = _fit(two_replicas)
    finally:
        compute.PATCH.apply()
    assert plain_loss == pytest.approx(loss / 2, rel=1e-5) and plain_evaluated == pytest.approx(evaluated / 2, rel=1e-5)
    for fixed, plain, one in zip(weights, plain_weights, one_weights):
        np.testing.assert_array_equal(fixed, plain)  # the gradient is Keras' own, bit for bit
        np.testing.assert_allclose(fixed, one, rtol=1e-5, atol=1e-6)


def test_upstream_keras_still_returns_the_scaled_loss():
    """Fails once Keras' compute_loss returns the unscaled loss on 2 replicas: drop keras_compute_loss."""
    assert compute.ComputeLossPatch().needed() is True
