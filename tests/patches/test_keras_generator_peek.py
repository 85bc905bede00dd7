"""``fit``/``evaluate`` on a Python generator under a strategy see the generator's batches in order (the matrix's
`inputs:generator`, which failed on CI: plain Keras' build pass draws batches and drops them, by the threads' luck).

The model's build waits until the generator has given 6 batches (or 3 s, when nothing draws them): Keras' own
build pass draws them then, every time, instead of sometimes.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.patches import keras_generator_peek as peek

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or peek.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]


class Batches:
    """Batch ``i`` of the generator: 8 rows of ``i``; ``drawn`` is set once 6 were drawn."""

    def __init__(self) -> None:
        self.drawn = threading.Event()

    def __call__(self):
        for index in range(1000):
            if index == 6:
                self.drawn.set()
            yield np.full((8, 2), index, "float32"), np.full((8, 1), index, "float32")


class Recorder(keras.Model):
    """Trains on nothing; each step reports its batch's number (the mean of its targets)."""

    def __init__(self, batches: Batches) -> None:
        super().__init__()
        self.batches = batches
        self.dense = keras.layers.Dense(1)

    def build(self, input_shape):
        self.batches.drawn.wait(3)  # a build that takes a moment: what a draw made meanwhile shows
        self.dense.build(input_shape)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        return {"index": tf.reduce_mean(data[1])}

    def test_step(self, data):
        return {"index": tf.reduce_mean(data[1])}


class Seen(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.indices: list[int] = []

    def on_train_batch_end(self, batch, logs=None):
        self.indices.append(round(float(logs["index"])))

    def on_test_batch_end(self, batch, logs=None):
        self.indices.append(round(float(logs["index"])))


def _run(strategy, entry: str) -> list[int]:
    batches, seen = Batches(), Seen()
    with strategy.scope():
        model = Recorder(batches)
        model.compile(loss="mse", optimizer="sgd")
    if entry == "fit":
        model.fit(batches(), steps_per_epoch=4, epochs=2, verbose=0, callbacks=[seen])
    else:
        model.evaluate(batches(), steps=4, verbose=0, callbacks=[seen])
    return seen.indices


@pytest.mark.parametrize("entry", ["fit", "evaluate"])
def test_a_generator_gives_its_batches_in_order_on_two_replicas(entry):
    strategy = tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches
    steps = 8 if entry == "fit" else 4
    assert _run(strategy, entry) == list(range(steps))  # plain Keras: 0 1 6 7 8 ... (its build pass drew 2-5)
    assert _run(tf.distribute.get_strategy(), entry) == list(range(steps))  # one device: no build pass
    assert peek.PATCH.change() is not None


def test_the_first_replicas_rows_are_cut_from_dense_leaves_only():
    batch = (np.zeros((5, 2)), tf.ones((5, 1)), None)
    x, y, weights = peek.first_replica_batch(batch, 2)
    assert (x.shape, tuple(y.shape), weights) == ((3, 2), (3, 1), None)
    assert peek.first_replica_batch(batch, 1)[0].shape == (5, 2)
    sparse = tf.sparse.from_dense(tf.ones((4, 2)))
    assert peek.first_replica_batch((sparse, np.zeros((4, 1))), 2) is None  # Keras' own pass takes it
    assert peek.first_replica_batch((np.float32(1.0),), 2) is None


def test_data_a_new_pass_restarts_keeps_keras_own_build():
    """A tf.data pipeline, a PyDataset or arrays: every pass starts over, nothing is lost, Keras' build runs."""
    from tfstrategy import _compat

    class Indexed(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return np.zeros((4, 2)), np.zeros((4, 1))

    strategy = tf.distribute.get_strategy()
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((8, 2)), np.zeros((8, 1)))).batch(4)
    for data in (dataset, Indexed(), np.zeros((8, 2))):
        assert _compat.generator_first_batch(_compat.tf_epoch_iterator(strategy, data, steps_per_epoch=2)) is None
    generator = (batch for batch in [(np.zeros((4, 2)), np.zeros((4, 1)))] * 2)
    assert _compat.generator_first_batch(_compat.tf_epoch_iterator(strategy, generator, 2))[0].shape == (4, 2)


def test_upstream_keras_still_peeks_at_a_generator_through_a_pass():
    """Fails once Keras' build leaves a generator's data alone: drop keras_generator_peek."""
    assert peek.GeneratorPeekPatch().needed() is True
