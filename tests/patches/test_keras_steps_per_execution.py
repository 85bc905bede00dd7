"""Keras fit with steps_per_execution > 1 on 2+ replicas: fixed, equal to 1 replica, and watched upstream."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from helpers import mirrored
from tfstrategy import _versions, prepare_dataset
from tfstrategy.diagnostics.equivalence import (
    initial_weights,
    max_difference,
    reference_model,
    synthetic_regression,
    train_weights,
)
from tfstrategy.patches import keras_end_of_data as end_of_data
from tfstrategy.patches import keras_steps_per_execution as spe_fix
from tfstrategy.patches.keras_steps_per_execution import fix_steps_per_execution, uses_fixed_loop

pytestmark = [
    pytest.mark.smoke,
    # These tests build their models through tf.keras; under TF_USE_LEGACY_KERAS=1 that is tf_keras,
    # which never had this bug: nothing to patch, nothing to watch.
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or spe_fix.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow: the bug never existed here",
    ),
]


GLOBAL_BATCH = 32
STEPS = 16


@pytest.fixture(scope="module")
def start():
    return initial_weights()


@pytest.fixture
def without_end_of_data():
    """Only this patch decides: an earlier select() in this process may have installed keras_end_of_data,
    whose one-step loop is tfstrategy's too."""
    installed = end_of_data.PATCH.status().installed
    end_of_data.PATCH.remove()
    yield
    if installed:
        end_of_data.PATCH.apply()


@pytest.fixture(scope="module")
def reference(start):
    return train_weights(mirrored(1), "fit", start, global_batch=GLOBAL_BATCH, steps=STEPS)


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_execution", [1, 8])
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_fit_matches_one_replica(replicas, steps_per_execution, start, reference):
    trained = train_weights(
        mirrored(replicas), "fit", start, global_batch=GLOBAL_BATCH, steps=STEPS, steps_per_execution=steps_per_execution
    )
    assert max_difference(trained, reference) <= 1e-5
    assert max_difference(trained, start) > 1e-2  # it did train


def _compiled(replicas: int, steps_per_execution: int, weights):
    strategy = mirrored(replicas)
    with strategy.scope():
        model = reference_model()
        model.set_weights(weights)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], steps_per_execution=steps_per_execution)
    return model


def _data(strategy, steps: int = STEPS, training: bool = True):
    x, y = synthetic_regression(GLOBAL_BATCH * steps)
    return prepare_dataset(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch=GLOBAL_BATCH, training=training)


def test_upstream_keras_still_fails_without_the_fix(start):
    """Fails when Keras fixes the bug: then the probe says so too, and the patch can go."""
    spe_fix.PATCH.remove()
    model = _compiled(2, 8, start)
    try:
        model.fit(_data(model.distribute_strategy), epochs=1, verbose=0)
    except tf.errors.InvalidArgumentError as error:
        assert "You must feed a value for placeholder tensor" in str(error)
    else:
        pytest.fail(
            f"Keras {keras.version()} now runs steps_per_execution=8 on 2 replicas without tfstrategy's fix: "
            "check that StepsPerExecutionPatch's probe says so, and retire the patch."
        )


def test_probe_finds_the_bug_in_keras_own_function():
    found = spe_fix.StepsPerExecutionPatch().probe()
    assert found == {"TensorFlowTrainer._make_function": True}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("replicas", "steps_per_execution", "fixed"),
    [
        pytest.param(2, 8, True, id="2-replicas-spe8-fixed"),
        pytest.param(1, 8, False, id="1-replica-keeps-keras"),
        pytest.param(2, 1, False, id="spe1-keeps-keras"),
    ],
)
def test_fix_applies_only_where_needed(replicas, steps_per_execution, fixed, start, without_end_of_data):
    model = _compiled(replicas, steps_per_execution, start)
    assert fix_steps_per_execution(model) is True
    validation = _data(model.distribute_strategy, 4, False) if fixed else None
    history = model.fit(_data(model.distribute_strategy), validation_data=validation, verbose=0)
    assert uses_fixed_loop(model, "train") is fixed
    assert int(model.optimizer.iterations.numpy()) == STEPS
    if fixed:
        assert uses_fixed_loop(model, "test")
        assert set(history.history) == {"loss", "mae", "val_loss", "val_mae"}


@pytest.mark.slow
def test_fixed_fit_handles_a_partial_last_execution_and_unknown_size(start):
    # 20 steps at 8 per execution: 8 + 8 + 4, twice, on data whose size tf.data cannot know.
    # (Plain Keras on 4 replicas counts 41 or 42 iterations here: its get_next() at the end
    # of the data ticks the counter before failing. The fixed loop runs no step then.)
    model = _compiled(4, 8, start)
    fix_steps_per_execution(model)
    model.fit(_data(model.distribute_strategy, steps=20).filter(lambda x, y: True), epochs=2, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 40
    one = _compiled(1, 1, start)
    one.fit(_data(one.distribute_strategy, steps=20), epochs=2, verbose=0, shuffle=False)
    assert max_difference(model.get_weights(), one.get_weights()) <= 1e-5


@pytest.mark.slow
def test_fixed_evaluate_and_train_on_batch_match_one_replica(start):
    model, one = _compiled(4, 8, start), _compiled(1, 1, start)
    fix_steps_per_execution(model)
    evaluated = [m.evaluate(_data(m.distribute_strategy, 8, False), verbose=0, return_dict=True) for m in (model, one)]
    assert evaluated[0]["loss"] == pytest.approx(evaluated[1]["loss"], rel=1e-5)
    x, y = synthetic_regression(GLOBAL_BATCH)
    for m in (model, one):
        m.reset_metrics()  # train_on_batch resets them itself only from Keras 3.15
    losses = [float(m.train_on_batch(x, y)[0]) for m in (model, one)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_apply_then_remove_restores_keras_own_function():
    from keras.src.backend.tensorflow import trainer

    spe_fix.PATCH.remove()  # earlier tests installed it
    original = trainer.TensorFlowTrainer._make_function
    try:
        status = spe_fix.PATCH.apply()
        assert status.installed == ("TensorFlowTrainer._make_function",)
        assert trainer.TensorFlowTrainer._make_function is not original
        assert spe_fix.PATCH.original("TensorFlowTrainer._make_function") is original
    finally:
        status = spe_fix.PATCH.remove()
    assert status.installed == ()
    assert trainer.TensorFlowTrainer._make_function is original
