"""An unchanged script with a float16 softmax output: `tfstrategy run --precision` sets its policy."""

import keras

inputs = keras.Input((4,))
m = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="probs")(inputs))
m.compile("sgd", "mse")
import numpy as np

m.fit(np.ones((8, 4)), np.ones((8, 3)), verbose=0)
print("policy", keras.mixed_precision.global_policy().name, m.layers[-1].compute_dtype)
