"""``predict_on_batch`` on 2 replicas returns one device's rows, in order (the matrix's `entry:predict_on_batch`).

Uneven batches (5 rows, 1 row) and a dict of inputs, since the fix splits the batch itself.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_predict_on_batch as pob

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or pob.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]


def _two_inputs(strategy):
    with strategy.scope():
        a, b = keras.Input((2,), name="a"), keras.Input((1,), name="b")
        out = keras.layers.Dense(1, kernel_initializer="ones")(keras.layers.Concatenate()([a, b]))
        return keras.Model({"a": a, "b": b}, out)


@pytest.mark.parametrize("rows", [5, 1])
def test_an_uneven_batch_of_a_dict_gives_one_devices_rows_in_order(rows):
    strategy = tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches
    x = {"a": np.arange(2 * rows, dtype="float32").reshape(rows, 2), "b": np.arange(rows, dtype="float32")[:, None]}
    two = _two_inputs(strategy).predict_on_batch(x)
    one = _two_inputs(tf.distribute.get_strategy()).predict_on_batch(x)
    np.testing.assert_array_equal(two, one)
    assert two.shape == (rows, 1)


@pytest.mark.parametrize(("rows", "replicas", "parts"), [
    pytest.param(16, 2, [(0, 8), (8, 16)], id="even"),
    pytest.param(5, 2, [(0, 3), (3, 5)], id="odd"),
    pytest.param(1, 2, [(0, 1), (1, 1)], id="one-row"),
    pytest.param(7, 4, [(0, 2), (2, 4), (4, 6), (6, 7)], id="four"),
])
def test_split_rows_is_contiguous_and_in_order(rows, replicas, parts):
    assert [pob.split_rows(rows, replicas, i) for i in range(replicas)] == parts


def test_upstream_keras_still_predicts_the_batch_on_every_replica():
    """Fails once Keras' own predict_on_batch splits the batch: drop keras_predict_on_batch."""
    assert pob.PredictOnBatchPatch().needed() is True
