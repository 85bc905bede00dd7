"""The matrix's comparison itself, on hand-made results (no training): what it calls equal and what not."""

from __future__ import annotations

import math

import numpy as np
import pytest

import matrix_cells

ONE = {"weights": [np.array([[1.0, 2.0]]), np.array([0.5])], "logs": {"loss": [4.0, 3.0]},
       "predictions": np.array([[1.0], [2.0], [3.0]]), "steps": 8}


def _changed(**changes):
    return {**ONE, **changes}


@pytest.mark.parametrize(
    ("replicas", "equal", "mismatch"),
    [
        pytest.param(ONE, True, None, id="identical"),
        pytest.param(_changed(logs={"loss": [4.0 + 4e-6, 3.0]}), True, None, id="within-rtol"),
        pytest.param(_changed(logs={"loss": [4.0 + 1e-3, 3.0]}), False, "logs.loss off by up to 0.001", id="loss-off"),
        pytest.param(_changed(predictions=np.array([[2.0], [1.0], [3.0]])), False, "predictions off by up to 1",
                     id="rows-swapped"),
        pytest.param(_changed(predictions=np.array([[1.0], [2.0], [3.0], [1.0]])), False,
                     "predictions shape (4, 1) (one device (3, 1))", id="extra-row"),
        pytest.param(_changed(steps=6), False, "steps 6 (one device 8)", id="step-count"),
        pytest.param(_changed(logs={"loss": [4.0, 3.0], "mae": [1.0, 1.0]}), False, "quantities", id="extra-log"),
    ],
)
def test_compare(replicas, equal, mismatch):
    outcome = matrix_cells.compare(ONE, replicas, rtol=1e-5, atol=1e-6)
    assert outcome.equal is equal, outcome.line()
    if mismatch:
        assert any(one.startswith(mismatch) for one in outcome.mismatches), outcome.mismatches


def test_results_survive_the_hook_workers_json():
    # The worker prints lists; compared with the arrays they came from, they are the same results.
    as_json = matrix_cells.to_json(ONE)
    assert matrix_cells.compare(ONE, as_json, rtol=0, atol=0).equal
    assert math.isclose(matrix_cells.compare(ONE, ONE, 0, 0).largest, 0.0)


@pytest.mark.parametrize("halves_alike", [True, False], ids=["halves-alike", "halves-differ"])
def test_the_per_replica_batch_norm_reference_is_keras_own_layer_on_each_half(halves_alike):
    # The batch_norm rows' reference: on a batch whose two halves are the same rows, each half's statistics are the
    # whole batch's, so it must be Keras' own layer (outputs, moving statistics, within float32's sum order); on
    # halves that differ it must not be (else the rows would compare with one device on the global batch).
    import keras

    import matrix_drivers_models as models

    half = np.random.RandomState(0).randn(8, 4).astype("float32")
    batch = np.concatenate([half, half if halves_alike else 3 * half + 1])
    layers = [cls(momentum=0.5) for cls in (keras.layers.BatchNormalization, models.per_replica_batch_normalization())]
    outputs = [np.asarray(layer(batch, training=True)) for layer in layers]
    moving = [np.concatenate([np.asarray(layer.moving_mean), np.asarray(layer.moving_variance)]) for layer in layers]
    same = np.allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-6) and np.allclose(*moving, rtol=1e-5, atol=1e-6)
    assert same is halves_alike
