"""A custom training loop (make_train_step) with coordinated backups, for the multi-worker fault tests.

The same data and model as fit_worker.py: 8 steps an epoch, ``--epochs`` epochs, a backup every
``--save-freq`` batches (or each epoch). Every worker writes ``<out>/worker-<i>.json`` (final weights,
steps, the step it resumed from). Faults come from ``TFSTRATEGY_TEST_BACKUP_FAULT`` (first start), or
``--faults`` (one on each start, as in fit_worker.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_worker import FEATURES, GLOBAL_BATCH, STEPS_PER_EPOCH, arm_fault, make_dataset, parse_faults  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--faults", default=None, help="POINT@WORKER[:STEP],...: a kill in a save on each start")
    args = parser.parse_args()

    import tfstrategy

    selection = tfstrategy.select()
    import keras

    keras.utils.set_random_seed(1)
    with selection.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(0.01)
        model.compile(optimizer=optimizer)
    step = tfstrategy.make_train_step(model, strategy=selection, global_batch=GLOBAL_BATCH,
                                      loss=keras.losses.MeanSquaredError(reduction="none"), optimizer=optimizer)
    backup = step.backup(save_freq=args.save_freq if args.save_freq == "epoch" else int(args.save_freq))
    start = backup.restore()
    index = int(os.environ.get("TFSTRATEGY_WORKER_INDEX", "0"))
    if args.faults:
        every = STEPS_PER_EPOCH if args.save_freq == "epoch" else int(args.save_freq)
        arm_fault(backup.backup, parse_faults(args.faults), int(os.environ.get("TFSTRATEGY_RESTART", "0")), start, every,
                  args.out, index)
    dataset = selection.strategy.experimental_distribute_dataset(make_dataset())
    for epoch in range(start.epoch, args.epochs):
        for batch, data in enumerate(dataset):
            if start.done(epoch, batch):
                continue  # trained before the restart: the data order stays that of an uninterrupted run
            step(data)
            backup.batch_done(epoch, batch)
        backup.epoch_done(epoch)
    backup.finish()
    result = {
        "restart": int(os.environ.get("TFSTRATEGY_RESTART", "0")),
        "steps": int(optimizer.iterations.numpy()),
        "weights": [w.tolist() for w in model.get_weights()],
        "resumed": vars(start),
    }
    (args.out / f"worker-{index}.json").write_text(json.dumps(result))
    print(f"done: {result['steps']} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
