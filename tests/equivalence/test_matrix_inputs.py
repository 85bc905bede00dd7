"""The equivalence matrix, area `inputs`: NumPy with uneven last batches, tf.data (finite and repeated),
sample and class weights, validation data and split.

Each cell on one device and on 2 replicas, compared (rows, drivers and KNOWN: matrix_cells.py)."""

from __future__ import annotations

import pytest

import matrix_cells

pytestmark = pytest.mark.slow  # each cell trains twice: ~1-3 s of CPU, the area about 15 s


@pytest.mark.parametrize("cell", matrix_cells.params("inputs"))
def test_two_replicas_match_one_device(cell):
    outcome = matrix_cells.run_cell(cell)
    assert outcome.equal, f"{cell.id}: {outcome.line()}"
