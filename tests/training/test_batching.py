"""The batch plan (pure) and dataset preparation on real strategies."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from helpers import mirrored
from tfstrategy import plan_batch, plan_dataset, prepare_dataset
from tfstrategy.diagnostics.equivalence import initial_weights, reference_model, synthetic_regression
from tfstrategy.errors import BatchError
from tfstrategy.training.batching import BatchPlan
from tfstrategy.training.datasets import auto_shard_policy, batched_by, reads_files


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param(
            {"replicas": 4, "global_batch": 256},
            BatchPlan(global_batch=256, per_replica_batch=64, replicas=4),
            id="howto-256-on-4",
        ),
        pytest.param(
            {"replicas": 1, "global_batch": 256, "dataset_size": 1000},
            BatchPlan(global_batch=256, per_replica_batch=256, replicas=1, dataset_size=1000, steps_per_epoch=3, remainder=232),
            id="train-drops-remainder",
        ),
        pytest.param(
            {"replicas": 4, "global_batch": 256, "dataset_size": 1000, "drop_remainder": False},
            BatchPlan(
                global_batch=256, per_replica_batch=64, replicas=4, dataset_size=1000, drop_remainder=False, steps_per_epoch=4, remainder=232
            ),
            id="validation-keeps-remainder",
        ),
        pytest.param(
            {"replicas": 2, "per_replica_batch": 32, "dataset_size": 128},
            BatchPlan(global_batch=64, per_replica_batch=32, replicas=2, dataset_size=128, steps_per_epoch=2),
            id="per-replica-scales",
        ),
        pytest.param(
            {"replicas": 4, "global_batch": 4, "dataset_size": 4},
            BatchPlan(global_batch=4, per_replica_batch=1, replicas=4, dataset_size=4, steps_per_epoch=1),
            id="one-example-per-replica",
        ),
    ],
)
def test_plan(arguments, expected):
    replicas = arguments.pop("replicas")
    assert plan_batch(replicas, **arguments) == expected


@pytest.mark.parametrize(
    ("replicas", "arguments", "message"),
    [
        pytest.param(4, {"global_batch": 258}, "global_batch=258 for 4 replicas; it does not divide evenly.*Pass global_batch=256 or 260", id="uneven"),
        pytest.param(4, {"global_batch": 2}, "per-replica batch of 0.5, below 1. Pass global_batch=4", id="global-below-replicas"),
        pytest.param(2, {"per_replica_batch": 0}, "per_replica_batch=0; each replica needs at least 1", id="per-replica-zero"),
        pytest.param(2, {"per_replica_batch": -3}, "per_replica_batch=-3", id="per-replica-negative"),
        pytest.param(2, {"global_batch": 0}, "global_batch=0; expected at least 1", id="global-zero"),
        pytest.param(2, {"global_batch": 64.0}, "global_batch=64.0; expected a whole number", id="global-float"),
        pytest.param(2, {"global_batch": True}, "global_batch=True; expected a whole number", id="global-bool"),
        pytest.param(2, {}, "expected exactly one of them", id="neither"),
        pytest.param(2, {"global_batch": 64, "per_replica_batch": 32}, "expected exactly one of them", id="both"),
        pytest.param(4, {"global_batch": 256, "dataset_size": 100}, "dataset of 100 examples for a global batch of 256; it is smaller than one batch", id="dataset-smaller-than-batch"),
        pytest.param(4, {"global_batch": 256, "dataset_size": 0}, "dataset_size=0", id="empty-dataset"),
        pytest.param(0, {"global_batch": 256}, "Received replicas=0", id="zero-replicas"),
        pytest.param("four", {"global_batch": 256}, "Received replicas='four'", id="replicas-not-a-number"),
    ],
)
def test_plan_errors(replicas, arguments, message):
    with pytest.raises(BatchError, match=message):
        plan_batch(replicas, **arguments)


def test_plan_prints_key_value_lines():
    plan = plan_batch(4, global_batch=256, dataset_size=10_000)
    assert str(plan).splitlines() == [
        "global_batch 256",
        "replicas 4",
        "per_replica_batch 64",
        "drop_remainder True",
        "dataset_size 10000",
        "steps_per_epoch 39",
        "dropped_per_epoch 16",
    ]


def test_plan_reads_the_replicas_of_a_strategy():
    assert plan_batch(mirrored(4), global_batch=256).per_replica_batch == 64


def _examples(count: int, features: int = 3) -> tf.data.Dataset:
    values = np.arange(count * features, dtype="float32").reshape(count, features)
    return tf.data.Dataset.from_tensor_slices((values, values[:, :1]))


def test_global_batch_splits_into_per_replica_shapes_on_4_replicas():
    strategy = mirrored(4)
    dataset = prepare_dataset(_examples(600), strategy, global_batch=256)
    batches = list(strategy.experimental_distribute_dataset(dataset))
    assert len(batches) == 2  # 600 = 2 * 256 + 88 dropped
    for features, labels in batches:
        assert [tuple(part.shape) for part in strategy.experimental_local_results(features)] == [(64, 3)] * 4
        assert [tuple(part.shape) for part in strategy.experimental_local_results(labels)] == [(64, 1)] * 4


def test_dataset_function_gets_per_replica_batches_and_drops_partial_steps():
    strategy = mirrored(4)
    seen = []

    def make(input_context):
        seen.append((input_context.num_input_pipelines, input_context.get_per_replica_batch_size(256)))
        return tf.data.Dataset.range(600).map(lambda i: tf.cast(i, tf.float32))

    batches = list(prepare_dataset(make, strategy, global_batch=256))
    assert seen == [(1, 64)]
    assert len(batches) == 2
    first = [part.numpy() for part in strategy.experimental_local_results(batches[0])]
    assert [part.shape for part in first] == [(64,)] * 4
    # Consecutive examples: replica r gets examples 64r .. 64r+63 of the step.
    assert [float(part[0]) for part in first] == [0.0, 64.0, 128.0, 192.0]


def test_prepared_dataset_sets_the_shard_policy_and_prefetches():
    dataset = prepare_dataset(_examples(512), mirrored(2), global_batch=256)
    policy = dataset.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.OFF
    assert type(dataset).__name__.lstrip("_") == "PrefetchDataset"
    assert dataset.element_spec[0].shape.as_list() == [256, 3]  # static: the remainder is dropped


def test_validation_keeps_the_remainder_with_a_dynamic_batch():
    dataset = prepare_dataset(_examples(600), mirrored(2), global_batch=256, training=False)
    assert [int(features.shape[0]) for features, _ in dataset] == [256, 256, 88]


@pytest.mark.parametrize(
    ("dataset", "requested", "expected"),
    [
        pytest.param(None, None, "OFF", id="one-worker-off"),
        pytest.param(None, "data", "DATA", id="override-data"),
        pytest.param(None, "FILE", "FILE", id="override-file-any-case"),
    ],
)
def test_auto_shard_policy(dataset, requested, expected):
    assert auto_shard_policy(mirrored(2), dataset, requested) == getattr(tf.data.experimental.AutoShardPolicy, expected)


def test_auto_shard_policy_refuses_unknown_names():
    with pytest.raises(BatchError, match="auto_shard='rows'; expected one of off, data, file, auto"):
        auto_shard_policy(mirrored(2), None, "rows")


def test_file_sources_are_recognised(tmp_path):
    path = str(tmp_path / "examples.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"example")
    assert reads_files(tf.data.TFRecordDataset([path]).map(lambda record: record))
    assert not reads_files(_examples(4))


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(lambda ds: ds.batch(8), "BatchDataset", id="batch"),
        pytest.param(lambda ds: ds.batch(8).map(lambda x, y: (x, y)).prefetch(2), "BatchDataset", id="batch-then-map"),
        pytest.param(lambda ds: ds.padded_batch(8), "PaddedBatchDataset", id="padded-batch"),
        pytest.param(lambda ds: tf.data.Dataset.zip((ds, ds.batch(2))), "BatchDataset", id="zip-with-batched"),
        pytest.param(lambda ds: ds.batch(8).unbatch(), None, id="unbatched-again"),
        pytest.param(lambda ds: ds.shuffle(8).repeat(), None, id="not-batched"),
    ],
)
def test_batched_by(make, expected):
    assert batched_by(make(_examples(16))) == expected


def test_an_already_batched_dataset_is_refused():
    with pytest.raises(BatchError, match="already batched by BatchDataset.*Remove the .batch"):
        prepare_dataset(_examples(512).batch(32), mirrored(2), global_batch=256)


def test_a_dataset_function_returning_batches_is_refused():
    strategy = mirrored(2)
    with pytest.raises(BatchError, match="already batched"):
        list(prepare_dataset(lambda context: _examples(512).batch(4), strategy, global_batch=8))


def test_plan_dataset_reads_the_size_and_refuses_a_dataset_smaller_than_a_batch():
    strategy = mirrored(4)
    assert plan_dataset(_examples(1000), strategy, global_batch=256).steps_per_epoch == 3
    assert plan_dataset(_examples(1000).repeat(), strategy, global_batch=256).dataset_size is None
    with pytest.raises(BatchError, match="dataset of 100 examples for a global batch of 256"):
        prepare_dataset(_examples(100), strategy, global_batch=256)


def test_a_plan_for_other_replicas_is_refused():
    with pytest.raises(BatchError, match="plan for 4 replicas with a strategy of 2"):
        prepare_dataset(_examples(512), mirrored(2), plan=plan_batch(4, global_batch=256))


def test_validation_remainder_is_averaged_like_one_replica():
    # 258 examples: the last global batch of 2 leaves two of four replicas empty.
    x, y = synthetic_regression(258)
    weights = initial_weights()
    results = []
    for replicas in (1, 4):
        strategy = mirrored(replicas)
        with strategy.scope():
            model = reference_model()
            model.set_weights(weights)
            model.compile(loss="mse", metrics=["mae"])
        data = prepare_dataset(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch=256, training=False)
        results.append(model.evaluate(data, verbose=0, return_dict=True))
    one, four = results
    assert four["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert four["mae"] == pytest.approx(one["mae"], rel=1e-5)


@pytest.mark.parametrize(
    ("training", "sizes"),
    [
        pytest.param(True, [256, 256], id="training-drops-the-partial-step"),
        pytest.param(False, [256, 256, 88], id="validation-keeps-it"),
    ],
)
def test_dataset_function_on_one_replica_per_pipeline(training, sizes):
    # One replica per pipeline: the pipeline's batch is the replica's, with no rebatch stage.
    strategy = mirrored(1)
    batches = prepare_dataset(lambda _: tf.data.Dataset.range(600), strategy, global_batch=256, training=training)
    values = [strategy.experimental_local_results(batch)[0].numpy() for batch in batches]
    assert [len(value) for value in values] == sizes
    assert [int(value[0]) for value in values] == [0, 256, 512][: len(sizes)]
