"""Shaped like TF Model Garden's MNIST trainer (tensorflow/models,
official/legacy/image_classification/mnist_main.py) with its strategy helpers
(official/common/distribute_utils.py): absl flags with the zoo's defaults
(--distribution_strategy=mirrored, --num_gpus=1, --model_dir), get_distribution_strategy() turning
them into MirroredStrategy(devices=["device:GPU:%d" % i ...]) (["device:CPU:0"] for --num_gpus=0,
OneDeviceStrategy for one_device, None for off), get_strategy_scope() with its dummy context
manager, an SGD with an ExponentialDecay schedule compiled in the scope, and fit with
ModelCheckpoint(os.path.join(model_dir, 'model.ckpt-{epoch:04d}'), save_weights_only=True) and
TensorBoard(log_dir=model_dir), validation_freq, then model.save into model_dir and evaluate.

Changed: tfds MNIST becomes 384 random (28, 28, 1) float32 images; the CNN is narrower; the
profiler server the original starts on a fixed port is left out; Keras 3 needs the .weights.h5
and .keras suffixes.
"""

import os

import numpy as np
import tensorflow as tf
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "./model_dir", "The location of the model checkpoint files.")
flags.DEFINE_string("distribution_strategy", "mirrored", "off, one_device, mirrored or multi_worker_mirrored.")
flags.DEFINE_integer("num_gpus", 1, "How many GPUs to use at each worker with the DistributionStrategies API.")
flags.DEFINE_integer("batch_size", 64, "Batch size for training and evaluation.")
flags.DEFINE_integer("train_epochs", 2, "The number of epochs used to train.")
flags.DEFINE_integer("epochs_between_evals", 1, "The number of training epochs to run between evaluations.")


class DummyContextManager:
    def __enter__(self):
        pass

    def __exit__(self, *args):
        pass


def get_distribution_strategy(distribution_strategy="mirrored", num_gpus=0):
    if num_gpus < 0:
        raise ValueError("`num_gpus` can not be negative.")
    distribution_strategy = distribution_strategy.lower()
    if distribution_strategy == "off":
        if num_gpus > 1:
            raise ValueError(f"When {num_gpus} GPUs are specified, distribution_strategy flag cannot be set to `off`.")
        return None
    if distribution_strategy == "multi_worker_mirrored":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if distribution_strategy == "one_device":
        if num_gpus == 0:
            return tf.distribute.OneDeviceStrategy("device:CPU:0")
        if num_gpus > 1:
            raise ValueError("`OneDeviceStrategy` can not be used for more than one device.")
        return tf.distribute.OneDeviceStrategy("device:GPU:0")
    if distribution_strategy == "mirrored":
        devices = ["device:CPU:0"] if num_gpus == 0 else ["device:GPU:%d" % i for i in range(num_gpus)]
        return tf.distribute.MirroredStrategy(devices=devices)
    raise ValueError(f"Unrecognized Distribution Strategy: {distribution_strategy!r}")


def get_strategy_scope(strategy):
    return strategy.scope() if strategy else DummyContextManager()


def build_model():
    image = tf.keras.layers.Input(shape=(28, 28, 1))
    y = tf.keras.layers.Conv2D(filters=4, kernel_size=5, padding="same", activation="relu")(image)
    y = tf.keras.layers.MaxPooling2D(pool_size=(2, 2), strides=(2, 2), padding="same")(y)
    y = tf.keras.layers.Flatten()(y)
    y = tf.keras.layers.Dense(32, activation="relu")(y)
    probs = tf.keras.layers.Dense(10, activation="softmax")(y)
    return tf.keras.models.Model(image, probs, name="mnist")


def run(flags_obj):
    tf.keras.utils.set_random_seed(41)
    strategy = get_distribution_strategy(distribution_strategy=flags_obj.distribution_strategy,
                                         num_gpus=flags_obj.num_gpus)
    strategy_scope = get_strategy_scope(strategy)

    rng = np.random.default_rng(0)
    mnist_train = tf.data.Dataset.from_tensor_slices(
        (rng.random((384, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 384)))
    mnist_test = tf.data.Dataset.from_tensor_slices(
        (rng.random((128, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, 128)))
    train_input_dataset = mnist_train.cache().repeat().shuffle(buffer_size=384, seed=6).batch(flags_obj.batch_size)
    eval_input_dataset = mnist_test.cache().repeat().batch(flags_obj.batch_size)

    with strategy_scope:
        lr_schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=100000, decay_rate=0.96)
        optimizer = tf.keras.optimizers.SGD(learning_rate=lr_schedule)
        model = build_model()
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                      metrics=["sparse_categorical_accuracy"])

    train_steps = 384 // flags_obj.batch_size
    ckpt_full_path = os.path.join(flags_obj.model_dir, "model.ckpt-{epoch:04d}.weights.h5")
    callbacks = [
        tf.keras.callbacks.ModelCheckpoint(ckpt_full_path, save_weights_only=True),
        tf.keras.callbacks.TensorBoard(log_dir=flags_obj.model_dir),
    ]
    num_eval_steps = 128 // flags_obj.batch_size
    history = model.fit(train_input_dataset, epochs=flags_obj.train_epochs, steps_per_epoch=train_steps,
                        callbacks=callbacks, validation_steps=num_eval_steps, validation_data=eval_input_dataset,
                        validation_freq=flags_obj.epochs_between_evals, verbose=2)
    export_path = os.path.join(flags_obj.model_dir, "saved_model.keras")
    model.save(export_path)
    eval_output = model.evaluate(eval_input_dataset, steps=num_eval_steps, verbose=2)
    print("eval", eval_output)
    weights = sum(float(np.abs(w).sum()) for w in model.get_weights())
    print(f"final loss {history.history['loss'][-1]:.6f} weights {weights:.6f} replicas {model.distribute_strategy.num_replicas_in_sync} strategy {type(model.distribute_strategy).__name__}")


def main(_):
    run(FLAGS)


if __name__ == "__main__":
    app.run(main)
