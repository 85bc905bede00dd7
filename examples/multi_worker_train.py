"""One Keras script from a laptop to a cluster: run it unchanged under `tfstrategy launch`,
with TF_CONFIG set on each machine, or under Slurm's srun.

    tfstrategy launch -n 2 -- python examples/multi_worker_train.py
    tfstrategy launch -n 2 --max-restarts 1 -- python examples/multi_worker_train.py --epochs 20
    python examples/multi_worker_train.py                  # one process, no TF_CONFIG
"""

from __future__ import annotations

import argparse
import os

import numpy as np

import tfstrategy

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--out", default="out/model.keras")
args = parser.parse_args()

# Under srun without TF_CONFIG: derive it from Slurm's variables (one task per node).
if "SLURM_PROCID" in os.environ and "TF_CONFIG" not in os.environ:
    os.environ["TF_CONFIG"] = tfstrategy.tf_config_from_slurm().to_json()

selection = tfstrategy.select()  # MultiWorkerMirroredStrategy when TF_CONFIG has >1 worker
print(selection.explain(), flush=True)

import tensorflow as tf  # noqa: E402  (after select(): the strategy must exist before TensorFlow ops run)

keras = tf.keras  # Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1

rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(4096, 1))).astype("float32")
# The global batch is split over every replica of every worker.
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64 * selection.num_replicas)

with selection.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")

# Resumes after `tfstrategy launch --max-restarts K` restarts the group; [] when not configured.
callbacks = tfstrategy.backup_callbacks()
history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, shuffle=False, verbose=2)
tfstrategy.save_model(model, args.out)  # every worker calls it; only the chief writes args.out
print(f"final loss {history.history['loss'][-1]:.4f}", flush=True)
