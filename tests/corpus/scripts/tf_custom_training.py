"""Shaped like TensorFlow's tutorial "Custom training with tf.distribute.Strategy"
(tensorflow/docs, site/en/tutorials/distribute/custom_training.ipynb): Fashion-MNIST-shaped numpy
images, MirroredStrategy(), GLOBAL_BATCH_SIZE = 64 per replica, experimental_distribute_dataset,
a loss with reduction NONE averaged by tf.nn.compute_average_loss plus scaled regularization
losses, strategy.run inside a tf.function step reduced with ReduceOp.SUM, metrics made in the
scope and reset every epoch, tf.train.Checkpoint(optimizer=..., model=...).save every
other epoch into ./training_checkpoints, then a new model restored from
tf.train.latest_checkpoint and evaluated without the strategy.

Changed: 384 random (28, 28, 1) float32 images, narrower layers, 3 epochs instead of 10; the
metrics are reset with reset_state(), the Keras 3 name of the tutorial's reset_states().
"""

import os

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(5)

rng = np.random.default_rng(0)
train_images = rng.integers(0, 256, (384, 28, 28), dtype=np.uint8)[..., None] / np.float32(255)
train_labels = rng.integers(0, 10, 384).astype(np.uint8)
test_images = rng.integers(0, 256, (128, 28, 28), dtype=np.uint8)[..., None] / np.float32(255)
test_labels = rng.integers(0, 10, 128).astype(np.uint8)

strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")

BUFFER_SIZE = len(train_images)
BATCH_SIZE_PER_REPLICA = 64
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = 3

train_dataset = tf.data.Dataset.from_tensor_slices((train_images, train_labels)).shuffle(
    BUFFER_SIZE, seed=2).batch(GLOBAL_BATCH_SIZE)
test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)


def create_model():
    regularizer = tf.keras.regularizers.L2(1e-5)
    return tf.keras.Sequential([
        tf.keras.layers.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=regularizer),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
        tf.keras.layers.Dense(10, kernel_regularizer=regularizer),
    ])


checkpoint_dir = "./training_checkpoints"
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")

with strategy.scope():
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def compute_loss(labels, predictions, model_losses):
        per_example_loss = loss_object(labels, predictions)
        loss = tf.nn.compute_average_loss(per_example_loss)
        if model_losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
        return loss

    test_loss = tf.keras.metrics.Mean(name="test_loss")
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    model = create_model()
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)


def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
        predictions = model(images, training=True)
        loss = compute_loss(labels, predictions, model.losses)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    train_accuracy.update_state(labels, predictions)
    return loss


def test_step(inputs):
    images, labels = inputs
    predictions = model(images, training=False)
    test_loss.update_state(loss_object(labels, predictions))
    test_accuracy.update_state(labels, predictions)


@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


@tf.function
def distributed_test_step(dataset_inputs):
    return strategy.run(test_step, args=(dataset_inputs,))


for epoch in range(EPOCHS):
    total_loss = 0.0
    num_batches = 0
    for x in train_dist_dataset:
        total_loss += distributed_train_step(x)
        num_batches += 1
    train_loss = total_loss / num_batches
    for x in test_dist_dataset:
        distributed_test_step(x)
    if epoch % 2 == 0:
        checkpoint.save(checkpoint_prefix)
    print(f"Epoch {epoch + 1}, Loss: {float(train_loss):.6f}, Accuracy: {float(train_accuracy.result()) * 100}, "
          f"Test Loss: {float(test_loss.result())}, Test Accuracy: {float(test_accuracy.result()) * 100}")
    test_loss.reset_state()
    train_accuracy.reset_state()
    test_accuracy.reset_state()

eval_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="eval_accuracy")
new_model = create_model()
new_optimizer = tf.keras.optimizers.Adam()
test_dataset = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)


@tf.function
def eval_step(images, labels):
    predictions = new_model(images, training=False)
    eval_accuracy(labels, predictions)


checkpoint = tf.train.Checkpoint(optimizer=new_optimizer, model=new_model)
checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))
for images, labels in test_dataset:
    eval_step(images, labels)
print(f"Accuracy after restoring the saved model without strategy: {float(eval_accuracy.result()) * 100}")

weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {float(train_loss):.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
