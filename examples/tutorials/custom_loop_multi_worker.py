"""A script shaped like TensorFlow's tutorial "Custom training loop with Keras and
MultiWorkerMirroredStrategy", unchanged in everything but its data (synthetic images instead
of MNIST). It calls the Keras 2 API `metric.reset_states()` as the tutorial does.

    tfstrategy launch -n 2 -- python examples/tutorials/custom_loop_multi_worker.py
    python examples/tutorials/custom_loop_multi_worker.py --steps 400   # a job longer than --timeout
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--steps", type=int, default=10, help="steps per epoch")
parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step, to make a long job")
args = parser.parse_args()

tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
global_batch_size = 32 * num_workers


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    rng = np.random.default_rng(0)
    images = rng.random((1024, 28, 28), dtype=np.float32)
    labels = (images.mean(axis=(1, 2)) * 10).astype(np.int64) % 10
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.repeat().batch(batch_size)


def build_cnn_model():
    return tf.keras.Sequential(
        [
            tf.keras.Input(shape=(28, 28)),
            tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
            tf.keras.layers.Conv2D(8, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )


strategy = tf.distribute.MultiWorkerMirroredStrategy()

with strategy.scope():
    multi_worker_model = build_cnn_model()
    multi_worker_dataset = strategy.distribute_datasets_from_function(
        lambda input_context: dataset_fn(global_batch_size, input_context)
    )
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(
                y, predictions
            )
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


iterator = iter(multi_worker_dataset)
for epoch in range(args.epochs):
    total_loss = 0.0
    for _ in range(args.steps):
        total_loss += train_step(iterator)
        time.sleep(args.step_seconds)
    train_loss = total_loss / args.steps
    print(f"Epoch: {epoch}, accuracy: {train_accuracy.result():.6f}, train_loss: {train_loss:.6f}", flush=True)
    train_accuracy.reset_states()
