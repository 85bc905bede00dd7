"""A tiny two-epoch Keras fit under ``tfstrategy launch`` that hands its ledger to the test (issue 38).

The launcher deletes its workers' files when the job ends, so each worker, once its ledger file
(written by the hook's heartbeat thread) shows every step of the fit, copies it to
``<out>/worker-<i>.ledger``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

EXAMPLES, FEATURES, GLOBAL_BATCH, EPOCHS = 128, 4, 16, 2


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(dataset, epochs=EPOCHS, verbose=0)  # the line the ledger names as the user's frame

    from tfstrategy.launch.ledger import read_ledger
    from tfstrategy.runtime.ledger import current_keeper

    keeper = current_keeper()
    if keeper is None:
        raise SystemExit("no ledger kept in this worker")
    expected = EPOCHS * EXAMPLES // GLOBAL_BATCH
    while (ledger := read_ledger(keeper.path)) is None or ledger.total_steps < expected:
        time.sleep(0.1)  # the heartbeat writes it within a second (the test's own timeout bounds this)
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    shutil.copy(keeper.path, out / f"worker-{index}.ledger")


if __name__ == "__main__":
    main()
