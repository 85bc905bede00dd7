"""A user's script (no tfstrategy) whose input pipeline waits ~20 ms a step: input-bound, 80 steps.

    python profile_sleepy_input.py

Each batch goes through a ``tf.py_function`` in ``dataset.map`` that sleeps 20 ms (a slow decoder, a
remote read); the model is a small Dense one, so its step is a few milliseconds. At the default probe
share a run this short leaves the probes out: the report concludes from its free samples.
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

STEPS, BATCH = 80, 32


def slow_read(features, labels):
    time.sleep(0.02)
    return features, labels


def main() -> None:
    x = np.random.default_rng(0).normal(size=(STEPS * BATCH, 16)).astype("float32")

    def read(features, labels):
        features, labels = tf.py_function(slow_read, [features, labels], [tf.float32, tf.float32])
        features.set_shape([None, 16])
        labels.set_shape([None, 1])
        return features, labels

    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(BATCH).map(read)
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(8), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(data, epochs=1, verbose=0)


if __name__ == "__main__":
    main()
