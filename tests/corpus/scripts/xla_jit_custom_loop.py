"""Shaped like TensorFlow's XLA tutorial "Use XLA with tf.function" (tensorflow/tensorflow,
tensorflow/compiler/xla docs: tutorials/jit_compile.ipynb) run under a strategy as TensorFlow's
custom-training tutorial does: MNIST-shaped images cast and flattened, one Dense(10) layer and an
SGD optimizer made in MirroredStrategy()'s scope, a training function decorated
@tf.function(jit_compile=True) computing the softmax cross-entropy and applying the gradients,
called through strategy.run on each batch of experimental_distribute_dataset; the loss is reduced
over the replicas.

Changed: 512 random uint8 (28, 28) images instead of MNIST; a fixed global batch of 64; 3 passes.
"""

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(19)

rng = np.random.default_rng(0)
images = rng.integers(0, 256, (512, 28, 28), dtype=np.uint8)
labels = rng.integers(0, 10, 512).astype(np.uint8)

strategy = tf.distribute.MirroredStrategy()
GLOBAL_BATCH = 64
train_ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH, drop_remainder=True)
dist_ds = strategy.experimental_distribute_dataset(train_ds)


def cast(images, labels):
    images = tf.cast(tf.reshape(images, [-1, 784]), tf.float32) / 255.0
    labels = tf.cast(labels, tf.int64)
    return images, labels


with strategy.scope():
    layer = tf.keras.layers.Dense(10)
    layer.build((None, 784))
    optimizer = tf.keras.optimizers.SGD(0.1)


@tf.function(jit_compile=True)
def train_mnist(images, labels):
    images, labels = cast(images, labels)
    with tf.GradientTape() as tape:
        predicted_labels = layer(images)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(logits=predicted_labels, labels=labels)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
    layer_variables = layer.trainable_variables
    grads = tape.gradient(loss, layer_variables)
    optimizer.apply_gradients(zip(grads, layer_variables))
    return loss


@tf.function
def distributed_step(batch):
    per_replica = strategy.run(train_mnist, args=batch)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


for epoch in range(3):
    for batch in dist_ds:
        loss = distributed_step(batch)
    print(f"epoch {epoch + 1} loss {float(loss):.6f}")

weights = sum(float(np.abs(w).sum()) for w in layer.get_weights())
print(f"final loss {float(loss):.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
