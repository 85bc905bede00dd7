"""``compile(jit_compile=True)`` under MirroredStrategy with ``mixed_float16``, as keras-team/keras#21366 runs it.

The shape of the issue (and of #19005): the ``mixed_float16`` global policy, a model built and compiled with
``jit_compile=True`` in a 2-device ``MirroredStrategy`` scope, a float32 output layer, ``fit`` on NumPy arrays.
Plain Keras 3 fails at the first step; tfstrategy turns XLA off, says so in one line, and trains like one device.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import _versions
from tfstrategy.diagnostics.equivalence import TOLERANCES
from tfstrategy.patches import keras_jit_compile as jit

pytestmark = [
    pytest.mark.smoke,
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or jit.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow: tf_keras compiles each replica's step",
    ),
]


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def _fit(strategy, jit_compile):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=jit_compile)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    return model


def test_jit_compile_on_two_replicas_is_turned_off_in_one_line_and_trains_like_one_device(mixed_float16):
    strategy = tfstrategy.select(devices=["/cpu:0", "/cpu:1"], env={}).strategy  # applies the registry's patches
    with pytest.warns(UserWarning, match=r"jit_compile=True under MirroredStrategy with 2 devices on this host: XLA turned "
                                         r"off.*keras-team/keras#21366.*jit_compile='auto', turns XLA off"):
        model = _fit(strategy, jit_compile=True)
    assert model.jit_compile is False
    reference = _fit(tf.distribute.get_strategy(), jit_compile=False)
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights()))
    assert difference <= TOLERANCES["mixed_float16"]


def test_one_device_keeps_jit_compile():
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert model.jit_compile is True


def test_upstream_keras_still_fails_jit_compile_on_two_replicas():
    """Fails once Keras' own jit_compile=True fit runs on 2 devices: drop keras_jit_compile."""
    assert jit.JitCompilePatch().needed() is True


def test_a_multi_worker_strategy_on_cpus_gets_the_line_without_a_probe():
    """Across workers on CPUs XLA cannot compile the collective (the workers abort); no probe needs a cluster."""
    from types import SimpleNamespace

    from tfstrategy.patches.keras_mwms import stand_in_strategy

    worker = SimpleNamespace(_distribute_strategy=stand_in_strategy([]))  # a multi-worker MWMS on /device:CPU:0
    assert jit.turned_off(worker) is True
    assert jit.turned_off(SimpleNamespace(_distribute_strategy=None)) is False
