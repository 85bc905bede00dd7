"""``gradient_accumulation_steps`` on 2 replicas trains as one device (keras-team/keras#20582 raises instead).

``SGD`` alone is the matrix's cell (`optimizers:gradient_accumulation`); here optimizers with state (momentum, Adam),
weight decay and clipping, which run inside the applied step, and the one refusal (``use_ema``).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.errors import TrainingError
from tfstrategy.patches import keras_gradient_accumulation as accumulation

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or accumulation.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]


def _fit(strategy, make_optimizer):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 3)).astype("float32")
    y = rng.normal(size=(48, 1)).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
        model.set_weights([np.linspace(-1, 1, w.size, dtype="float32").reshape(w.shape) for w in model.get_weights()])
        model.compile(optimizer=make_optimizer(), loss="mse")
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"], int(model.optimizer.iterations.numpy())


@pytest.fixture(scope="module")
def two_replicas():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


@pytest.mark.parametrize("make_optimizer", [
    pytest.param(lambda: keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.01, gradient_accumulation_steps=2),
                 id="sgd-momentum-weight-decay"),
    pytest.param(lambda: keras.optimizers.Adam(0.05, global_clipnorm=0.1, gradient_accumulation_steps=3),
                 id="adam-global-clipnorm"),
])
def test_accumulating_optimizers_train_as_one_device(two_replicas, make_optimizer):
    weights, losses, steps = _fit(two_replicas, make_optimizer)
    one_weights, one_losses, one_steps = _fit(tf.distribute.get_strategy(), make_optimizer)
    assert steps == one_steps
    np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
    for two, one in zip(weights, one_weights):
        np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_use_ema_with_accumulation_is_refused_before_a_step(two_replicas):
    with pytest.raises(TrainingError, match=r"use_ema=True, gradient_accumulation_steps=2\) on 2 replicas.*keras-team/keras#20582"):
        _fit(two_replicas, lambda: keras.optimizers.SGD(0.1, use_ema=True, gradient_accumulation_steps=2))


def test_upstream_keras_still_fails_to_accumulate_on_two_replicas():
    """Fails once Keras' own accumulation runs on 2 replicas: drop keras_gradient_accumulation."""
    assert accumulation.GradientAccumulationPatch().needed() is True
