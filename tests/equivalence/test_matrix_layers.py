"""The equivalence matrix, area `layers`: layers with state or randomness (Dropout, GaussianNoise, a custom layer
drawing from a SeedGenerator, BatchNormalization trained and in inference, a fixed `Input(batch_size=...)`, a
stateful LSTM).

Each cell on one device and on 2 replicas, compared (rows, drivers and KNOWN: matrix_cells.py)."""

from __future__ import annotations

import pytest

import matrix_cells

pytestmark = pytest.mark.slow  # each cell runs twice (one device, 2 replicas)


@pytest.mark.parametrize("cell", matrix_cells.params("layers"))
def test_two_replicas_match_one_device(cell):
    outcome = matrix_cells.run_cell(cell)
    assert outcome.equal, f"{cell.id}: {outcome.line()}"
