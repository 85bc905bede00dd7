"""A user's script (no tfstrategy): MirroredStrategy(), compile(steps_per_execution=8), fit; saves the weights."""

import sys

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
print(f"replicas {strategy.num_replicas_in_sync}", flush=True)
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")
with strategy.scope():
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="tanh"), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=8)
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=4, verbose=0)
weights = {f"w{i}": w for i, w in enumerate(model.get_weights())}
np.savez(sys.argv[1], iterations=int(model.optimizer.iterations.numpy()), **weights)
