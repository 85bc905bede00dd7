"""A script with one fault on worker 1, for the launcher's root-cause and stall tests.

``python fault_worker.py MODE``, run under ``tfstrategy launch -n 2``; the script creates
``tf.distribute.MultiWorkerMirroredStrategy()`` itself (the start-up hook supervises it) and
trains the tiny model of ``fit_worker.py`` for many epochs. Worker 1, at epoch 1 batch 2:

``crash``     raises ValueError in a callback;
``exit0``     leaves with ``os._exit(0)`` mid-training;
``early0``    (before creating its strategy) returns 0;
``sigstop``   sends itself SIGSTOP;
``busy``      spins forever in the callback;
``flood``     (before TensorFlow) writes 20 MB of ``\\r`` progress updates, no newline, then exits 1;
``cafe``      (before TensorFlow) prints "café" and a few lines, then every worker exits 0.

Each worker prints ``batch-rate`` lines (so tests can wait for training) via ``print``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

mode = sys.argv[1]
index = int(os.environ["TFSTRATEGY_WORKER_INDEX"])

if mode == "flood" and index == 1:
    chunk = "".join(f"\rprogress {i:>7}" for i in range(1000))
    for _ in range(20 * 1024 * 1024 // len(chunk)):
        sys.stdout.write(chunk)
    sys.stdout.flush()
    sys.exit(1)
if mode == "flood":
    time.sleep(600)
if mode == "cafe":
    print("café au lait ☕", flush=True)
    print("after the café", flush=True)
    sys.exit(0)
if mode == "early0" and index == 1:
    print("leaving before creating a strategy", flush=True)
    sys.exit(0)

spec = importlib.util.spec_from_file_location("fit_worker", Path(__file__).with_name("fit_worker.py"))
fit_worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fit_worker)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402


class Fault(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if index != 1 or (self.epoch, batch) != (1, 2):
            return
        print(f"fault {mode} now at {time.time():.3f}", flush=True)
        if mode == "crash":
            raise ValueError("worker 1's bad batch: shapes (32, 4) and (3, 1) not aligned")
        if mode == "exit0":
            os._exit(0)
        if mode == "sigstop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if mode == "busy":
            while True:
                pass


class Pace(keras.callbacks.Callback):
    """About 10 batches a second, so a stall is easy to tell from a slow step."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.1)
        if batch == 0:
            print(f"training epoch {getattr(self, 'epoch', 0)}", flush=True)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


strategy = tf.distribute.MultiWorkerMirroredStrategy()
fit_worker.train(strategy, epochs=200, callbacks=[Pace(), Fault()])
print("finished", flush=True)
