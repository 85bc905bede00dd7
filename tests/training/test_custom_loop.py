"""The custom-loop step: same answer on 1, 2 and 4 replicas; per-replica losses refused."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import mirrored
from tfstrategy import make_train_step, plan_batch, prepare_dataset
from tfstrategy.diagnostics.equivalence import initial_weights, max_difference, reference_model, synthetic_regression
from tfstrategy.errors import BatchError, LossReductionError, TrainingError

GLOBAL_BATCH = 32
STEPS = 12


def _train(replicas: int, weights, loss=None):
    """Run STEPS loop steps on `replicas`; return the weights and the last logs."""
    strategy = mirrored(replicas)
    x, y = synthetic_regression(GLOBAL_BATCH * STEPS)
    data = prepare_dataset(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch=GLOBAL_BATCH)
    with strategy.scope():
        model = reference_model()
        model.set_weights(weights)
        optimizer = keras.optimizers.SGD(learning_rate=0.05)
    step = make_train_step(
        model,
        strategy=strategy,
        global_batch=plan_batch(strategy, global_batch=GLOBAL_BATCH),
        loss=loss or keras.losses.MeanSquaredError(reduction=None),
        optimizer=optimizer,
        metrics=["mae"],
    )
    logs = step.run_epoch(strategy.experimental_distribute_dataset(data))
    return model.get_weights(), logs


@pytest.fixture(scope="module")
def start():
    return initial_weights()


@pytest.fixture(scope="module")
def reference(start):
    return _train(1, start)


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4: 12 s alone
def test_loop_step_matches_one_replica(replicas, start, reference):
    weights, logs = _train(replicas, start)
    reference_weights, reference_logs = reference
    assert max_difference(weights, reference_weights) <= 1e-5
    # Loss is the global mean (plus the L2 term); mae is reduced over all replicas.
    assert logs.keys() == {"loss", "mae"}
    assert logs["loss"] == pytest.approx(reference_logs["loss"], rel=1e-5)
    assert logs["mae"] == pytest.approx(reference_logs["mae"], rel=1e-5)
    assert max_difference(weights, start) > 1e-2  # it did train


def test_loss_names_and_per_example_functions_are_accepted(start, reference):
    weights, _ = _train(2, start, loss="mse")
    assert max_difference(weights, reference[0]) <= 1e-5


class _TfKerasStyleLoss:
    """Stands in for a tf_keras (Keras 2) loss, which is not installed here."""

    reduction = "auto"
    name = "legacy_mse"

    def __call__(self, labels, predictions):
        return tf.reduce_mean(tf.square(labels - predictions))


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        pytest.param(
            keras.losses.MeanSquaredError(),
            "reduction='sum_over_batch_size'; expected reduction='none', because under a distribution strategy it "
            "averages over each replica's own batch",
            id="sum-over-batch-size",
        ),
        pytest.param(keras.losses.MeanSquaredError(reduction="mean"), "reduction='mean'.*N times too large", id="mean"),
        pytest.param(keras.losses.MeanSquaredError(reduction="sum"), "reduction='sum'; expected reduction='none', because it sums", id="sum"),
        pytest.param(_TfKerasStyleLoss(), "legacy_mse with reduction='auto'", id="tf-keras-auto"),
        pytest.param(42, "Received loss=42; expected a Keras loss with reduction='none'", id="not-callable"),
    ],
)
def test_per_replica_reductions_are_refused(loss, message):
    strategy = mirrored(2)
    with strategy.scope():
        model = reference_model()
        optimizer = keras.optimizers.SGD()
    with pytest.raises(LossReductionError, match=message):
        make_train_step(model, strategy=strategy, global_batch=8, loss=loss, optimizer=optimizer)


def test_a_loss_function_returning_a_scalar_is_refused_when_traced():
    strategy = mirrored(2)
    with strategy.scope():
        model = reference_model()
        optimizer = keras.optimizers.SGD()
    step = make_train_step(
        model, strategy=strategy, global_batch=8, loss=lambda y, p: tf.reduce_mean(tf.square(y - p)), optimizer=optimizer
    )
    x, y = synthetic_regression(8)
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    with pytest.raises(LossReductionError, match="returned a scalar; expected one loss per example"):
        step(next(iter(data)))


@pytest.mark.parametrize(
    ("global_batch", "error", "message"),
    [
        pytest.param(6, BatchError, "global_batch=6 for 4 replicas; expected a multiple of 4", id="uneven"),
        pytest.param(plan_batch(2, global_batch=8), BatchError, "plan for 2 replicas with a strategy of 4", id="plan-for-other-replicas"),
    ],
)
def test_step_refuses_batches_that_do_not_fit(global_batch, error, message):
    strategy = mirrored(4)
    with strategy.scope():
        model = reference_model()
        optimizer = keras.optimizers.SGD()
    with pytest.raises(error, match=message):
        make_train_step(model, strategy=strategy, global_batch=global_batch, loss="mse", optimizer=optimizer)


def test_step_needs_an_optimizer():
    strategy = mirrored(2)
    with strategy.scope():
        model = reference_model()
    with pytest.raises(TrainingError, match="Received no optimizer"):
        make_train_step(model, strategy=strategy, global_batch=8, loss="mse")


def test_sample_weights_are_averaged_over_the_global_batch(start):
    # Weights of 0 for half the examples: N replicas must still match 1 replica.
    x, y = synthetic_regression(64)
    w = np.tile(np.array([1.0, 0.0], dtype="float32"), 32)
    results = []
    for replicas in (1, 4):
        strategy = mirrored(replicas)
        with strategy.scope():
            model = reference_model()
            model.set_weights(start)
            optimizer = keras.optimizers.SGD(learning_rate=0.05)
        data = prepare_dataset(tf.data.Dataset.from_tensor_slices((x, y, w)), strategy, global_batch=16)
        step = make_train_step(model, strategy=strategy, global_batch=16, loss="mse", optimizer=optimizer)
        step.run_epoch(strategy.experimental_distribute_dataset(data))
        results.append(model.get_weights())
    assert max_difference(*results) <= 1e-5
