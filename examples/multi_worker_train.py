"""One Keras script from a laptop to a cluster: run it unchanged under `tfstrategy launch`,
with TF_CONFIG set on each machine, or under Slurm's srun (select() reads the job step).

    tfstrategy launch -n 2 -- python examples/multi_worker_train.py
    tfstrategy launch -n 2 --max-restarts 1 -- python examples/multi_worker_train.py --epochs 20
    srun -N 2 --ntasks-per-node=1 python examples/multi_worker_train.py
    sbatch examples/slurm/train.sbatch --epochs 20   # requeued and resumed on preemption
    python examples/multi_worker_train.py                  # one process, no TF_CONFIG
"""

from __future__ import annotations

import argparse

import numpy as np

import tfstrategy

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--global-batch", type=int, default=128, help="split over every replica of every worker")
parser.add_argument("--out", default="out/model.keras")
args = parser.parse_args()

# MultiWorkerMirroredStrategy when TF_CONFIG, or the Slurm job step, has >1 worker.
selection = tfstrategy.select()
print(selection.explain(), flush=True)

import tensorflow as tf  # noqa: E402  (after select(): the strategy must exist before TensorFlow ops run)

keras = tf.keras  # Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1

rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(4096, 1))).astype("float32")
# The same global batch on 1 or N workers: the same steps, the same result.
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.global_batch)

keras.utils.set_random_seed(0)  # the same initial weights in every run: 1 worker or N, first run or requeued
with selection.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")

# With TFSTRATEGY_BACKUP_DIR (set by `tfstrategy launch --max-restarts K` or the sbatch script):
# resume from the last backup after a restart, and on SIGTERM stop every worker at one step and
# exit with status 75 so the job is requeued. [] when no backup directory is configured.
callbacks = tfstrategy.preemption_callbacks()
history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks, shuffle=False, verbose=2)
tfstrategy.save_model(model, args.out)  # every worker calls it; only the chief writes args.out
steps = int(model.optimizer.iterations.numpy())
print(f"final loss {history.history['loss'][-1]:.8f} steps {steps}", flush=True)
