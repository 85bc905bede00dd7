"""BatchNormalization's moving statistics stay one value on 2 replicas (the matrix's
`layers:batch_norm_moving_statistics`), and one device and ``synchronized=True`` stay Keras' own, bit for bit."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.errors import TrainingError
from tfstrategy.patches import keras_batch_norm_statistics as statistics

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or statistics.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow",
    ),
]

#: Replica 0 gets rows 0-3 (mean 1.5), replica 1 rows 4-7 (mean 5.5) of one feature.
ROWS = np.arange(8, dtype="float32").reshape(2, 4, 1)


@pytest.fixture(scope="module")
def two_replicas():
    return tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches


def _custom_loop(strategy, synchronized=False, steps=2, inside=None):
    """A custom loop as TensorFlow's tutorial writes it: the layer made in the scope, built by its first call
    inside ``strategy.run`` in a ``tf.function`` (``synchronized=True`` built in the scope: its first call's
    all-reduce in Keras' lazy build fails with "You must feed a value for placeholder tensor", patched or not);
    each replica's copies of the moving mean and variance, and the last step's outputs."""
    with strategy.scope():
        layer = keras.layers.BatchNormalization(momentum=0.5, synchronized=synchronized)
        if synchronized:
            layer.build((None, 1))
    rows = tf.constant(ROWS)

    def replica_step():
        context = tf.distribute.get_replica_context()
        part = tf.gather(rows, context.replica_id_in_sync_group) if context.num_replicas_in_sync > 1 else rows[0]
        return (inside or (lambda call: call()))(lambda: layer(part, training=True))

    step = tf.function(lambda: strategy.run(replica_step))
    for _ in range(steps):
        outputs = step()
    copies = [[np.asarray(one) for one in strategy.experimental_local_results(moving.value)]
              for moving in (layer.moving_mean, layer.moving_variance)]
    return layer, copies, [np.asarray(one) for one in strategy.experimental_local_results(outputs)]


def _without_the_patch(run):
    statistics.PATCH.remove()
    try:
        return run()
    finally:
        statistics.PATCH.apply()


def test_a_custom_loop_on_two_replicas_keeps_one_value_the_replicas_mean(two_replicas):
    layer, (means, variances), _ = _custom_loop(two_replicas)
    assert layer.moving_mean.aggregation == "mean" and layer.gamma.aggregation == "none"
    # Each step moves the statistics by the replicas' mean statistics: mean (1.5 + 5.5) / 2, variance 1.25 each.
    expected_mean = 0.5 * (0.5 * 0.0 + 0.5 * 3.5) + 0.5 * 3.5
    expected_variance = 0.5 * (0.5 * 1.0 + 0.5 * 1.25) + 0.5 * 1.25
    for copy in means:
        np.testing.assert_allclose(copy, [expected_mean], rtol=1e-6)
    for copy in variances:
        np.testing.assert_allclose(copy, [expected_variance], rtol=1e-6)
    assert statistics.PATCH.change() is not None


def test_without_the_patch_the_copies_drift(two_replicas):
    _, (means, _variances), _ = _without_the_patch(lambda: _custom_loop(two_replicas))
    assert not np.array_equal(means[0], means[1])


def test_one_device_and_synchronized_are_keras_own_bit_for_bit(two_replicas):
    """Do no harm: where the bug's condition (2+ replicas, ``synchronized=False``) does not hold, the variables,
    statistics and outputs are the unpatched ones."""
    one_device = tf.distribute.get_strategy()
    patched = [_custom_loop(one_device), _custom_loop(two_replicas, synchronized=True)]
    plain = _without_the_patch(lambda: [_custom_loop(one_device), _custom_loop(two_replicas, synchronized=True)])
    for (layer, copies, outputs), (plain_layer, plain_copies, plain_outputs) in zip(patched, plain, strict=True):
        assert layer.moving_mean.aggregation == plain_layer.moving_mean.aggregation == "none"
        for mine, theirs in zip(copies + [outputs], plain_copies + [plain_outputs], strict=True):
            for one, other in zip(mine, theirs, strict=True):
                np.testing.assert_array_equal(one, other)


@pytest.mark.parametrize("inside", ["cond", "while_loop"])
def test_trained_inside_control_flow_in_strategy_run_it_is_refused_in_one_line(two_replicas, inside):
    """The documented cost: each update is a synchronisation point, which TensorFlow refuses inside a ``tf.cond``
    or ``tf.while_loop`` in the replica function (as for ``synchronized=True``); plain Keras runs it, with the
    drift. The refusal names the layer, why, and what to write instead."""
    def in_a_while_loop(call):
        return tf.while_loop(lambda i, _: i < 1, lambda i, _: (i + 1, call()), (0, tf.zeros((4, 1))))[1]

    wrap = {"cond": lambda call: tf.cond(tf.constant(True), call, call), "while_loop": in_a_while_loop}[inside]
    with pytest.raises(TrainingError) as refused:
        _custom_loop(two_replicas, steps=1, inside=wrap)
    # Raised while the step is traced: TensorFlow's autograph puts "in user code:" and the call's lines above it.
    (line,) = [line for line in str(refused.value).splitlines() if "Received BatchNormalization '" in line]
    assert "tf.cond or tf.while_loop within the function given to strategy.run, on 2 replicas" in line
    assert line.rstrip().endswith("Call the layer outside the tf.cond/tf.while_loop, use LayerNormalization there, or "
                                  "train on one device.")
    _, (means, _variances), _ = _without_the_patch(lambda: _custom_loop(two_replicas, steps=1, inside=wrap))
    assert not np.array_equal(means[0], means[1])


def test_remove_restores_keras_add_weight_and_call():
    from keras.src.layers.layer import Layer
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    statistics.PATCH.apply()
    assert "add_weight" in vars(BatchNormalization)
    statistics.PATCH.remove()
    try:
        assert "add_weight" not in vars(BatchNormalization) and BatchNormalization.add_weight is Layer.add_weight
        assert BatchNormalization.call is statistics.PATCH.original(statistics.CALL)  # Keras' own, unwrapped
    finally:
        statistics.PATCH.apply()


def test_upstream_keras_still_lets_the_moving_statistics_drift():
    """Fails once Keras keeps one value of the moving statistics on every replica: drop keras_batch_norm_statistics."""
    assert statistics.BatchNormStatisticsPatch().needed() is True
