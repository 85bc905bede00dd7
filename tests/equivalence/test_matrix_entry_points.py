"""The equivalence matrix, area `entry`: fit, evaluate, predict, the *_on_batch calls, a train_step/test_step
written as keras.io's guide writes it, and a strategy.run loop.

Each cell on one device and on 2 replicas, compared (rows, drivers and KNOWN: matrix_cells.py)."""

from __future__ import annotations

import pytest

import matrix_cells

pytestmark = pytest.mark.slow  # each cell trains twice: ~1-3 s of CPU, the area about 15 s


@pytest.mark.parametrize("cell", matrix_cells.params("entry"))
def test_two_replicas_match_one_device(cell):
    outcome = matrix_cells.run_cell(cell)
    assert outcome.equal, f"{cell.id}: {outcome.line()}"
