"""Random layers on 2 replicas draw other numbers on each replica (the matrix's `layers:dropout`, `gaussian_noise`,
`seed_generator`), and one device's numbers stay Keras' own, bit for bit."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_replica_seeds as seeds

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or seeds.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]


def _dropout_parts(strategy) -> list[np.ndarray]:
    """Each replica's output of Dropout(0.5) in training mode on its 4 rows of ones."""
    with strategy.scope():
        layer = keras.layers.Dropout(0.5, seed=5)

    @tf.function
    def step():
        return strategy.run(lambda: layer(tf.ones((4, 16)), training=True))

    return [np.asarray(part) for part in strategy.experimental_local_results(step())]


@pytest.fixture(scope="module")
def two_replicas():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


def test_each_replica_draws_its_own_mask(two_replicas):
    first, second = _dropout_parts(two_replicas)
    assert not np.array_equal(first, second)
    assert seeds.PATCH.change() is not None


def test_one_device_and_replica_0_keep_keras_own_numbers(two_replicas):
    """Do no harm: where the condition (a replica context of 2+ replicas) does not hold, or for replica 0 (offset
    0), the numbers are the unpatched ones."""
    patched_one = _dropout_parts(tf.distribute.get_strategy())
    patched_first = _dropout_parts(two_replicas)[0]
    seeds.PATCH.remove()
    try:
        plain_one = _dropout_parts(tf.distribute.get_strategy())
        plain_first, plain_second = _dropout_parts(two_replicas)
    finally:
        seeds.PATCH.apply()
    np.testing.assert_array_equal(patched_one[0], plain_one[0])
    np.testing.assert_array_equal(patched_first, plain_first)
    np.testing.assert_array_equal(plain_first, plain_second)  # Keras' own: the same mask on both replicas


def test_replica_seed_offsets_the_first_word_only():
    seed = tf.constant([11, 3], tf.int64)
    np.testing.assert_array_equal(seeds.replica_seed(seed, 0), [11, 3])
    np.testing.assert_array_equal(seeds.replica_seed(seed, tf.constant(2)), [11 + 2 * seeds.STRIDE, 3])


def test_remove_restores_keras_draw_seed():
    from keras.src.backend.tensorflow import random
    from keras.src.random import seed_generator

    seeds.PATCH.apply()
    assert random.draw_seed is not seed_generator.draw_seed
    seeds.PATCH.remove()
    try:
        assert random.draw_seed is seed_generator.draw_seed
    finally:
        seeds.PATCH.apply()


def test_upstream_keras_still_draws_the_same_seed_on_every_replica():
    """Fails once Keras gives each replica a seed of its own: drop keras_replica_seeds."""
    assert seeds.ReplicaSeedsPatch().needed() is True
