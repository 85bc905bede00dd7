"""Measuring leaves no trace: a dataset copy that keeps the original's shuffle order, and a full state snapshot."""

from __future__ import annotations

import random

import keras
import numpy as np
import tensorflow as tf

from helpers import mirrored
from tfstrategy.training.no_trace import dataset_copy, snapshot


def _epochs(dataset, count=2):
    return [[batch.numpy().tolist() for batch in dataset] for _ in range(count)]


def _pipeline():
    return tf.data.Dataset.range(16).shuffle(16, seed=7).map(lambda x: x * 10).batch(4)


def test_iterating_the_copy_leaves_the_originals_shuffle_order_alone():
    untouched = _epochs(_pipeline())
    original = _pipeline()
    copy, reason = dataset_copy(original)
    assert reason is None
    assert _epochs(copy, 3)[:2] == untouched  # the copy starts where the original does
    assert _epochs(original) == untouched  # and three epochs of it moved nothing


def test_a_shuffle_and_repeat_and_the_options_are_kept():
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    original = tf.data.Dataset.range(8).shuffle(8, seed=3).repeat(2).batch(4).with_options(options)
    untouched = _epochs(tf.data.Dataset.range(8).shuffle(8, seed=3).repeat(2).batch(4))
    copy, _ = dataset_copy(original)
    _epochs(copy)
    assert _epochs(original) == untouched
    assert copy.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA


def test_no_copy_of_what_cannot_be_copied_says_why():
    distributed = mirrored(1).experimental_distribute_dataset(_pipeline())
    same, reason = dataset_copy(distributed)
    assert same is distributed and "cannot be copied, only a tf.data.Dataset" in reason
    sampler = tf.data.Dataset.random(seed=1, rerandomize_each_iteration=True).take(4)
    same, reason = dataset_copy(sampler)
    assert same is sampler and "shares a seed generator with the original" in reason


def test_the_snapshot_restores_weights_seed_generators_and_global_random_states():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dropout(0.5)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    keras.random.normal((2,))  # makes Keras' global seed generator
    saved = snapshot(model)
    expected = {"python": random.random(), "numpy": np.random.random(), "keras": keras.random.normal((2,)).numpy(),
                "dropout": model(np.ones((2, 4), "float32"), training=True).numpy()}
    model.fit(np.ones((8, 4), "float32"), np.ones((8, 3), "float32"), epochs=1, verbose=0)
    saved.restore()
    assert int(model.optimizer.iterations.numpy()) == 0
    assert random.random() == expected["python"] and np.random.random() == expected["numpy"]
    np.testing.assert_array_equal(keras.random.normal((2,)).numpy(), expected["keras"])
    np.testing.assert_array_equal(model(np.ones((2, 4), "float32"), training=True).numpy(), expected["dropout"])
