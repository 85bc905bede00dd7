"""A Keras loss object called in a 2-replica strategy's scope, outside ``strategy.run``, returns one device's loss
(the matrix's `entry:loss_object`); inside ``strategy.run`` and on one device it is Keras' own, bit for bit."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_cross_replica_loss as cross
from tfstrategy.patches import keras_uneven_batches as uneven

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or cross.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]

TARGETS = np.zeros((4, 1), "float32")
PREDICTIONS = np.array([[2.0], [2.0], [1.0], [3.0]], "float32")  # squared errors 4, 4, 1, 9: a mean of 4.5


@pytest.fixture(scope="module")
def two_replicas():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


def _in_scope(strategy) -> dict[str, float]:
    """The loss object's value in the scope, eagerly and traced, and ``Model.compute_loss`` there."""
    with strategy.scope():
        loss_fn = keras.losses.MeanSquaredError()
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(loss="mse")
        return {"eager": float(loss_fn(TARGETS, PREDICTIONS)),
                "traced": float(tf.function(lambda: loss_fn(TARGETS, PREDICTIONS))()),
                "compute_loss": float(model.compute_loss(y=TARGETS, y_pred=PREDICTIONS))}


def _in_run(strategy) -> list[np.ndarray]:
    """Each replica's value of the loss object inside ``strategy.run``, on its half of the rows."""
    loss_fn = keras.losses.MeanSquaredError()
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((TARGETS, PREDICTIONS)).batch(4))
    (batch,) = list(dataset)
    values = strategy.run(tf.function(lambda y, p: loss_fn(y, p)), args=batch)
    return [np.asarray(value) for value in strategy.experimental_local_results(values)]


def test_a_loss_in_the_scope_outside_run_is_one_devices(two_replicas):
    assert _in_scope(two_replicas) == {"eager": 4.5, "traced": 4.5, "compute_loss": 4.5}
    assert cross.PATCH.change() is not None


def test_inside_run_and_on_one_device_the_loss_is_keras_own_bit_for_bit(two_replicas):
    """Do no harm: a replica's value inside ``strategy.run`` stays its share (Keras divides by the replica count
    so that the all-reduce sums the gradients to the global mean's), and one device's value is the loss."""
    patched_run, patched_one = _in_run(two_replicas), _in_scope(tf.distribute.get_strategy())
    cross.PATCH.remove()
    try:
        plain_run, plain_one = _in_run(two_replicas), _in_scope(tf.distribute.get_strategy())
        plain_scope = _in_scope(two_replicas)
    finally:
        cross.PATCH.apply()
    for patched, plain in zip(patched_run, plain_run, strict=True):
        np.testing.assert_array_equal(patched, plain)
    assert [float(value) for value in plain_run] == [2.0, 2.5]  # halves (4, 4) and (1, 9): their means / 2
    assert patched_one == plain_one == {"eager": 4.5, "traced": 4.5, "compute_loss": 4.5}
    assert plain_scope == {"eager": 2.25, "traced": 2.25, "compute_loss": 2.25}  # Keras' own: divided by 2


def test_the_fix_stays_on_when_the_uneven_batches_fix_of_the_same_function_comes_off(two_replicas):
    """Both replace ``scale_loss_for_distribution``; CI (2026-12-07) saw this test's first one fail after
    ``test_keras_uneven_batches`` had taken its fix off and put it back: Keras' own function was put back over this one."""
    for _ in range(2):  # the uneven-batches fix under this one, then (put back) over it
        uneven.PATCH.remove()
        try:
            assert _in_scope(two_replicas) == {"eager": 4.5, "traced": 4.5, "compute_loss": 4.5}
        finally:
            uneven.PATCH.apply()
        assert _in_scope(two_replicas) == {"eager": 4.5, "traced": 4.5, "compute_loss": 4.5}


def test_upstream_keras_still_divides_a_cross_replica_loss():
    """Canary: fails once Keras stops dividing a loss computed in a 2-replica strategy's scope by 2."""
    cross.PATCH.forget()
    assert cross.PATCH.needed() is True
