"""A stateful RNN on 2 replicas is refused in one line before its first step (the matrix's `layers:stateful_lstm`);
one device, a stateless RNN, and a stateful one called on its whole batch run Keras' own code."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.errors import TrainingError
from tfstrategy.patches import keras_stateful_rnn as stateful

# Not in the smoke set (.ci/versions): on Keras 3.10 the symbolic build fails before the refusal can fire
# (RuntimeError "Unable to automatically build the model", measured), so a stateful RNN on 2 replicas there
# still ends in Keras' traceback; the refusal is verified on the newest Keras (the patch's verified_up_to).
pytestmark = [
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or stateful.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]

X = np.ones((8, 3, 2), "float32")


@pytest.fixture(scope="module")
def two_replicas():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


def _model(strategy, is_stateful: bool = True):
    with strategy.scope():
        inputs = keras.Input((3, 2), batch_size=4)
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.SimpleRNN(2, stateful=is_stateful)(inputs)))
        model.compile(optimizer="sgd", loss="mse")
    return model


def test_fit_on_two_replicas_is_refused_in_one_line_before_a_step(two_replicas):
    model = _model(two_replicas)
    with pytest.raises(TrainingError) as refused:
        model.fit(X, np.ones((8, 1), "float32"), batch_size=4, epochs=1, verbose=0)
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith("Received SimpleRNN(stateful=True) (")
    assert int(model.optimizer.iterations.numpy()) == 0


def test_one_device_a_stateless_rnn_and_a_whole_batch_run_keras_own_code(two_replicas):
    y = np.ones((8, 1), "float32")
    _model(tf.distribute.get_strategy()).fit(X, y, batch_size=4, epochs=1, verbose=0)
    _model(two_replicas, is_stateful=False).fit(X, y, batch_size=4, epochs=1, verbose=0)
    with two_replicas.scope():
        assert _model(two_replicas)(X[:4]).shape == (4, 1)  # the whole batch, outside the replicas


def test_upstream_keras_still_fails_a_stateful_rnn_on_two_replicas():
    """Fails once Keras' stateful RNN runs on a replica's part of its batch: then revisit keras_stateful_rnn."""
    assert stateful.StatefulRnnPatch().needed() is True
