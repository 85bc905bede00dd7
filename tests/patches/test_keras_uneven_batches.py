"""An uneven last batch in ``fit(x, y, batch_size=...)`` from NumPy arrays on 2 replicas equals one device.

The shape of keras-team/keras#19246 and tensorflow/tensorflow#58809: a Sequential regression model
compiled in ``strategy.scope()``, ``fit`` on NumPy arrays whose length the batch size does not divide,
then ``evaluate``; the reports compare the replicated weights with a single-device run.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_mwms as mwms
from tfstrategy.patches import keras_uneven_batches as uneven

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or uneven.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow: tf_keras weights replicas by their examples",
    ),
]

EXAMPLES = 33


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(EXAMPLES, 4)).astype("float32"), rng.normal(size=(EXAMPLES, 1)).astype("float32")


def _fit(strategy, batch_size: int):
    x, y = _data()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), model.evaluate(x, y, batch_size=batch_size, verbose=0)


def _difference(left, right) -> float:
    return max(float(np.max(np.abs(a - b))) for a, b in zip(left, right))


@pytest.fixture(scope="module")
def selected():
    """Two replicas the library's way: select() applies the registry's patches."""
    selection = tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={})
    assert selection.strategy.num_replicas_in_sync == 2
    return selection


# A last batch of 1 (one replica gets 1 example, the other none); a global batch of 9 split 5/4 at every step.
@pytest.mark.slow  # 13-17 s each alone
@pytest.mark.parametrize("batch_size", [8, 9])
def test_fit_and_evaluate_on_two_replicas_equal_one_device(selected, batch_size):
    one_weights, one_logs = _fit(tf.distribute.OneDeviceStrategy("/cpu:0"), batch_size)
    two_weights, two_logs = _fit(selected.strategy, batch_size)
    assert _difference(two_weights, one_weights) <= 1e-5
    assert np.allclose(two_logs, one_logs, rtol=0, atol=1e-5), (two_logs, one_logs)
    assert uneven.PATCH.status().installed == uneven.PATCH.targets


def test_upstream_keras_still_weights_replicas_equally(selected):
    """Fails once Keras weights each replica by its examples: then drop keras_uneven_batches."""
    found = uneven.UnevenBatchesPatch().probe()
    assert found is not None and found[uneven.STEP], f"Keras {keras.__version__} fixed uneven batches"


def test_upstream_keras_still_reduces_the_replicas_first_batch():
    """Fails once Keras' symbolic build no longer averages the replicas' batches (the 5/4 AddN crash)."""
    patch = mwms.MWMSPatch()
    assert patch.probe() is not None and patch.build_reduces_replicas


def test_without_the_patch_a_custom_train_step_keeps_keras_scaling(selected):
    """Outside Keras' own train_step the loss scale is Keras' 1/replicas (a user's train_step is left alone): in a
    replica context, where a train_step runs (in the scope outside ``strategy.run`` no replica shares a loss, and
    keras_cross_replica_loss leaves it whole)."""
    from keras.src.losses import loss as loss_module

    strategy = selected.strategy
    scaled = strategy.run(tf.function(lambda: loss_module.scale_loss_for_distribution(tf.constant(1.0))))
    assert [float(value) for value in strategy.experimental_local_results(scaled)] == [0.5, 0.5]


def _fit_even(strategy) -> tuple[list[np.ndarray], list[float]]:
    """Four steps of fit on global batches of 16 (8 per replica: every share is 1/2), then the weights."""
    x, y = _data()
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(x[:32], y[:32], batch_size=16, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"]


def test_even_batches_train_bit_for_bit_as_without_the_patch(selected):
    """The fix changes nothing where its bug's condition (replicas with different shares) does not hold."""
    uneven.PATCH.remove()
    try:
        plain_weights, plain_loss = _fit_even(selected.strategy)
    finally:
        uneven.PATCH.forget()
        uneven.PATCH.apply()
    patched_weights, patched_loss = _fit_even(selected.strategy)
    assert uneven.PATCH.change() is not None  # the patched train_step built this step
    for patched, plain in zip(patched_weights, plain_weights):
        np.testing.assert_array_equal(patched, plain)
    assert patched_loss == plain_loss


def _first_batch(strategy, parts):
    return strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(parts[context.replica_id_in_sync_group]))


def test_the_build_takes_a_string_batch_s_part_and_still_averages_numbers(selected):
    """Bug 5 of keras_mwms: strings cannot be averaged (AddN), so the build takes a part; even numbers keep
    MirroredStrategy's own mean, as before."""
    strategy = selected.strategy
    words = _first_batch(strategy, [[["red"], ["blue"]], [["green"], ["red"]]])
    numbers = _first_batch(strategy, [[1.0, 2.0], [3.0, 6.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="string"):  # what Keras' own build meets
        strategy.reduce("MEAN", (words,), axis=None)
    with mwms._reduce_unless_uneven(strategy):
        (built,) = strategy.reduce("MEAN", (words,), axis=None)
        assert built.shape == (2, 1) and built.dtype == tf.string
        np.testing.assert_array_equal(strategy.reduce("MEAN", (numbers,), axis=None)[0], [2.0, 4.0])
