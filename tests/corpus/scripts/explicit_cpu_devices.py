"""Shaped like Keras' own TensorFlow distribution test (keras-team/keras,
keras/src/backend/tensorflow/distribute_test.py) and the "logical devices" recipe of TensorFlow's
GPU guide (tensorflow/docs, site/en/guide/gpu.ipynb): the script splits the CPU into two logical
devices itself with tf.config.set_logical_device_configuration, then names them,
tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]), builds and compiles a model in the scope, and
calls fit, evaluate and predict on numpy arrays with a fixed global batch.

Changed: the test's assertions are prints; the data are 256 random (8,) rows with a linear target.
"""

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(17)

cpus = tf.config.list_physical_devices("CPU")
if len(tf.config.get_logical_device_configuration(cpus[0]) or []) < 2:
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])

strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
print("replicas", strategy.num_replicas_in_sync)

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")

history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=2)
print("evaluate", model.evaluate(x, y, batch_size=32, verbose=0))
print("predict", model.predict(x[:4], batch_size=2, verbose=0).ravel())

weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
