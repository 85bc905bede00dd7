"""A Keras 2-era script with three of issue 36's bugs at once, unchanged (no tfstrategy import).

As TensorFlow's MirroredStrategy migration guide writes it: the model built in ``strategy.scope()``,
``compile()`` after the block (keras_compile_scope) with ``tf.keras.optimizers.legacy.Adam``
(keras_legacy_optimizers), then ``fit(x, y, batch_size=8)`` on 33 NumPy examples, whose last batch of 1
leaves a replica without an example (keras_uneven_batches). Writes each worker's weights and logs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf


def train(strategy):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(33, 4)).astype("float32")
    y = rng.normal(size=(33, 1)).astype("float32")
    tf.keras.utils.set_random_seed(1)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3, activation="tanh"),
                                     tf.keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer=tf.keras.optimizers.legacy.Adam(learning_rate=0.01), metrics=["mae"])
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model, history.history, model.evaluate(x, y, batch_size=8, verbose=0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    model, history, evaluation = train(tf.distribute.MirroredStrategy())
    index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    (out / f"worker-{index}.json").write_text(json.dumps({
        "weights": [w.tolist() for w in model.get_weights()], "history": history, "evaluation": evaluation}))
    print("trained to the end")
