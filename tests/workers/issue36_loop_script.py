"""Issue 36's six cases in one unchanged script (no tfstrategy import), one machine-readable line per case.

Shapes, written anew after the public sources (no code copied):

1. TensorFlow's tutorial "Custom training with tf.distribute.Strategy" (keras-team/keras#23085,
   tensorflow/tensorflow#72686): model and ``Adam`` created in ``strategy.scope()``, a per-replica step with
   ``GradientTape``, ``tf.nn.compute_average_loss`` and ``apply_gradients`` (the optimizer built lazily there),
   run through ``strategy.run`` in a ``tf.function`` over ``experimental_distribute_dataset``.
2. TensorFlow's mixed-precision guide, "Training the model with a custom training loop"
   (tensorflow/tensorflow#64124, keras-team/keras#20894): ``mixed_float16``, a float32 softmax,
   ``LossScaleOptimizer``, ``get_scaled_loss`` in the tape, ``get_unscaled_gradients`` before
   ``apply_gradients``. Then the port keras-team/keras#19479 describes (the two calls dropped, raw gradients
   applied through the ``LossScaleOptimizer``), which must be refused: its outcome is printed, not raised.
3. keras-team/keras#21366 (and #19005): ``mixed_float16``, ``compile(jit_compile=True)`` in the scope, ``fit``.
4-6. ``issue36_script.train``: compile() after the scope, ``tf.keras.optimizers.legacy.Adam``, an uneven last batch.

Every case uses the one ``tf.distribute.MirroredStrategy()`` the script makes. Each prints
``ISSUE36 {"case": ..., "weights": [...], "loss": ...}`` (weights flattened) or ``{"case": ..., "error": ...}``.
``ISSUE36_CPU_SPLIT=N`` splits the CPU and lists the devices itself: plain TensorFlow on N replicas.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import issue36_script  # noqa: E402  (cases 4-6)

GLOBAL_BATCH = 8


def report(case, weights=None, loss=None, error=None):
    line = {"case": case}
    if error is not None:
        line["error"] = f"{type(error).__name__}: {error}"
    else:
        line["weights"] = np.concatenate([np.ravel(w) for w in weights]).astype("float64").tolist()
        line["loss"] = float(loss)
    print("ISSUE36 " + json.dumps(line), flush=True)


def data(examples, features, classes=None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, features)).astype("float32")
    y = rng.integers(0, classes, size=(examples,)) if classes else rng.normal(size=(examples, 1)).astype("float32")
    return x, y


def lazy_adam_loop(strategy):
    tf.keras.utils.set_random_seed(1)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(6, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.Adam(learning_rate=0.01)
        loss_object = tf.keras.losses.MeanSquaredError(reduction="none")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(data(4 * GLOBAL_BATCH, 4)).batch(GLOBAL_BATCH))

    def train_step(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)), global_batch_size=GLOBAL_BATCH)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(inputs):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(inputs,)), axis=None)

    for _ in range(2):
        total = 0.0
        for batch in dataset:
            total += distributed_train_step(batch)
    return model.get_weights(), total


def loss_scale_loop(strategy, keras2_calls=True):
    tf.keras.utils.set_random_seed(2)
    with strategy.scope():
        inputs = tf.keras.Input((8,))
        hidden = tf.keras.layers.Dense(16, activation="relu")(inputs)
        outputs = tf.keras.layers.Activation("softmax", dtype="float32")(tf.keras.layers.Dense(3)(hidden))
        model = tf.keras.Model(inputs, outputs)
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.5))
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(reduction="none")
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(data(4 * GLOBAL_BATCH, 8, classes=3)).batch(GLOBAL_BATCH))

    def train_step(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)), global_batch_size=GLOBAL_BATCH)
            scaled_loss = optimizer.get_scaled_loss(loss) if keras2_calls else loss
        gradients = tape.gradient(scaled_loss, model.trainable_variables)
        if keras2_calls:
            gradients = optimizer.get_unscaled_gradients(gradients)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(train_step, args=(batch,)), axis=None)

    total = 0.0
    for batch in dataset:
        total += distributed_train_step(batch)
    return model.get_weights(), total


def jit_fit(strategy):
    x, y = data(8 * GLOBAL_BATCH, 4)
    tf.keras.utils.set_random_seed(3)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="relu"),
                                     tf.keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse", jit_compile=True)
    history = model.fit(x, y, batch_size=2 * GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    return model.get_weights(), history.history["loss"][-1]


def run(case, train):
    try:
        weights, loss = train()
    except Exception as error:  # noqa: BLE001  (a failing case is reported, the next one still runs)
        report(case, error=error)
    else:
        report(case, weights, loss)


def main():
    split = int(os.environ.get("ISSUE36_CPU_SPLIT", "0"))
    if split:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * split)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(split)])
    else:
        strategy = tf.distribute.MirroredStrategy()
    print(f"ISSUE36 {json.dumps({'replicas': strategy.num_replicas_in_sync})}", flush=True)
    run("1-lazy-adam", lambda: lazy_adam_loop(strategy))
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    run("2-loss-scale-api", lambda: loss_scale_loop(strategy))
    run("2-silent-port", lambda: loss_scale_loop(strategy, keras2_calls=False))
    run("3-jit-compile", lambda: jit_fit(strategy))
    tf.keras.mixed_precision.set_global_policy("float32")

    def fit_cases():
        model, history, _ = issue36_script.train(strategy)
        return model.get_weights(), history["loss"][-1]

    run("4-6-fit", fit_cases)


if __name__ == "__main__":
    main()
