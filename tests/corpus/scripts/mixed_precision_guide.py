"""Shaped like TensorFlow's guide "Mixed precision" (tensorflow/docs,
site/en/guide/mixed_precision.ipynb), which the Keras mixed precision guide follows: the global
policy mixed_float16, a functional model on MNIST-shaped (784,) inputs whose width depends on
tf.config.list_physical_devices('GPU') (64 units on a CPU), Dense layers in float16, the
output Activation('softmax', dtype='float32'), RMSprop, fit with validation_split=0.2 and a large
batch, then evaluate. No distribution strategy, as in the guide.

Changed: 512 random images instead of MNIST's 60000, batch 256 instead of 8192, 2 epochs.
"""

import numpy as np
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers, mixed_precision

keras.utils.set_random_seed(8)
mixed_precision.set_global_policy("mixed_float16")

inputs = keras.Input(shape=(784,), name="digits")
if tf.config.list_physical_devices("GPU"):
    print("The model will run with 4096 units on a GPU")
    num_units = 4096
else:
    print("The model will run with 64 units on a CPU")
    num_units = 64
dense1 = layers.Dense(num_units, activation="relu", name="dense_1")
x = dense1(inputs)
dense2 = layers.Dense(num_units, activation="relu", name="dense_2")
x = dense2(x)
print(dense1.dtype_policy)
print("x.dtype: %s" % x.dtype)
x = layers.Dense(10, name="dense_logits")(x)
outputs = layers.Activation("softmax", dtype="float32", name="predictions")(x)
print("Outputs dtype: %s" % outputs.dtype)

model = keras.Model(inputs=inputs, outputs=outputs)
model.compile(loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.RMSprop(), metrics=["accuracy"])

rng = np.random.default_rng(0)
x_train = rng.integers(0, 256, (512, 784)).astype("float32") / 255
y_train = rng.integers(0, 10, 512).astype("float32")
x_test = rng.integers(0, 256, (256, 784)).astype("float32") / 255
y_test = rng.integers(0, 10, 256).astype("float32")

history = model.fit(x_train, y_train, batch_size=256, epochs=2, validation_split=0.2, verbose=2)
test_scores = model.evaluate(x_test, y_test, verbose=2)
print("Test loss:", test_scores[0])
print("Test accuracy:", test_scores[1])

weights = sum(float(np.abs(w.astype("float64")).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {model.distribute_strategy.num_replicas_in_sync} strategy {type(model.distribute_strategy).__name__}")
