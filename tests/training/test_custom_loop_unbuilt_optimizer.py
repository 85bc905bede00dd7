"""make_train_step builds an unbuilt optimizer in the scope, or refuses it with the fix (issue 13)."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from helpers import mirrored
from tfstrategy import make_train_step, prepare_dataset
from tfstrategy.diagnostics.equivalence import initial_weights, max_difference, reference_model, synthetic_regression
from tfstrategy.errors import TrainingError

GLOBAL_BATCH = 16


def _train_with_lazy_adam(replicas: int, weights):
    strategy = mirrored(replicas)
    x, y = synthetic_regression(GLOBAL_BATCH * 3)
    data = prepare_dataset(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch=GLOBAL_BATCH)
    with strategy.scope():
        model = reference_model()
        model.set_weights(weights)
        optimizer = keras.optimizers.Adam(0.01)  # as the tutorial makes it: built lazily by its first step
    assert not optimizer.built
    step = make_train_step(model, strategy=strategy, global_batch=GLOBAL_BATCH, loss=keras.losses.MeanSquaredError(reduction=None), optimizer=optimizer)
    assert optimizer.built
    step.run_epoch(strategy.experimental_distribute_dataset(data))
    return model.get_weights()


@pytest.mark.slow
def test_lazily_built_adam_trains_on_4_replicas_like_1():
    """On 4 replicas it failed with "You must feed a value for placeholder tensor"."""
    start = initial_weights()
    assert max_difference(_train_with_lazy_adam(4, start), _train_with_lazy_adam(1, start)) <= 1e-5


def test_unbuilt_optimizer_for_a_model_without_variables_is_refused():
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])  # no input shape: no variables yet
        optimizer = keras.optimizers.Adam()
    with pytest.raises(TrainingError, match=r"not built yet and model .* with no variables.*keras.Input\(shape=\.\.\.\)"):
        make_train_step(model, strategy=strategy, global_batch=4, loss=keras.losses.MeanSquaredError(reduction=None), optimizer=optimizer)
