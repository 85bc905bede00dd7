"""An unchanged-looking Keras script whose worker 1 drifts at epoch 1 (for `launch`'s default sentinel)."""

from __future__ import annotations

import os

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")


class Drift(keras.callbacks.Callback):
    """Worker 1 alone changes its copy of the kernel: nothing in TensorFlow notices."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1 and os.environ["TFSTRATEGY_WORKER_INDEX"] == "1":
            kernel = self.model.weights[0]
            kernel.assign(kernel + 1.0)


x = np.ones((64, 4), "float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = tf.data.Dataset.from_tensor_slices((x, np.zeros((64, 1), "float32"))).batch(16).with_options(options)
model.fit(data, epochs=3, verbose=0, callbacks=[Drift()])
print("trained to the end", flush=True)
