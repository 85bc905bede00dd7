"""A Keras training script for the elastic-job test, run under `tfstrategy launch --nnodes MIN:MAX`.

fit_worker.py's model, on 240 examples in global batches of 24 (10 steps an epoch), so that 1, 2 and 3
workers split every batch evenly; ``preemption_callbacks(save_freq=5)`` (a committed step every 5, and a
stop at one agreed step on SIGTERM). The test moves the job on by a gate: while ``<out>/gate`` holds a
step S, every worker waits after reaching step S (after that step's backup), until the gate moves or the
worker gets SIGTERM. Each worker of the group that finishes writes ``<out>/worker-<i>.json``; each start's
first step appends a line to ``<out>/starts.jsonl`` (when, which worker of how many, the step).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

EXAMPLES, FEATURES, GLOBAL_BATCH = 240, 4, 24


def make_dataset():
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (np.tanh(x) @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)


def build(strategy):
    import keras

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def gate_callback(out: Path):
    import keras

    class Gate(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.sigterm = False
            previous = signal.getsignal(signal.SIGTERM)  # the preemption callback's

            def noted(signum, frame):
                self.sigterm = True
                if callable(previous):
                    previous(signum, frame)

            signal.signal(signal.SIGTERM, noted)

        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.numpy())
            print(f"step {step}", flush=True)
            if not getattr(self, "stamped", False):  # this start's first step, for benchmarks/elastic.py
                self.stamped = True
                record = {"time": time.time(), "index": int(os.environ.get("TFSTRATEGY_WORKER_INDEX", "0")),
                          "workers": int(os.environ.get("TFSTRATEGY_NUM_WORKERS", "1")), "step": step}
                with open(out / "starts.jsonl", "a") as starts:
                    starts.write(json.dumps(record) + "\n")
            while not self.sigterm:
                try:
                    gate = int((out / "gate").read_text())
                except (OSError, ValueError):
                    return  # no gate: train on
                if step < gate:
                    return
                time.sleep(0.05)

    return Gate()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    import tfstrategy

    selection = tfstrategy.select()
    model = build(selection.strategy)
    callbacks = [*tfstrategy.preemption_callbacks(save_freq=5), gate_callback(args.out)]
    model.fit(make_dataset(), epochs=args.epochs, callbacks=callbacks, shuffle=False, verbose=0)
    index = int(os.environ["TFSTRATEGY_WORKER_INDEX"])
    result = {"workers": int(os.environ["TFSTRATEGY_NUM_WORKERS"]), "steps": int(model.optimizer.iterations.numpy()),
              "weights": [w.tolist() for w in model.get_weights()]}
    (args.out / f"worker-{index}.json").write_text(json.dumps(result))
    print(f"done after {result['steps']} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
