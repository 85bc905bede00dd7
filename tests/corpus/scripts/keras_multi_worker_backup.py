"""Shaped like TensorFlow's tutorial "Multi-worker training with Keras" (tensorflow/docs,
site/en/tutorials/distribute/multi_worker_with_keras.ipynb): its mnist_setup (an MNIST dataset of
shuffle().repeat().batch() and a Reshape/Conv2D/Dense CNN compiled with SGD),
MultiWorkerMirroredStrategy(), the global batch as per-worker batch times the workers in TF_CONFIG,
fit with callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=...)] on one directory for every
worker, then the tutorial's saving section: _is_chief/write_filepath so only the chief writes
./keras-model.keras (the others a workertemp_ directory they remove), and a tf.train.CheckpointManager
written the same way and restored with tf.train.latest_checkpoint.

Changed: 512 random (28, 28) float32 images, a narrower CNN, 2 epochs of 6 steps; the backup and
model directories are under the working directory instead of /tmp; Keras 3 needs the .keras
suffix on the saved model.
"""

import json
import os

import numpy as np
import tensorflow as tf

tf.keras.utils.set_random_seed(2)


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 256, (512, 28, 28), dtype=np.uint8) / np.float32(255)
    y_train = rng.integers(0, 10, 512).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(512, seed=4).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.01), metrics=["accuracy"])
    return model


per_worker_batch_size = 32
tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1

strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir="./backup")]
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
history = multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=6, callbacks=callbacks, verbose=2)

model_path = "./keras-model.keras"


def _is_chief(task_type, task_id):
    return (task_type == "worker" and task_id == 0) or task_type is None


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
write_model_path = write_filepath(model_path, task_type, task_id)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))

checkpoint_dir = "./ckpt"
checkpoint = tf.train.Checkpoint(model=multi_worker_model)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)
checkpoint_manager.save()
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(write_checkpoint_dir)

weights = sum(float(np.abs(w).sum()) for w in multi_worker_model.get_weights())
print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")
