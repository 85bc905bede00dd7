"""Shaped like TensorFlow's tutorial "Distributed training with Keras"
(tensorflow/docs, site/en/tutorials/distribute/keras.ipynb): the dataset is loaded before the
strategy (tfds.load there, TensorFlow ops here), MirroredStrategy(), a global batch of 64 per
replica, a CNN compiled in the scope, callbacks TensorBoard('./logs'),
ModelCheckpoint('./training_checkpoints/ckpt_{epoch:04d}.weights.h5', save_weights_only=True),
LearningRateScheduler and a PrintLR callback; then the newest checkpoint is loaded with
load_weights, the model evaluated, saved as my_model.keras and reloaded both outside and inside
the strategy's scope.

Changed: MNIST is 384 random uint8 (28, 28, 1) images from tf.data (the same dtype and shape as
tfds yields), the CNN is narrower, 2 epochs instead of 12.
"""

import os
import pathlib

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(3)

# tfds.load(name='mnist', with_info=True, as_supervised=True): TensorFlow ops before the strategy.
rng = np.random.default_rng(0)
mnist_train = tf.data.Dataset.from_tensor_slices(
    (rng.integers(0, 256, (384, 28, 28, 1), dtype=np.uint8), rng.integers(0, 10, 384)))
mnist_test = tf.data.Dataset.from_tensor_slices(
    (rng.integers(0, 256, (128, 28, 28, 1), dtype=np.uint8), rng.integers(0, 10, 128)))

strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

BUFFER_SIZE = 10000
BATCH_SIZE_PER_REPLICA = 64
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync


def scale(image, label):
    image = tf.cast(image, tf.float32)
    image /= 255
    return image, label


train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE, seed=1).batch(BATCH_SIZE)
eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(learning_rate=0.001),
                  metrics=["accuracy"])

checkpoint_dir = "./training_checkpoints"
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch:04d}.weights.h5")


def decay(epoch):
    if epoch < 3:
        return 1e-3
    if 3 <= epoch < 7:
        return 1e-4
    return 1e-5


class PrintLR(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"\nLearning rate for epoch {epoch + 1} is {model.optimizer.learning_rate.numpy()}")


callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir="./logs"),
    tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    tf.keras.callbacks.LearningRateScheduler(decay),
    PrintLR(),
]
history = model.fit(train_dataset, epochs=2, callbacks=callbacks, verbose=2)

latest_checkpoint = sorted(pathlib.Path(checkpoint_dir).glob("*"))[-1]
model.load_weights(latest_checkpoint)
eval_loss, eval_acc = model.evaluate(eval_dataset, verbose=2)
print(f"Eval loss: {eval_loss}, Eval accuracy: {eval_acc}")

path = "my_model.keras"
model.save(path)

unreplicated_model = tf.keras.models.load_model(path)
unreplicated_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])
eval_loss, eval_acc = unreplicated_model.evaluate(eval_dataset, verbose=2)
print(f"Eval loss: {eval_loss}, Eval Accuracy: {eval_acc}")

with strategy.scope():
    replicated_model = tf.keras.models.load_model(path)
    replicated_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                             optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])
    eval_loss, eval_acc = replicated_model.evaluate(eval_dataset, verbose=2)
    print(f"Eval loss: {eval_loss}, Eval Accuracy: {eval_acc}")

weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
