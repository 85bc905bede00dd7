"""A user's script (no tfstrategy) with the classic mistake: the optimizer made outside the scope."""

import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
optimizer = tf.keras.optimizers.Adam()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
x = np.ones((64, 4), "float32")
model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)  # plain Keras fails here in its own way
print("steps trained", flush=True)
