"""A tiny Keras fit under ``tfstrategy launch`` with one planted cause on worker 1 (issue 38's tests).

``python planted_worker.py CAUSE`` (every worker runs it; worker 1 has the cause):

``healthy``         nothing planted: the job ends cleanly, nobody is named;
``uneven``          worker 1's dataset is one batch shorter (no ``drop_remainder``);
``different-step``  worker 1's loss issues one extra all-reduce: another train function, same variables;
``different-model`` worker 1's hidden layer is wider: another model, other variables;
``exit0``/``exit1`` worker 1 exits with that status before creating its strategy;
``slow-input``      worker 1's ``from_generator`` input sleeps before every batch;
``slow-step``       worker 1's host is busier: a thread of its own burns CPU while it trains;
``slow-map``        worker 1's ``dataset.map`` runs a ``tf.py_function`` that burns CPU on every batch.

Every worker's loss carries the same ``numpy_function`` (it sleeps :data:`STEP_PAUSE` under
``slow-step`` on every worker, so that its one epoch lasts: a ``numpy_function`` in every worker's
step, healthy), and its data the same shapes, so only the planted cause tells the workers apart.
The straggler causes run one epoch of :data:`SLOW_BATCHES` batches, far more than the launcher's
straggler watch needs to name worker 1 (about 10 ledger readings, one a second): the test stops the
job once the warning is said, and the bound only ends a run whose warning never comes.
"""

from __future__ import annotations

import os
import sys
import threading
import time

CAUSES = ("healthy", "uneven", "different-step", "different-model", "exit0", "exit1", "slow-input", "slow-step",
          "slow-map")
FEATURES, GLOBAL_BATCH = 4, 8
#: Batches in an epoch, and the seconds the planted slow worker loses in each.
BATCHES, SLOW_SECONDS = 8, 0.2
#: Straggler causes: batches in their one epoch (at least 0.2 s each on worker 1: 80 s or more).
SLOW_BATCHES = 400
#: Seconds every worker's step sleeps in its ``numpy_function`` under ``slow-step`` (0 under the other causes).
STEP_PAUSE = 0.1


def planted_now(cause: str) -> None:
    """Say when the cause happens (wall clock), for the time from the cause to the launcher's diagnosis."""
    print(f"planted {cause} at {time.time():.3f}", flush=True)


def burn_cpu() -> None:
    """A busier host: Python code of its own that never waits (another thread of the worker's process)."""
    while True:
        sum(range(1000))


def main() -> None:
    cause = sys.argv[1]
    if cause not in CAUSES:
        raise SystemExit(f"planted_worker.py: received cause {cause!r}; expected one of {', '.join(CAUSES)}")
    # The launcher's worker index; under srun without a launcher (issue 38's "before"), the Slurm task's rank.
    index = int(os.environ.get("TFSTRATEGY_WORKER_INDEX") or os.environ["SLURM_PROCID"])
    planted = index == 1
    import keras
    import numpy as np
    import tensorflow as tf

    if planted and cause in ("exit0", "exit1"):  # a script that imports TensorFlow, then ends early (a bad flag)
        planted_now(cause)
        raise SystemExit(int(cause[-1]))

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    batches = SLOW_BATCHES if cause.startswith("slow") else BATCHES
    batches = batches - 1 if planted and cause == "uneven" else batches
    x = np.random.default_rng(0).normal(size=(batches * GLOBAL_BATCH, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if cause == "slow-input":
        pause = SLOW_SECONDS if planted else 0.0

        def examples():  # worker 1's input pipeline: a slow reader
            for start in range(0, len(x), GLOBAL_BATCH):
                time.sleep(pause)
                yield x[start:start + GLOBAL_BATCH], y[start:start + GLOBAL_BATCH]

        spec = (tf.TensorSpec((None, FEATURES), tf.float32), tf.TensorSpec((None, 1), tf.float32))
        dataset = tf.data.Dataset.from_generator(examples, output_signature=spec)
    elif cause == "slow-map":
        work = SLOW_SECONDS if planted else 0.0

        def decode(features):  # worker 1's map: a slow decoder, Python code that tf.data runs on its own threads
            end = time.process_time() + work
            while time.process_time() < end:
                pass
            return features

        def mapped(features, labels):
            features = tf.py_function(decode, [features], tf.float32)
            features.set_shape((None, FEATURES))
            return features, labels

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).map(mapped)
    else:
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    dataset = dataset.with_options(options)

    step_pause = STEP_PAUSE if cause == "slow-step" else 0.0

    def wait(seconds: np.ndarray) -> np.ndarray:
        time.sleep(float(seconds))
        return np.float32(0.0)

    def loss(y_true, y_pred):
        extra = tf.reshape(tf.numpy_function(wait, [tf.constant(step_pause)], tf.float32, stateful=True), [])
        value = tf.reduce_mean(tf.square(y_true - y_pred)) + 0.0 * extra
        context = tf.distribute.get_replica_context()  # None in Keras' symbolic build of the loss
        if planted and cause == "different-step" and context is not None:
            value += 0.0 * tf.reduce_sum(context.all_reduce("sum", tf.ones([3])))
        return value

    hidden = 16 if planted and cause == "different-model" else 8
    if planted and cause == "different-model":
        planted_now(cause)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(hidden), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss=loss)

    class Planted(keras.callbacks.Callback):
        """Worker 1 says when its cause begins to act: its first step (its last, for uneven shards)."""

        def on_train_begin(self, logs=None):
            if planted and cause == "different-step":  # it acts in the first step's trace
                planted_now(cause)

        def on_train_batch_end(self, batch, logs=None):
            if planted and cause in ("uneven", "slow-input", "slow-step", "slow-map") and not hasattr(self, "said") \
                    and batch == (batches - 1 if cause == "uneven" else 0):
                self.said = True
                if cause == "slow-step":
                    threading.Thread(target=burn_cpu, name="busier-host", daemon=True).start()
                planted_now(cause)

    model.fit(dataset, epochs=1, verbose=0, callbacks=[Planted()])
    print(f"worker {index} trained ({cause})", flush=True)


if __name__ == "__main__":
    main()
