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
