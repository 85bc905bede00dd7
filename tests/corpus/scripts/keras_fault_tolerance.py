"""Shaped like the Keras guide "Multi-GPU distributed training with TensorFlow"
(keras-team/keras-io, guides/distributed_training_with_tensorflow.py): a compiled functional MLP
on MNIST-shaped data, fit/evaluate under MirroredStrategy(), then the guide's fault-tolerance
recipe: ModelCheckpoint(filepath="./ckpt/ckpt-{epoch}.keras"), and make_or_restore_model()
loading the newest file of ./ckpt with keras.models.load_model before training again.

Changed: MNIST is replaced by 512 random (784,) float32 images and int labels, the layers are
narrower, and there are fewer epochs; the calls and their order are the guide's.
"""

import os

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(7)


def get_compiled_model():
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(32, activation="relu")(inputs)
    x = keras.layers.Dense(32, activation="relu")(x)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def get_dataset():
    batch_size = 32
    num_val_samples = 128
    rng = np.random.default_rng(0)
    x_train = rng.random((512, 784), dtype=np.float32)
    y_train = rng.integers(0, 10, 512)
    x_test = rng.random((128, 784), dtype=np.float32)
    y_test = rng.integers(0, 10, 128)
    x_val, y_val = x_train[-num_val_samples:], y_train[-num_val_samples:]
    x_train, y_train = x_train[:-num_val_samples], y_train[:-num_val_samples]
    return (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size),
    )


strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

with strategy.scope():
    model = get_compiled_model()

train_dataset, val_dataset, test_dataset = get_dataset()
model.fit(train_dataset, epochs=2, validation_data=val_dataset, verbose=2)
model.evaluate(test_dataset, verbose=2)

# The guide's fault-tolerance part: checkpoints in ./ckpt, the newest one restored.
checkpoint_dir = "./ckpt"
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)


def make_or_restore_model():
    checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    return get_compiled_model()


def run_training(epochs=1):
    strategy = tf.distribute.MirroredStrategy()
    with strategy.scope():
        model = make_or_restore_model()
    callbacks = [keras.callbacks.ModelCheckpoint(filepath=checkpoint_dir + "/ckpt-{epoch}.keras", save_freq="epoch")]
    history = model.fit(train_dataset, epochs=epochs, callbacks=callbacks, verbose=2)
    return model, history


run_training(epochs=1)
model, history = run_training(epochs=1)
loss, accuracy = model.evaluate(test_dataset, verbose=2)
weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {model.distribute_strategy.num_replicas_in_sync} strategy {type(model.distribute_strategy).__name__}")
