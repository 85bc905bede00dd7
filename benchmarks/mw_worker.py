"""One worker of the multi-worker benchmark (suite 4): train, time all-reduces, write JSON.

Started N times by ``multi_worker.py``, either under ``tfstrategy.launch`` (the
``tfstrategy`` side) or with a ``TF_CONFIG`` written by hand (the ``plain``
side). Each worker pins itself to one core (its worker index modulo the usable
cores) before TensorFlow starts, so "N workers x 1 core" holds on any machine::

    python benchmarks/mw_worker.py --side plain --out /tmp/w --steps 60 --windows 3

Both sides run the same custom training loop on the same model and data
(Keras ``fit`` needs tfstrategy's fix on MultiWorkerMirroredStrategy, so ``fit``
cannot be compared with plain TensorFlow there):

- ``plain``: ``MultiWorkerMirroredStrategy()``, model and optimizer in its scope,
  ``distribute_datasets_from_function`` with the per-replica batch,
  ``strategy.run`` + ``compute_average_loss`` as TensorFlow's tutorial writes it.
- ``tfstrategy``: ``tfstrategy.select()`` (MultiWorkerMirroredStrategy from the
  launcher's ``TF_CONFIG``; one worker alone gets MirroredStrategy),
  ``build_in_scope``, ``prepare_dataset(per_replica_batch=...)``, ``make_train_step``.

Each ``--models`` entry is trained in turn in the same process: ``mlp`` (the
4-64-64-1 MLP, latency-bound: a step is ~1 ms of compute) and ``cnn`` (a small
CNN on 28x28 images, compute-bound). With ``--recommended`` the ``tfstrategy``
side also times Keras ``fit`` with ``steps_per_execution="auto"``.

Worker ``i`` writes ``<out>/worker-<i>.json``: per model, examples/s of each
timing window of ``--steps`` steps (this worker's examples only), and with
``--allreduce`` the median seconds of a SUM all-reduce per tensor size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def worker_index() -> int:
    """This worker's index: the launcher's variable, else TF_CONFIG's task index, else 0."""
    if os.environ.get("TFSTRATEGY_WORKER_INDEX"):
        return int(os.environ["TFSTRATEGY_WORKER_INDEX"])
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
    return int(task.get("index", 0))


def pin_to_one_core(index: int) -> int | None:
    """Pin this process to one usable core; before TensorFlow starts, so its thread pools size to 1."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    # Threads created later (TensorFlow's pools) inherit the calling thread's affinity.
    os.sched_setaffinity(0, {core})
    return core


FEATURES, HIDDEN = 4, 64
#: Per-replica batch of the compute-bound CNN (the MLP's comes from --per-replica-batch).
CNN_BATCH = 128


def make_examples(index: int, examples: int = 8192):
    """Seed-shaped regression; each worker reads its own examples (as its own files would)."""
    import numpy as np

    rng = np.random.default_rng(index)
    x = rng.normal(size=(examples, FEATURES)).astype("float32")
    y = (x @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32") + 0.1 * rng.normal(size=(examples, 1))).astype("float32")
    return x, y


def make_images(index: int, examples: int = 1024):
    """28x28 grey images with 10 classes (MNIST-shaped), each worker its own."""
    import numpy as np

    rng = np.random.default_rng(index)
    return rng.random((examples, 28, 28, 1), dtype="float32"), rng.integers(0, 10, size=(examples,)).astype("int32")


def build_model():
    import keras

    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(1)(hidden))


def build_cnn():
    """A small CNN: a step's compute is large against its ~230 KB gradient all-reduce."""
    import keras

    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10),
    ])


def workload(name: str, per_replica_batch: int):
    """(build_model, make_examples, per-example loss, Keras loss name, per-replica batch) of a benchmark model."""
    import keras

    if name == "cnn":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        return build_cnn, make_images, loss, "sparse_categorical_crossentropy", CNN_BATCH
    return build_model, make_examples, keras.losses.MeanSquaredError(reduction=None), "mse", per_replica_batch


def plain_side(strategy, model_name: str, per_replica_batch: int, index: int):
    """The TensorFlow tutorial's multi-worker custom loop, by hand."""
    import keras
    import tensorflow as tf

    make_model, examples, per_example_loss, _, per_replica_batch = workload(model_name, per_replica_batch)
    with strategy.scope():
        model = make_model()
        optimizer = keras.optimizers.SGD(0.01)
    global_batch = per_replica_batch * strategy.num_replicas_in_sync

    def dataset_fn(context):
        x, y = examples(index)
        batch = context.get_per_replica_batch_size(global_batch)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)

    def replica_step(batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            predictions = model(features, training=True)
            loss = tf.nn.compute_average_loss(per_example_loss(labels, predictions), global_batch_size=global_batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function(autograph=False)
    def step(batch):
        return {"loss": strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(batch,)), axis=None)}

    return step, dataset, per_replica_batch


def tfstrategy_side(selection, model_name: str, per_replica_batch: int, index: int):
    """The same loop with tfstrategy's helpers."""
    import keras
    import tensorflow as tf

    import tfstrategy

    make_model, examples, per_example_loss, loss_name, per_replica_batch = workload(model_name, per_replica_batch)
    model, _ = tfstrategy.build_in_scope(selection, make_model, optimizer=lambda: keras.optimizers.SGD(0.01),
                                         loss=loss_name)

    def source(context):
        return tf.data.Dataset.from_tensor_slices(examples(index)).repeat()

    dataset = tfstrategy.prepare_dataset(source, selection, per_replica_batch=per_replica_batch)
    step = tfstrategy.make_train_step(model, strategy=selection, global_batch=per_replica_batch * selection.num_replicas,
                                      loss=per_example_loss)
    return step, dataset, per_replica_batch


def recommended_fit(selection, model_name: str, per_replica_batch: int, index: int, steps: int, windows: int) -> dict:
    """tfstrategy's recommended settings: Keras ``fit`` with ``steps_per_execution="auto"`` (K tuned at the first fit).

    Returns this worker's examples/s per epoch of ``steps`` steps (after a warm-up epoch) and the K chosen.
    """
    import time as clock

    import keras
    import tensorflow as tf

    import tfstrategy
    from tfstrategy.training.steps_per_execution import last_choice

    make_model, examples, _, loss_name, per_replica_batch = workload(model_name, per_replica_batch)
    model, _ = tfstrategy.build_in_scope(selection, make_model, optimizer=lambda: keras.optimizers.SGD(0.01),
                                         loss=loss_name, steps_per_execution="auto")

    def source(context):
        return tf.data.Dataset.from_tensor_slices(examples(index)).repeat()

    dataset = tfstrategy.prepare_dataset(source, selection, per_replica_batch=per_replica_batch)
    seconds: list[float] = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = clock.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(clock.perf_counter() - self.started)

    model.fit(dataset, steps_per_epoch=steps, epochs=windows + 1, verbose=0, callbacks=[EpochTimer()])
    local = steps * per_replica_batch * len(selection.strategy.extended.worker_devices)
    choice = last_choice(model)
    return {"samples": [local / value for value in seconds[1:]], "steps_per_execution": choice.steps if choice else 1}


def time_training(strategy, step, dataset, steps: int, windows: int, per_replica_batch: int) -> list[float]:
    """This worker's examples/s over ``windows`` windows of ``steps`` steps, after a warm-up window."""
    iterator = iter(dataset)
    local_replicas = len(strategy.extended.worker_devices)
    samples = []
    for window in range(windows + 1):
        start = time.perf_counter()
        for _ in range(steps):
            logs = step(next(iterator))
        float(logs["loss"])  # wait for the last step's collective to finish
        if window:  # window 0 traces and warms up
            samples.append(steps * per_replica_batch * local_replicas / (time.perf_counter() - start))
    return samples


def time_allreduce(strategy, sizes: list[int], repeats: int) -> dict[str, float]:
    """Median seconds of a SUM all-reduce of a float32 tensor of each size in bytes, across all replicas."""
    import tensorflow as tf

    results = {}
    for size in sizes:
        elements = max(1, size // 4)
        # One tensor per replica, on the replica's device, as gradients are.
        value = strategy.experimental_distribute_values_from_function(lambda _, elements=elements: tf.ones([elements], tf.float32))

        @tf.function(autograph=False)
        def all_reduce(per_replica):
            # Across every replica of every worker; axis=None keeps the tensor's shape.
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        all_reduce(value)  # trace and warm up the collective for this shape
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            all_reduce(value).numpy()  # .numpy() waits for the collective to finish
            times.append(time.perf_counter() - start)
        results[str(size)] = statistics.median(times)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", choices=("plain", "tfstrategy"), required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder for worker-<i>.json")
    parser.add_argument("--models", default="mlp", help="comma-separated: mlp (latency-bound), cnn (compute-bound)")
    parser.add_argument("--per-replica-batch", type=int, default=256, help="the MLP's (the CNN's is 128)")
    parser.add_argument("--steps", type=int, default=60, help="steps per timing window")
    parser.add_argument("--windows", type=int, default=3, help="timed windows (after one warm-up window)")
    parser.add_argument("--recommended", action="store_true", help="tfstrategy side: also time fit with K='auto'")
    parser.add_argument("--allreduce", default="", help="comma-separated tensor sizes in bytes to all-reduce")
    parser.add_argument("--allreduce-repeats", type=int, default=5)
    args = parser.parse_args(argv)
    index = worker_index()
    core = pin_to_one_core(index)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.side == "plain":
        import tensorflow as tf

        strategy = selection = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        import tfstrategy

        selection = tfstrategy.select()
        strategy = selection.strategy
    models = {}
    for name in [name for name in args.models.split(",") if name]:
        make_side = plain_side if args.side == "plain" else tfstrategy_side
        step, dataset, batch = make_side(selection, name, args.per_replica_batch, index)
        models[name] = {"samples": time_training(strategy, step, dataset, args.steps, args.windows, batch)}
        if args.recommended and args.side == "tfstrategy":
            models[name]["recommended"] = recommended_fit(selection, name, args.per_replica_batch, index, args.steps,
                                                          args.windows)
    sizes = [int(size) for size in args.allreduce.split(",") if size]
    allreduce = time_allreduce(strategy, sizes, args.allreduce_repeats) if sizes else {}
    result = {
        "side": args.side, "index": index, "core": core, "strategy": type(strategy).__name__,
        "replicas_in_sync": int(strategy.num_replicas_in_sync), "models": models, "allreduce_seconds": allreduce,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"worker-{index}.json").write_text(json.dumps(result), encoding="utf-8")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
