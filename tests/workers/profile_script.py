"""A user's script (no tfstrategy) built to be input-, reduction- or compute-bound, for the performance report.

    python profile_script.py input|reduction|compute

- ``input``: a small Dense model on data whose ``map`` runs ~30 ops per element, one element at a time;
- ``reduction``: a wide MLP (256-1024-1024-1, 2.3M weights) on a per-replica batch of 8: on workers over
  loopback its gradient all-reduce outweighs its compute;
- ``compute``: a small CNN on 28x28 images, batch 64, prefetched.

It creates its own strategy: ``MultiWorkerMirroredStrategy()`` under ``TF_CONFIG``, else ``MirroredStrategy()``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf


def dataset(kind: str, replicas: int = 1) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    if kind == "input":
        x = rng.normal(size=(2048, 32)).astype("float32")

        def slow(features, label):
            for _ in range(30):
                features = tf.sin(features) * 1.01 + tf.linalg.matvec(tf.eye(32), features)
            return features, label

        return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).map(slow).batch(64)
    if kind == "reduction":
        x = rng.normal(size=(1024, 256)).astype("float32")
        return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8 * replicas).prefetch(tf.data.AUTOTUNE)
    x = rng.normal(size=(1024, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, size=(1024,))
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(64).prefetch(tf.data.AUTOTUNE)


def model(kind: str) -> tf.keras.Model:
    layers = tf.keras.layers
    if kind == "input":
        built = tf.keras.Sequential([tf.keras.Input((32,)), layers.Dense(16), layers.Dense(1)])
        built.compile(optimizer="adam", loss="mse")
    elif kind == "reduction":
        built = tf.keras.Sequential([tf.keras.Input((256,)), layers.Dense(1024, activation="relu"),
                                     layers.Dense(1024, activation="relu"), layers.Dense(1)])
        built.compile(optimizer="sgd", loss="mse")
    else:
        built = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), layers.Conv2D(32, 3, activation="relu"),
                                     layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(), layers.Flatten(),
                                     layers.Dense(10)])
        built.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return built


def main() -> None:
    kind = sys.argv[1]
    multi = bool(os.environ.get("TF_CONFIG"))
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if multi else tf.distribute.MirroredStrategy()
    with strategy.scope():
        built = model(kind)
    history = built.fit(dataset(kind, strategy.num_replicas_in_sync), epochs=2, verbose=0)
    print(json.dumps({"loss": history.history["loss"]}), flush=True)


if __name__ == "__main__":
    main()
