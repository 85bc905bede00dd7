"""A plain Keras 3 script (it never imports tfstrategy but for FIT_FIX_ONLY) that writes files as real scripts do.

Run on every worker of a 2-worker job (``tfstrategy launch -n 2``, or local
``TF_CONFIG`` processes for the upstream canary); ``python chief_files_worker.py MODE OUT``:

- ``writers``: ModelCheckpoint in each form (``{epoch}`` .keras, best weights-only,
  every 2 batches weights-only, legacy .h5), CSVLogger, TensorBoard, then
  ``Model.save``/``save_weights``/``keras.saving.save_model``/``export``, then
  reloads the newest ``ckpt-{epoch}.keras`` as the fault-tolerance guide does
  (not with ``NO_RELOAD``: each worker in a directory of its own).
- ``reload``: a larger model; after each epoch's checkpoint every worker at once
  reads the file just written (``load_model``), recording the clock. Prints
  ``reload: fitting`` as its fit begins.
- ``backup``: ``BackupAndRestore(backup_dir=OUT/shared/backup)``, one directory for every
  worker as TensorFlow's multi-worker tutorial writes it; with ``KILL_AT_EPOCH``
  set, worker ``KILL_WORKER`` dies abruptly after that epoch on the first attempt.
  The model, data, optimizer and 3 epochs of ``writers``: an uninterrupted ``writers``
  run ends with the weights an uninterrupted ``backup`` run would.

Each worker writes ``OUT/worker-<index>.json``; files go under ``OUT/shared``.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import time

import numpy as np
import tensorflow as tf

MODE, OUT = sys.argv[1], sys.argv[2]
SHARED = os.path.join(OUT, "shared")
INDEX = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
ATTEMPT = int(os.environ.get("TFSTRATEGY_RESTART", "0") or 0)

import keras  # noqa: E402  (after tensorflow, as the scripts it imitates)

if os.environ.get("FIT_FIX_ONLY"):
    # The upstream canary: Keras 3's own writers, but fit itself needs the keras_mwms fix on 2 workers.
    from tfstrategy.patches import keras_mwms

    keras_mwms.PATCH.apply()

strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL_BATCH = 16


def data(examples: int = 128, features: int = 4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1)).astype("float32")).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)


def model(features: int = 4, width: int = 8):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        net = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, activation="tanh"),
                                keras.layers.Dense(1)])
        net.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return net


def weights(net) -> list:
    return [w.tolist() for w in net.get_weights()]


def writers() -> dict:
    net = model()
    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(SHARED, "ckpt", "ckpt-{epoch}.keras")),
        keras.callbacks.ModelCheckpoint(os.path.join(SHARED, "best.weights.h5"), monitor="loss",
                                        save_best_only=True, save_weights_only=True),
        keras.callbacks.ModelCheckpoint(os.path.join(SHARED, "batches", "b-{epoch}-{batch}.weights.h5"),
                                        save_freq=4, save_weights_only=True),
        keras.callbacks.ModelCheckpoint(os.path.join(SHARED, "legacy.h5")),
        keras.callbacks.CSVLogger(os.path.join(SHARED, "log.csv")),
        keras.callbacks.TensorBoard(log_dir=os.path.join(SHARED, "tb")),
    ]
    history = net.fit(data(), epochs=3, verbose=0, callbacks=callbacks, validation_data=data(32))
    net.save(os.path.join(SHARED, "final.keras"))
    net.save_weights(os.path.join(SHARED, "final.weights.h5"))
    keras.saving.save_model(net, os.path.join(SHARED, "api.keras"))
    net.export(os.path.join(SHARED, "export"), verbose=False)
    result = {"history": history.history, "weights": weights(net)}
    if os.environ.get("NO_RELOAD"):
        return result  # each worker in its own directory: only the chief has checkpoints to reload
    # The fault-tolerance guide's reload: the newest checkpoint, on every worker.
    newest = max(glob.glob(os.path.join(SHARED, "ckpt", "ckpt-*.keras")),
                 key=lambda p: int(re.search(r"ckpt-(\d+)", p).group(1)))
    reloaded = keras.models.load_model(newest)
    return {**result, "newest": os.path.basename(newest), "reloaded": weights(reloaded)}


class ReadBack(keras.callbacks.Callback):
    """Right after the epoch's checkpoint (the callback before this one), read it back."""

    def __init__(self) -> None:
        super().__init__()
        self.records = []

    def on_epoch_end(self, epoch, logs=None):
        returned = time.time()  # this worker's ModelCheckpoint has returned
        path = os.path.join(SHARED, "ckpt", f"ckpt-{epoch + 1}.keras")
        record = {"epoch": epoch + 1, "returned": returned}
        try:
            reloaded = keras.models.load_model(path)
            record["equal"] = all(np.array_equal(a, b) for a, b in zip(reloaded.get_weights(), self.model.get_weights()))
        except Exception as error:  # what a reader gets when the chief has not finished
            record["error"] = f"{type(error).__name__}: {error}"[:200]
        record["mtime"] = os.stat(path).st_mtime if os.path.exists(path) else None
        self.records.append(record)


class Timed(keras.callbacks.ModelCheckpoint):
    def _save_model(self, epoch, batch, logs):
        super()._save_model(epoch, batch, logs)
        self.done = getattr(self, "done", []) + [time.time()]


def reload() -> dict:
    net = model(features=256, width=1024)  # a few MB per checkpoint: the write takes a while
    checkpoint = Timed(os.path.join(SHARED, "ckpt", "ckpt-{epoch}.keras"))
    reader = ReadBack()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 256)).astype("float32")
    y = x[:, :1]
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)
    print("reload: fitting", flush=True)
    net.fit(dataset, epochs=int(os.environ.get("EPOCHS", "6")), verbose=0, callbacks=[checkpoint, reader])
    return {"reads": reader.records, "saved": checkpoint.done}


class Record(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.first_epoch = None
        self.restored = None
        self.epoch_weights = {}

    def on_train_begin(self, logs=None):
        self.restored = weights(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_weights[epoch + 1] = weights(self.model)
        with open(os.path.join(OUT, f"progress-{INDEX}-{ATTEMPT}.json"), "w") as out:
            json.dump(self.epoch_weights, out)
        if os.environ.get("KILL_AT_EPOCH") == str(epoch + 1) and ATTEMPT == 0 and INDEX == int(os.environ["KILL_WORKER"]):
            os._exit(9)  # abrupt: no callback, no cleanup


def backup() -> dict:
    net = model()
    record = Record()
    callbacks = [keras.callbacks.BackupAndRestore(backup_dir=os.path.join(SHARED, "backup")), record]
    net.fit(data(), epochs=3, verbose=0, callbacks=callbacks)
    return {"first_epoch": record.first_epoch, "restored": record.restored, "weights": weights(net),
            "attempt": ATTEMPT}


result = {"writers": writers, "reload": reload, "backup": backup}[MODE]()
# This worker's own private copies still on disk (the workers share TMPDIR; another one may be mid-write).
result["leftovers"] = sorted(name for name in os.listdir(os.environ.get("TMPDIR", "/tmp"))
                             if name.startswith(f"tfstrategy-worker-{INDEX}-"))
with open(os.path.join(OUT, f"worker-{INDEX}.json"), "w") as out:
    json.dump(result, out)
