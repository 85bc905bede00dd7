"""An unchanged script with a float16 softmax output: `tfstrategy run --precision` sets its policy."""

import keras
import numpy as np

inputs = keras.Input((4,))
model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="probs")(inputs))
model.compile("sgd", "mse")
model.fit(np.ones((8, 4)), np.ones((8, 3)), verbose=0)
print("policy", keras.mixed_precision.global_policy().name, model.layers[-1].compute_dtype)
