"""A user's script that imports keras before tensorflow (keras then imports TensorFlow mid-import)."""

import keras
import numpy as np
import tensorflow as tf

strategy = tf.distribute.MirroredStrategy()
print("replicas", strategy.num_replicas_in_sync)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=4)
model.fit(np.ones((64, 4), "float32"), np.ones((64, 1), "float32"), batch_size=8, verbose=0)
print("trained", int(model.optimizer.iterations.numpy()))
