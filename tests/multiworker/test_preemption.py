"""SIGTERM during Keras fit: stop at an agreed step, exit 75, resume to the uninterrupted weights.

In one process on 2 replicas (the agreement is a real all-reduce); the same
across Slurm workers is in tests/multiworker/test_slurm.py.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from helpers import mirrored
from tfstrategy.multiworker.preemption import PREEMPTED_EXIT_CODE, preemption_callbacks

STEPS, EPOCHS = 8, 3


def fit(backup_dir, *, term_at=None):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(3)
    strategy = mirrored(2)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * 16, 4)).astype("float32")
    y = (x @ np.ones((4, 1), "float32")).astype("float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    callbacks = preemption_callbacks(backup_dir)

    class SendTerm(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == term_at:
                os.kill(os.getpid(), signal.SIGTERM)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    history = model.fit(dataset, epochs=EPOCHS, callbacks=[SendTerm(), *callbacks], shuffle=False, verbose=0)
    return model, history


@pytest.mark.slow
@pytest.mark.parametrize("term_at", [pytest.param((1, 3), id="mid-epoch"), pytest.param((1, STEPS - 1), id="last-batch")])
def test_sigterm_stops_with_75_and_the_resumed_run_ends_like_an_uninterrupted_one(tmp_path, term_at):
    reference, _ = fit(tmp_path / "reference")
    with pytest.raises(SystemExit) as stopped:
        fit(tmp_path / "preempted", term_at=term_at)
    assert stopped.value.code == PREEMPTED_EXIT_CODE
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler was put back

    resumed, history = fit(tmp_path / "preempted")

    # mid-epoch: epoch 2 is redone from the epoch-1 backup; last batch: epoch 2's backup was written first
    assert len(history.history["loss"]) == (2 if term_at == (1, 3) else 1)
    assert int(resumed.optimizer.iterations.numpy()) == int(reference.optimizer.iterations.numpy()) == STEPS * EPOCHS
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_no_backup_directory_means_no_callbacks(monkeypatch):
    monkeypatch.delenv("TFSTRATEGY_BACKUP_DIR", raising=False)
    assert preemption_callbacks() == []
