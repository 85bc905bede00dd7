"""Batching hidden in functions, partial validation batches and small evaluation sets (issue 13)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from helpers import mirrored
from tfstrategy import plan_batch, plan_dataset, prepare_dataset
from tfstrategy.errors import BatchError
from tfstrategy.training.batching import BatchPlan
from tfstrategy.training.datasets import batched_by

RANGE = tf.data.Dataset.range(64)


def _bucketed():
    sequences = RANGE.map(lambda x: tf.fill([x % 5 + 1], x))
    return sequences.bucket_by_sequence_length(lambda x: tf.shape(x)[0], [3], [4, 4])


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(lambda: RANGE.interleave(lambda x: tf.data.Dataset.range(8).batch(2), cycle_length=2), "BatchDatasetV2 inside InterleaveDataset", id="batch-inside-interleave"),
        pytest.param(lambda: RANGE.interleave(lambda x: tf.data.Dataset.range(8).padded_batch(2), cycle_length=2).map(lambda b: b), "PaddedBatchDatasetV2 inside InterleaveDataset", id="padded-batch-inside-interleave-then-map"),
        pytest.param(lambda: RANGE.interleave(lambda x: tf.data.Dataset.range(3).interleave(lambda y: tf.data.Dataset.range(2).batch(2))), "BatchDatasetV2 inside InterleaveDataset", id="nested-interleave"),
        pytest.param(lambda: RANGE.flat_map(lambda x: tf.data.Dataset.from_tensors(x).batch(1)), "BatchDatasetV2 inside FlatMapDataset", id="batch-inside-flat-map"),
        pytest.param(_bucketed, "PaddedBatchDatasetV2 inside GroupByWindowDataset", id="bucket-by-sequence-length"),
        pytest.param(lambda: _bucketed().unbatch(), None, id="bucketed-then-unbatched"),
        pytest.param(lambda: RANGE.interleave(lambda x: tf.data.Dataset.range(8).batch(2).unbatch()), None, id="unbatched-inside-interleave"),
        pytest.param(lambda: RANGE.interleave(lambda x: tf.data.Dataset.range(8).map(lambda y: y * 2)), None, id="plain-interleave"),
    ],
)
def test_batching_inside_functions_is_seen(make, expected):
    assert batched_by(make()) == expected
    if expected:
        with pytest.raises(BatchError, match="already batched"):
            plan_dataset(make(), mirrored(2), global_batch=8)


def _conv_model():
    keras = tf.keras
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


def _images(count: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(count, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 3, size=(count,))
    return tf.data.Dataset.from_tensor_slices((x, y))


def _evaluate(replicas: int, count: int, global_batch: int) -> dict:
    strategy = mirrored(replicas)
    weights = _conv_model().get_weights()
    with strategy.scope():
        model = _conv_model()
        model.set_weights(weights)
        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    data = prepare_dataset(_images(count), strategy, global_batch=global_batch, training=False)
    return model.evaluate(data, verbose=0, return_dict=True)


@pytest.mark.parametrize(
    ("count", "global_batch"),
    [
        pytest.param(80, 64, id="last-batch-16-of-64"),
        pytest.param(16, 64, id="small-set-one-partial-batch"),
        pytest.param(6, 8, id="small-set-not-a-multiple-of-replicas"),
        pytest.param(66, 64, id="last-batch-2-of-64"),
    ],
)
def test_conv_model_evaluates_a_partial_batch_like_one_replica(count, global_batch):
    one, four = _evaluate(1, count, global_batch), _evaluate(4, count, global_batch)
    assert four["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert four["accuracy"] == pytest.approx(one["accuracy"])


def test_a_partial_validation_batch_splits_evenly_on_one_worker():
    """Auto-shard OFF split the last 16 as [16, 0, 0, 0]; plain .batch() splits [4, 4, 4, 4]."""
    strategy = mirrored(4)
    data = prepare_dataset(tf.data.Dataset.range(80), strategy, global_batch=64, training=False)
    splits = [[int(part.shape[0]) for part in strategy.experimental_local_results(batch)] for batch in strategy.experimental_distribute_dataset(data)]
    assert splits == [[16, 16, 16, 16], [4, 4, 4, 4]]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param(
            {"dataset_size": 128},
            BatchPlan(global_batch=256, per_replica_batch=64, replicas=4, dataset_size=128, drop_remainder=False, steps_per_epoch=1, remainder=128),
            id="128-examples-at-256",
        ),
        pytest.param(
            {"dataset_size": 6, "global_batch": 8},
            BatchPlan(global_batch=4, per_replica_batch=1, replicas=4, dataset_size=6, drop_remainder=False, steps_per_epoch=2, remainder=2),
            id="6-examples-shrink-the-batch-to-4",
        ),
    ],
)
def test_small_evaluation_sets_are_planned(arguments, expected):
    assert plan_batch(4, **{"global_batch": 256, "drop_remainder": False, **arguments}) == expected


def test_an_evaluation_set_smaller_than_the_replicas_is_refused():
    with pytest.raises(BatchError, match="dataset of 2 examples for 4 replicas; every replica needs at least one"):
        plan_batch(4, global_batch=8, dataset_size=2, drop_remainder=False)
    with pytest.raises(BatchError, match="no even step to train on"):
        plan_batch(4, global_batch=256, dataset_size=128)


def test_a_dataset_function_taking_no_argument_is_refused():
    with pytest.raises(BatchError, match=r"Received a dataset function <lambda>\(\); expected a function taking one argument"):
        prepare_dataset(lambda: RANGE, mirrored(2), global_batch=8)
