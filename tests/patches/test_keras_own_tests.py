"""Keras' own tests that issue 44 found broken under ``tfstrategy run`` pass there as they pass plain.

The files (from the installed Keras wheel): ``optimizers/loss_scale_optimizer_test.py`` and
``optimizers/optimizer_sparse_test.py`` (correctly scaled gradients passed straight to
``LossScaleOptimizer.apply``, once refused by ``keras_loss_scale_api``), and
``backend/tensorflow/distribute_test.py`` (Keras' tf.distribute tests on ``MirroredStrategy(["CPU:0", "CPU:1"])``,
among them fit with even batches, which ``keras_uneven_batches`` must leave bit for bit as plain).
One pytest process each side; the full comparison is ``benchmarks/keras_own_tests.py``.
"""

from __future__ import annotations

import sys

import pytest

from helpers import ROOT
from tfstrategy import _versions

sys.path.insert(0, str(ROOT / "benchmarks"))
import keras_own_tests  # noqa: E402

FILES = ["optimizers/loss_scale_optimizer_test.py", "optimizers/optimizer_sparse_test.py",
         "backend/tensorflow/distribute_test.py"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(_versions.legacy_keras_requested(), reason="Keras 3's own tests, run on Keras 3")
def test_keras_own_tests_that_regressed_pass_under_run_as_plain():
    comparison = keras_own_tests.compare(keras_own_tests.resolve(FILES), replicas=2, timeout=100)
    print(comparison.table())
    assert comparison.plain.outcomes, comparison.plain.tail
    assert comparison.under_run.outcomes, comparison.under_run.tail
    assert comparison.under_run.outcomes.keys() == comparison.plain.outcomes.keys()
    assert comparison.newly_failing() == [], comparison.under_run.tail
    assert list(comparison.plain.outcomes.values()).count("passed") >= 60  # the files ran, not just collected
