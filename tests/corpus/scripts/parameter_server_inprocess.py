"""Shaped like TensorFlow's tutorial "Parameter server training with ParameterServerStrategy"
(tensorflow/docs, site/en/tutorials/distribute/parameter_server_training.ipynb): an in-process
cluster (tf.distribute.Server for each worker and parameter server on free localhost ports,
a SimpleClusterResolver over the ClusterSpec), ParameterServerStrategy with a MinSizePartitioner,
StringLookup preprocessing stages made in the scope, a model and RMSprop made in the scope, a
tf.function step_fn with strategy.run and compute_average_loss, and a ClusterCoordinator that
creates per-worker datasets from distribute_datasets_from_function and schedules steps, joined at
epoch boundaries.

Changed: 2 workers and 1 parameter server instead of 3 and 2, ports from the OS instead of
portpicker, an embedding width of 16 instead of 16384, 2 epochs of 4 steps, seeded example
generation; Keras 3 names: reset_state() for reset_states(), keras.ops.mean on the symbolic
embedding output for tf.reduce_mean, batches before the preprocessing stages.
"""

import multiprocessing
import os
import random
import socket

import numpy as np
import tensorflow as tf

random.seed(0)
tf.keras.utils.set_random_seed(23)


def pick_unused_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def create_in_process_cluster(num_workers, num_ps):
    worker_ports = [pick_unused_port() for _ in range(num_workers)]
    ps_ports = [pick_unused_port() for _ in range(num_ps)]
    cluster_dict = {"worker": ["localhost:%s" % port for port in worker_ports]}
    if num_ps > 0:
        cluster_dict["ps"] = ["localhost:%s" % port for port in ps_ports]
    cluster_spec = tf.train.ClusterSpec(cluster_dict)
    worker_config = tf.compat.v1.ConfigProto()
    if multiprocessing.cpu_count() < num_workers + 1:
        worker_config.inter_op_parallelism_threads = num_workers + 1
    for i in range(num_workers):
        tf.distribute.Server(cluster_spec, job_name="worker", task_index=i, config=worker_config, protocol="grpc")
    for i in range(num_ps):
        tf.distribute.Server(cluster_spec, job_name="ps", task_index=i, protocol="grpc")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")


os.environ["GRPC_FAIL_FAST"] = "use_caller"
NUM_WORKERS = 2
NUM_PS = 1
cluster_resolver = create_in_process_cluster(NUM_WORKERS, NUM_PS)

variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=NUM_PS)
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

feature_vocab = ["avenger", "ironman", "batman", "hulk", "spiderman", "kingkong", "wonder_woman"]
label_vocab = ["yes", "no"]
with strategy.scope():
    feature_lookup_layer = tf.keras.layers.StringLookup(vocabulary=feature_vocab, mask_token=None)
    label_lookup_layer = tf.keras.layers.StringLookup(vocabulary=label_vocab, num_oov_indices=0, mask_token=None)
    raw_feature_input = tf.keras.layers.Input(shape=(3,), dtype=tf.string, name="feature")
    feature_preprocess_stage = tf.keras.Model({"features": raw_feature_input}, feature_lookup_layer(raw_feature_input))
    raw_label_input = tf.keras.layers.Input(shape=(1,), dtype=tf.string, name="label")
    label_preprocess_stage = tf.keras.Model({"label": raw_label_input}, label_lookup_layer(raw_label_input))


def feature_and_label_gen(num_examples=200):
    examples = {"features": [], "label": []}
    for _ in range(num_examples):
        features = random.sample(feature_vocab, 3)
        examples["features"].append(features)
        examples["label"].append(["yes"] if "avenger" in features else ["no"])
    return examples


examples = feature_and_label_gen()


def dataset_fn(_):
    raw_dataset = tf.data.Dataset.from_tensor_slices(examples)
    # Keras 3 functional models take batches: batch before mapping the preprocessing stages.
    return raw_dataset.shuffle(200).batch(32).map(lambda x: ({"features": feature_preprocess_stage(x["features"])},
                                                             label_preprocess_stage(x["label"]))).repeat()


with strategy.scope():
    model_input = tf.keras.layers.Input(shape=(3,), dtype=tf.int64, name="model_input")
    emb_layer = tf.keras.layers.Embedding(input_dim=len(feature_lookup_layer.get_vocabulary()), output_dim=16)
    emb_output = tf.keras.ops.mean(emb_layer(model_input), axis=1)
    dense_output = tf.keras.layers.Dense(units=1, activation="sigmoid",
                                         kernel_regularizer=tf.keras.regularizers.L2(1e-4))(emb_output)
    model = tf.keras.Model({"features": model_input}, dense_output)
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.1)
    accuracy = tf.keras.metrics.Accuracy()


@tf.function
def step_fn(iterator):
    def replica_fn(batch_data, labels):
        with tf.GradientTape() as tape:
            pred = model(batch_data, training=True)
            per_example_loss = tf.keras.losses.BinaryCrossentropy(reduction="none")(labels, pred)
            loss = tf.nn.compute_average_loss(per_example_loss)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        accuracy.update_state(labels, tf.cast(tf.greater(pred, 0.5), tf.int64))
        return loss

    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)


coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)


@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)


per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
per_worker_iterator = iter(per_worker_dataset)
for i in range(2):
    accuracy.reset_state()
    for _ in range(4):
        coordinator.schedule(step_fn, args=(per_worker_iterator,))
    coordinator.join()
    print("Finished epoch %d, accuracy is %f." % (i, accuracy.result().numpy()))

loss = coordinator.schedule(step_fn, args=(per_worker_iterator,))
final_loss = float(loss.fetch())
weights = sum(float(np.abs(np.asarray(w)).sum()) for w in model.get_weights())
print(f"final loss {final_loss:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
