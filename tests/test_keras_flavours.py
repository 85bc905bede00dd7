"""Every feature on whichever Keras ``tf.keras`` is: Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1.

These are the ``smoke`` tests CI also runs on the oldest supported TensorFlow/Keras
and on tf_keras (``.ci/versions``). They build models through ``tf.keras`` only, so
under TF_USE_LEGACY_KERAS=1 every model, optimizer and metric is tf_keras.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from helpers import ROOT, mirrored, run_cli
from tfstrategy import _compat, _versions
from tfstrategy.errors import ScopeError
from tfstrategy.patches.keras_steps_per_execution import fix_steps_per_execution
from tfstrategy.scope.creation_sites import recording

pytestmark = pytest.mark.smoke

keras = tf.keras
LEGACY = _versions.legacy_keras_requested()


def _model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])


def _data(examples=64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True).astype("float32")


def test_models_are_of_the_expected_flavour():
    with mirrored(1).scope():
        model = _model()
    assert _compat.is_tf_keras_object(model) is LEGACY
    assert _versions.detect().problem() is None


@pytest.mark.slow
def test_check_passes_on_four_replicas():
    result = run_cli("check", "--cpu-replicas", "4", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["replicas"] == 4 and report["variables_in_scope"] is True and report["passed"] is True


def test_audit_names_an_optimizer_made_outside_the_scope():
    strategy = mirrored(2)
    with recording():
        optimizer = keras.optimizers.Adam()  # the stray line the audit must name
        optimizer.build(_model().trainable_variables)
    with strategy.scope():
        model = _model()
    with pytest.raises(ScopeError, match=r"optimizer variables created at tests/test_keras_flavours.py:\d+"):
        tfstrategy.require_scope(model, strategy, optimizer=optimizer)


def test_build_in_scope_and_restore_round_trip(tmp_path):
    strategy = mirrored(2)
    model, report = tfstrategy.build_in_scope(strategy, _model, optimizer="adam", loss="mse", metrics=["mae"])
    assert report.audit.passed and report.audit.counts()["optimizer"] > 0
    x, y = _data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    prefix = checkpoint.save(str(tmp_path / "ckpt"))
    restored, restored_report = tfstrategy.build_in_scope(mirrored(4), _model, optimizer="adam", loss="mse", checkpoint=prefix)
    assert restored_report.restore.step == int(model.optimizer.iterations.numpy()) > 0
    for a, b in zip(restored.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_steps_per_execution_8_on_two_replicas_equals_one_replica():
    x, y = _data(128)
    weights = None
    results = []
    for strategy, steps in ((mirrored(1), 1), (mirrored(2), 8)):
        with strategy.scope():
            model = _model()
            if weights is None:
                weights = model.get_weights()
            model.set_weights(weights)
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=steps)
        fix_steps_per_execution(model)
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
        results.append(model.get_weights())
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
def test_equivalence_check_agrees_and_catches_the_planted_bug():
    result = run_cli("check", "--cpu-replicas", "2", "--equivalence", timeout=300)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.startswith("equivalence_"))
    assert lines["equivalence_fit"].startswith("equal") and lines["equivalence_loop"].startswith("equal")
    assert lines["equivalence_planted_per_replica_mean"].startswith("DIFFERENT")


@pytest.mark.multiprocess
def test_two_worker_fit_agrees_and_the_chief_saves(tmp_path):
    out = tmp_path / "model.keras"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-m", "tfstrategy", "launch", "-n", "2", "--timeout", "120", "--console-workers", "all", "--",
         sys.executable, str(ROOT / "examples" / "multi_worker_train.py"), "--epochs", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = sorted(line.split("final loss ")[1].split()[0] for line in result.stdout.splitlines() if "final loss" in line)
    assert len(losses) == 2 and losses[0] == losses[1]
    assert out.exists()
