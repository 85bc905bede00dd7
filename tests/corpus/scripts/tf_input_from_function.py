"""Shaped like TensorFlow's tutorial "Distributed input" (tensorflow/docs,
site/en/tutorials/distribute/input.ipynb) with the custom loop of "Custom training with
tf.distribute.Strategy": a StringLookup layer made under strategy.scope(), a dataset_fn(input_context)
that batches with input_context.get_per_replica_batch_size(global_batch_size), shards with
num_input_pipelines/input_pipeline_id and maps the preprocessing layer over the batches,
strategy.distribute_datasets_from_function(dataset_fn), and a tf.function step calling
strategy.run on next(iterator) for a fixed number of steps.

Changed: the tutorial's toy ["a", "c", "e"] strings become random words of a small vocabulary
with a label, and a small Embedding model trains on them.
"""

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(11)

vocab = ["a", "b", "c", "d", "e", "f", "g"]
rng = np.random.default_rng(0)
words = rng.choice(vocab + ["zz"], size=(256, 3))
labels = np.isin(words, ["a", "c"]).any(axis=1).astype(np.float32)[:, None]

global_batch_size = 32
strategy = tf.distribute.MirroredStrategy()

with strategy.scope():
    layer = tf.keras.layers.StringLookup(vocabulary=vocab)
    model = tf.keras.Sequential([
        tf.keras.layers.Input((3,), dtype="int64"),
        tf.keras.layers.Embedding(len(vocab) + 1, 8),
        tf.keras.layers.GlobalAveragePooling1D(),
        tf.keras.layers.Dense(1),
    ])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.5)
    loss_object = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")


def dataset_fn(input_context):
    dataset = tf.data.Dataset.from_tensor_slices((words, labels)).repeat()
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = dataset.batch(batch_size)
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

    def preprocess_with_kpl(features, label):
        return layer(features), label

    return dataset.map(preprocess_with_kpl).prefetch(2)


distributed_dataset = strategy.distribute_datasets_from_function(dataset_fn)


def replica_step(features, label):
    with tf.GradientTape() as tape:
        logits = model(features, training=True)
        loss = tf.nn.compute_average_loss(loss_object(label, logits), global_batch_size=global_batch_size)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


@tf.function
def train_step(iterator):
    features, label = next(iterator)
    per_replica_losses = strategy.run(replica_step, args=(features, label))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


iterator = iter(distributed_dataset)
for step in range(24):
    loss = train_step(iterator)
    if step % 8 == 7:
        print(f"step {step + 1} loss {float(loss):.6f}")

weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
print(f"final loss {float(loss):.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
