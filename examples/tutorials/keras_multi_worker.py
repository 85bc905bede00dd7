"""A script shaped like TensorFlow's tutorial "Multi-worker training with Keras", unchanged in
everything but its data (synthetic 28x28 images instead of downloading MNIST).

It creates tf.distribute.MultiWorkerMirroredStrategy() itself and never imports tfstrategy:

    tfstrategy launch -n 2 -- python examples/tutorials/keras_multi_worker.py
"""

import json
import os

import numpy as np
import tensorflow as tf


def synthetic_dataset(batch_size):
    rng = np.random.default_rng(0)
    images = rng.random((1024, 28, 28), dtype=np.float32)
    labels = (images.mean(axis=(1, 2)) * 10).astype(np.int64) % 10
    return tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(1024, seed=0).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.InputLayer(input_shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(8, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.01),
        metrics=["accuracy"],
    )
    return model


per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = synthetic_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

history = multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=10, verbose=2)
print(f"final loss {history.history['loss'][-1]:.6f}", flush=True)
