"""Under `tfstrategy launch -n 2`: Keras fit with steps_per_execution 1 and 3 on MultiWorkerMirroredStrategy.

Each worker trains the same model twice in one job (K=1, then K=3 with a
partial last execution and validation data), and writes ``<out>/worker-<i>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import tfstrategy
from tfstrategy.patches.keras_steps_per_execution import uses_fixed_loop

EXAMPLES, GLOBAL_BATCH = 320, 32  # 10 steps per epoch: K=3 leaves a last execution of 1 step


def dataset(x, y):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)


def train(strategy, steps_per_execution: int) -> dict:
    # After tensorflow: the launcher's start-up hook runs when tensorflow is first imported.
    import keras

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 4)).astype("float32")
    y = (np.tanh(x) @ np.array([[0.5], [-1.0], [2.0], [0.25]], "float32")).astype("float32")
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"],
                      steps_per_execution=steps_per_execution)
    history = model.fit(dataset(x, y), validation_data=dataset(x[:128], y[:128]), epochs=2, verbose=0)
    return {
        "history": history.history,
        "steps": int(model.optimizer.iterations.numpy()),
        "weights": [w.tolist() for w in model.get_weights()],
        "fixed_loop": uses_fixed_loop(model, "train") and uses_fixed_loop(model, "test"),
    }


def main() -> int:
    out = Path(sys.argv[1])
    selection = tfstrategy.select()
    result = {"strategy": type(selection.strategy).__name__, "replicas": selection.num_replicas,
              "k1": train(selection.strategy, 1), "k3": train(selection.strategy, 3)}
    (out / f"worker-{os.environ['TFSTRATEGY_WORKER_INDEX']}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
