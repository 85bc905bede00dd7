"""Shaped like the Keras guide "Training & evaluation with the built-in methods"
(keras-team/keras-io, guides/training_with_built_in_methods.py, sections "Using callbacks" and
"Checkpointing models") and TensorFlow's tutorial "Save and load models" (tensorflow/docs,
site/en/tutorials/keras/save_and_load.ipynb), with the model built in a MirroredStrategy() scope as
the Keras distributed-training guide does: fit with EarlyStopping,
ModelCheckpoint("mymodel_{epoch}.keras", save_best_only=True, monitor="val_loss", verbose=1),
a weights-only ModelCheckpoint("training_2/cp-{epoch:04d}.weights.h5", save_freq=2 * n_batches),
TensorBoard(log_dir="./logs", histogram_freq=0, embeddings_freq=0, update_freq="epoch") and
CSVLogger("training.log"); then model.save_weights, keras.saving.save_model, load_model of the
newest checkpoint, evaluate and predict.

Changed: 320 random (784,) inputs instead of MNIST, a narrower model, 4 epochs.
"""

import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(13)


def get_uncompiled_model():
    inputs = keras.Input(shape=(784,), name="digits")
    x = keras.layers.Dense(16, activation="relu", name="dense_1")(inputs)
    x = keras.layers.Dense(16, activation="relu", name="dense_2")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="predictions")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def get_compiled_model():
    model = get_uncompiled_model()
    model.compile(optimizer="rmsprop", loss="sparse_categorical_crossentropy",
                  metrics=["sparse_categorical_accuracy"])
    return model


rng = np.random.default_rng(0)
x_train = rng.random((320, 784), dtype=np.float32)
y_train = rng.integers(0, 10, 320)
x_test = rng.random((64, 784), dtype=np.float32)
y_test = rng.integers(0, 10, 64)

strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = get_compiled_model()

batch_size = 64
n_batches = len(x_train) * 4 // 5 // batch_size
callbacks = [
    keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=1e-2, patience=2, verbose=1),
    keras.callbacks.ModelCheckpoint(filepath="mymodel_{epoch}.keras", save_best_only=True, monitor="val_loss",
                                    verbose=1),
    keras.callbacks.ModelCheckpoint(filepath="training_2/cp-{epoch:04d}.weights.h5", save_weights_only=True,
                                    save_freq=2 * n_batches, verbose=1),
    keras.callbacks.TensorBoard(log_dir="./logs", histogram_freq=0, embeddings_freq=0, update_freq="epoch"),
    keras.callbacks.CSVLogger("training.log"),
]
history = model.fit(x_train, y_train, epochs=4, batch_size=batch_size, callbacks=callbacks, validation_split=0.2,
                    verbose=2)

os.makedirs("./checkpoints", exist_ok=True)
model.save_weights("./checkpoints/my_checkpoint.weights.h5")
keras.saving.save_model(model, "my_model.keras")

newest = max((name for name in os.listdir(".") if name.startswith("mymodel_")), key=os.path.getmtime)
print("Restoring from", newest)
restored = keras.models.load_model(newest)
loss, accuracy = restored.evaluate(x_test, y_test, verbose=2)
print(f"Restored model, accuracy: {100 * accuracy:5.2f}%")
predictions = model.predict(x_test[:3], verbose=0)
print("predictions shape:", predictions.shape)

weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {model.distribute_strategy.num_replicas_in_sync} strategy {type(model.distribute_strategy).__name__}")
