"""Shaped like the Kubeflow training-operator's TFJob example "multi-worker strategy with Keras"
(kubeflow/training-operator, examples/tensorflow/distribution_strategy/multi_worker_strategy-with-keras.py,
removed with the v1 operator): TASK_INDEX read from TF_CONFIG at start, --saved_model_dir and
--checkpoint_dir flags, MultiWorkerMirroredStrategy(communication_options=CommunicationOptions(AUTO)),
the dataset (map/cache/shuffle, batch(64 per replica).repeat(), auto-shard policy DATA) and the CNN
built and compiled in the scope, callbacks TensorBoard('./logs'), ModelCheckpoint(checkpoint_dir/ckpt_{epoch},
save_weights_only=True), LearningRateScheduler(decay) and PrintLR, then the chief saves the model to
--saved_model_dir and every other worker to saved_model_dir/worker_tmp_<index>.

Changed: tfds MNIST becomes 256 random uint8 (28, 28, 1) images; narrower layers; 2 epochs of 4 steps;
Keras 3 names (.weights.h5 for weights-only checkpoints, model.export for a SavedModel directory,
optimizer.learning_rate for lr). Like the original it needs TF_CONFIG: without one it stops at
TASK_INDEX with KeyError: 'task'.
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf
from tensorflow.keras import layers, models

tf.keras.utils.set_random_seed(29)


def make_datasets_unbatched():
    BUFFER_SIZE = 10000

    def scale(image, label):
        image = tf.cast(image, tf.float32)
        image /= 255
        return image, label

    rng = np.random.default_rng(0)
    train = tf.data.Dataset.from_tensor_slices(
        (rng.integers(0, 256, (256, 28, 28, 1), dtype=np.uint8), rng.integers(0, 10, 256)))
    return train.map(scale).cache().shuffle(BUFFER_SIZE, seed=9)


def build_and_compile_cnn_model():
    model = models.Sequential()
    model.add(layers.Input((28, 28, 1)))
    model.add(layers.Conv2D(4, (3, 3), activation="relu"))
    model.add(layers.MaxPooling2D((2, 2)))
    model.add(layers.Conv2D(8, (3, 3), activation="relu"))
    model.add(layers.MaxPooling2D((2, 2)))
    model.add(layers.Flatten())
    model.add(layers.Dense(16, activation="relu"))
    model.add(layers.Dense(10, activation="softmax"))
    model.summary()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def decay(epoch):
    if epoch < 3:
        return 1e-3
    if 3 <= epoch < 7:
        return 1e-4
    return 1e-5


def main(args):
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CollectiveCommunication.AUTO))
    BATCH_SIZE_PER_REPLICA = 64
    BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync

    with strategy.scope():
        ds_train = make_datasets_unbatched().batch(BATCH_SIZE).repeat()
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        ds_train = ds_train.with_options(options)
        multi_worker_model = build_and_compile_cnn_model()

    checkpoint_prefix = os.path.join(args.checkpoint_dir, "ckpt_{epoch}.weights.h5")

    class PrintLR(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            print(f"\nLearning rate for epoch {epoch + 1} is {multi_worker_model.optimizer.learning_rate.numpy()}")

    callbacks = [
        tf.keras.callbacks.TensorBoard(log_dir="./logs"),
        tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
        tf.keras.callbacks.LearningRateScheduler(decay),
        PrintLR(),
    ]
    history = multi_worker_model.fit(ds_train, epochs=2, steps_per_epoch=4, callbacks=callbacks, verbose=2)

    def is_chief():
        return TASK_INDEX == 0

    if is_chief():
        model_path = args.saved_model_dir
    else:
        model_path = args.saved_model_dir + "/worker_tmp_" + str(TASK_INDEX)
    multi_worker_model.export(model_path)

    weights = sum(float(np.abs(w).sum()) for w in multi_worker_model.get_weights())
    print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {strategy.num_replicas_in_sync} strategy {type(strategy).__name__}")


if __name__ == "__main__":
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    TASK_INDEX = tf_config["task"]["index"]
    parser = argparse.ArgumentParser()
    parser.add_argument("--saved_model_dir", type=str, required=True, help="Tensorflow export directory.")
    parser.add_argument("--checkpoint_dir", type=str, required=True, help="Tensorflow checkpoint directory.")
    main(parser.parse_args())
