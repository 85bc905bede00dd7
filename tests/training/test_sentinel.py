"""The divergence sentinel: equal replicas pass; a drifted or NaN replica stops training, named."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import tfstrategy
from helpers import mirrored
from tfstrategy.errors import DivergenceError, TrainingError
from tfstrategy.training.sentinel import SENTINELS, Sentinel, add_sentinel, parse_sentinel, resolve_sentinel


def _model(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    return model


@pytest.mark.parametrize(
    ("value", "expected"),
    [pytest.param("epoch", "epoch", id="epoch"), pytest.param("100", 100, id="steps"),
     pytest.param("off", None, id="off"), pytest.param(True, "epoch", id="true"), pytest.param(False, None, id="false")],
)
def test_parse_sentinel(value, expected):
    assert parse_sentinel(value) == expected


def test_parse_sentinel_refuses_other_values():
    with pytest.raises(TrainingError, match="expected 'epoch'"):
        parse_sentinel("sometimes")
    assert resolve_sentinel(None, env={"TFSTRATEGY_SENTINEL": "50"}) == 50
    assert resolve_sentinel(None, env={}) is None


def test_equal_replicas_pass_and_a_drifted_replica_is_named():
    strategy = mirrored(4)
    model = _model(strategy)
    sentinel = Sentinel(strategy, model.weights)
    sentinel.check(step=0)
    kernel = model.weights[0]._value
    kernel.values[2].assign(kernel.values[2] + 1e-3)
    with pytest.raises(DivergenceError, match=r"at step 7: replica 2 has checksum .* over 4 replicas"):
        sentinel.check(step=7)
    kernel.values[2].assign(kernel.values[0])
    sentinel.check(step=8)
    kernel.values[3].assign(kernel.values[3] * np.nan)
    with pytest.raises(DivergenceError, match="non-finite weights at step 9 on replica 3"):
        sentinel.check(step=9)
    kernel.values[3].assign(kernel.values[0])
    with pytest.raises(DivergenceError, match="Received loss nan at step 10"):
        sentinel.check(step=10, loss=float("nan"))


def test_the_callback_stops_fit_at_the_first_epoch_end_after_the_drift():
    strategy = mirrored(2)
    model = _model(strategy)
    kernel = model.weights[0]._value
    x, y = np.ones((64, 3), "float32"), np.zeros((64, 2), "float32")
    model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[tfstrategy.divergence_sentinel()])
    traced = SENTINELS.get(model)  # each fit's new callback reuses the model's traced check

    class Drift(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                kernel.values[1].assign(kernel.values[1] + 1.0)

    with pytest.raises(DivergenceError, match=r"at step 16: replica 1 has checksum"):
        model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[Drift(), tfstrategy.divergence_sentinel()])
    assert SENTINELS.get(model) is traced and traced.checks == 4


def test_make_train_step_checks_at_each_epoch_end():
    import tensorflow as tf

    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.01)
    step = tfstrategy.make_train_step(model, strategy=strategy, global_batch=4, optimizer=optimizer,
                                      loss=keras.losses.MeanSquaredError(reduction="none"), sentinel=True)
    data = tfstrategy.prepare_dataset(tf.data.Dataset.from_tensor_slices((np.ones((8, 3), "float32"),
                                                                          np.zeros((8, 2), "float32"))),
                                      strategy, global_batch=4)
    distributed = strategy.experimental_distribute_dataset(data)
    step.run_epoch(distributed)
    assert step.sentinel.checks == 1
    kernel = model.weights[0]._value
    kernel.values[1].assign(kernel.values[1] + 1.0)
    with pytest.raises(DivergenceError, match="replica 1"):
        step.run_epoch(distributed)


def test_add_sentinel_adds_one_callback_unless_off():
    model = _model(mirrored(1))
    kwargs = {}
    add_sentinel(model, kwargs, "epoch")
    add_sentinel(model, kwargs, "epoch")
    assert [type(callback).__name__ for callback in kwargs["callbacks"]] == ["DivergenceSentinel"]
    untouched = {}
    add_sentinel(model, untouched, None)
    assert untouched == {}
