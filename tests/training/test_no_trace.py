"""Measuring leaves no trace: a dataset copy that keeps the original's shuffle order, and a full state snapshot."""

from __future__ import annotations

import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import mirrored
from tfstrategy.training.no_trace import dataset_copy, pipeline_batch, snapshot


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


def _flavour_fit(steps_per_execution):
    """tf.keras, whichever Keras it is (Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1)."""
    import tfstrategy

    tf.keras.utils.set_random_seed(1)
    x = np.random.default_rng(0).normal(size=(512, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).shuffle(512, seed=7).batch(32)
    layers = tf.keras.layers
    model, _ = tfstrategy.build_in_scope(
        mirrored(1), lambda: tf.keras.Sequential([tf.keras.Input((4,)), layers.Dense(8, activation="relu"),
                                                  layers.Dense(1)]),
        optimizer="adam", loss="mse", steps_per_execution=steps_per_execution)
    return model, model.fit(data, epochs=2, verbose=0).history["loss"]


@pytest.mark.smoke
def test_auto_then_fit_equals_the_chosen_k_fixed_on_this_keras():
    from tfstrategy.training.steps_per_execution import last_choice

    tuned, tuned_losses = _flavour_fit("auto")
    chosen = last_choice(tuned).steps
    fixed, fixed_losses = _flavour_fit(chosen)
    np.testing.assert_allclose(tuned_losses, fixed_losses, rtol=0, atol=1e-6)
    for a, b in zip(tuned.get_weights(), fixed.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.smoke
def test_the_performance_report_works_on_this_keras():
    import tfstrategy

    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(16)
    with mirrored(1).scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    report = tfstrategy.performance_report(data, larger_k=True, probe_share=10_000)  # every probe, on 0.3 s trained
    model.fit(data, epochs=2, verbose=0, callbacks=[report])
    (result,) = report.tracker.reports
    assert result.measurements.steps == 31 and result.measurements.synthetic is not None
    assert result.measurements.larger_k[0] == 4 and sum(result.shares.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(("pipeline", "size"), [
    pytest.param(lambda d: d.batch(64).map(lambda x: x * 2).prefetch(2), 64, id="batch-map-prefetch"),
    pytest.param(lambda d: d.batch(7).unbatch().batch(5, drop_remainder=True).prefetch(1), 5, id="the-outermost"),
    pytest.param(lambda d: d.map(lambda x: tf.fill([2], x)).padded_batch(9, padded_shapes=[3]), 9, id="padded"),
    pytest.param(lambda d: d, None, id="unbatched"),
])
def test_the_batch_size_is_read_from_the_pipelines_graph_without_running_it(pipeline, size):
    ran = []

    def count(x):
        ran.append(1)
        return x

    dataset = pipeline(tf.data.Dataset.range(100).map(lambda x: tf.py_function(count, [x], tf.int64)))
    assert pipeline_batch(dataset) == size and ran == []
