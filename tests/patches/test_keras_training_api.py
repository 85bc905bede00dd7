"""What the eight training-API patches of issue 44 share: across workers they act without a probe (up to the
verified release), so every worker builds the same step even where a worker has one device and no probe can run."""

from __future__ import annotations

import pytest

from tfstrategy import _versions
from tfstrategy.patches import (
    keras_batch_norm_statistics,
    keras_clipping,
    keras_compute_loss,
    keras_cross_replica_loss,
    keras_gradient_accumulation,
    keras_predict_on_batch,
    keras_replica_seeds,
    keras_stateful_rnn,
)
from tfstrategy.patches.keras_mwms import stand_in_strategy

pytestmark = pytest.mark.skipif(
    _versions.legacy_keras_requested() or keras_clipping.PATCH.target_module() is None,
    reason="tf.keras is not Keras 3 on TensorFlow",
)


@pytest.mark.parametrize("make", [keras_predict_on_batch.PredictOnBatchPatch, keras_compute_loss.ComputeLossPatch,
                                  keras_clipping.ClippingPatch, keras_gradient_accumulation.GradientAccumulationPatch,
                                  keras_replica_seeds.ReplicaSeedsPatch, keras_stateful_rnn.StatefulRnnPatch,
                                  keras_batch_norm_statistics.BatchNormStatisticsPatch,
                                  keras_cross_replica_loss.CrossReplicaLossPatch],
                         ids=lambda make: make.__name__)
def test_across_workers_the_fix_acts_without_a_probe(make):
    patch = make()
    assert patch.acts_on(stand_in_strategy([])) is True  # a multi-worker MWMS on /device:CPU:0, no cluster
    assert patch.status().needed is None  # nothing probed
