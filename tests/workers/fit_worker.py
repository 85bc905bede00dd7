"""A tiny Keras training script for the multi-worker tests, run under `tfstrategy launch`.

Every worker writes ``<out>/worker-<i>.json`` (history, final weights, steps).
Fault injection for the supervision tests (first start only, ``TFSTRATEGY_RESTART=0``):
``--kill-at EPOCH:BATCH`` SIGKILLs worker 1 there; ``--stall`` makes worker 1 never start
TensorFlow; ``--steal-port`` makes worker 0 occupy worker 1's port before worker 1 starts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

EXAMPLES, FEATURES, GLOBAL_BATCH = 256, 4, 32


def make_data():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = (np.tanh(x) @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")
    return x, y


def make_dataset():
    import tensorflow as tf

    x, y = make_data()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)


def train(strategy, epochs: int, callbacks=()):
    """Build, compile and fit the model under ``strategy``; returns (model, history)."""
    import keras

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    history = model.fit(make_dataset(), epochs=epochs, callbacks=list(callbacks), shuffle=False, verbose=0)
    return model, history


class _KillAt:
    def __init__(self, epoch: int, batch: int) -> None:
        import keras

        class KillCallback(keras.callbacks.Callback):
            def on_epoch_begin(cb, e, logs=None):
                cb.epoch = e

            def on_train_batch_end(cb, b, logs=None):
                if cb.epoch == epoch and b == batch:
                    print(f"killing myself at epoch {epoch} batch {batch}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        self.callback = KillCallback()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-at", default=None, help="EPOCH:BATCH at which worker 1 SIGKILLs itself")
    parser.add_argument("--stall", action="store_true", help="worker 1 never starts TensorFlow")
    parser.add_argument("--steal-port", action="store_true", help="worker 0 takes worker 1's port")
    parser.add_argument("--save-freq", default="epoch", help="backup_callbacks(save_freq=...): 'epoch' or batches")
    parser.add_argument("--keep-backup", action="store_true", help="backup_callbacks(delete_checkpoint=False)")
    args = parser.parse_args()
    index = int(os.environ["TFSTRATEGY_WORKER_INDEX"])
    first_start = os.environ.get("TFSTRATEGY_RESTART", "0") == "0"
    stolen = args.out / "port-stolen"
    if args.stall and index == 1:
        print("stalling before TensorFlow starts", flush=True)
        time.sleep(600)
    if args.steal_port:
        if index == 0:
            port = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][1].rsplit(":", 1)[1]
            thief = socket.socket()
            thief.bind(("127.0.0.1", int(port)))
            thief.listen()
            stolen.write_text(port)
            print(f"holding worker 1's port {port}", flush=True)
            time.sleep(600)
        while not stolen.exists():
            time.sleep(0.05)

    import tfstrategy

    selection = tfstrategy.select()
    print(f"strategy {type(selection.strategy).__name__} replicas {selection.num_replicas}", flush=True)
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    callbacks = tfstrategy.backup_callbacks(save_freq=save_freq, delete_checkpoint=not args.keep_backup)
    backup = callbacks[0] if callbacks else None
    if args.kill_at and index == 1 and first_start:
        epoch, batch = (int(v) for v in args.kill_at.split(":"))
        callbacks.append(_KillAt(epoch, batch).callback)
    model, history = train(selection.strategy, args.epochs, callbacks)
    saved = tfstrategy.save_model(model, args.out / "model.keras")
    result = {
        "restart": int(os.environ.get("TFSTRATEGY_RESTART", "0")),
        "history": history.history,
        "steps": int(model.optimizer.iterations.numpy()),
        "weights": [w.tolist() for w in model.get_weights()],
        "saved": None if saved is None else str(saved),
        "resumed": None if backup is None else vars(backup.resumed),
    }
    (args.out / f"worker-{index}.json").write_text(json.dumps(result))
    print(f"done: loss {history.history['loss'][-1]:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
