"""An unchanged Keras script for the simulated Kubernetes pods and `tfstrategy launch -n 2` alike.

``python k8s_pod_script.py OUT``: ``MirroredStrategy()`` (tfstrategy's hook makes it one
multi-worker job), fit with ``tfstrategy.backup_callbacks()`` (a no-op without a backup
directory), then ``OUT/worker-<task index>.json`` with the losses, final weights and the step
resumed from. With ``KILL_AT=EPOCH:BATCH`` in the environment, worker 1 SIGKILLs itself there on
its first start (``TFSTRATEGY_K8S_FAILURES`` and ``..._IGNORED_FAILURES`` empty or 0): a pod lost mid-step.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

import tfstrategy

out = Path(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = (np.tanh(x) @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).with_options(options)

strategy = tf.distribute.MirroredStrategy()
keras.utils.set_random_seed(1)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")

config = json.loads(os.environ.get("TF_CONFIG") or '{"task": {"index": 0}}')
index = int(config["task"]["index"])
first_start = not any(int(os.environ.get(name) or 0) for name in ("TFSTRATEGY_K8S_FAILURES", "TFSTRATEGY_K8S_IGNORED_FAILURES"))
callbacks = tfstrategy.backup_callbacks(save_freq=3)
backup = callbacks[0] if callbacks else None


class KillAt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if f"{self.epoch}:{batch}" == os.environ.get("KILL_AT") and index == 1 and first_start:
            print(f"pod {index} killed at epoch {self.epoch} batch {batch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


history = model.fit(dataset, epochs=3, callbacks=[*callbacks, KillAt()], shuffle=False, verbose=0)
resolver = getattr(strategy, "cluster_resolver", None)
workers = resolver.cluster_spec().as_dict().get("worker", []) if resolver is not None else []
print(f"strategy {type(strategy).__name__} replicas {strategy.num_replicas_in_sync} workers {','.join(workers)}", flush=True)
result = {"loss": history.history["loss"], "weights": [w.tolist() for w in model.get_weights()],
          "steps": int(model.optimizer.iterations.numpy()),
          "resumed": None if backup is None or backup.resumed is None else vars(backup.resumed)}
(out / f"worker-{index}.json").write_text(json.dumps(result))
print(f"final loss {history.history['loss'][-1]:.7f}", flush=True)
