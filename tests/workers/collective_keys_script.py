"""One process that makes many MirroredStrategies, each training a model of its own width.

First tfstrategy's: the patches' probes (each trains on a strategy of its own), then
``STRATEGIES`` selections, each training a model; then two plain MirroredStrategy
objects, as a user who makes them directly. Prints ``keys <base>`` for every strategy
made (its collective key base) and ``<source> <width> trained`` or
``<source> <width> failed <the error's line that names the mismatch>`` for every model.
"""

import os

import keras
import numpy as np
import tensorflow as tf

import tfstrategy
from tfstrategy.patches import keras_jit_compile, keras_uneven_batches
from tfstrategy.selection.cpu_split import configure_cpu_replicas

STRATEGIES = 8
DEVICES = ["/cpu:0", "/cpu:1"]


def print_every_key_base() -> None:
    made = tf.distribute.MirroredStrategy.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        print("keys", self.extended._collective_key_base, flush=True)

    tf.distribute.MirroredStrategy.__init__ = init


def train(strategy, width: int) -> None:
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(width), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    x = np.ones((16, 4), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0)


def report(source: str, width: int, make) -> None:
    try:
        train(make(), width)
    except tf.errors.OpError as error:
        lines = [line for line in str(error).splitlines() if "mismatch" in line or "aborted" in line]
        print(source, width, "failed", (lines or str(error).strip().splitlines())[0].strip(), flush=True)
    else:
        print(source, width, "trained", flush=True)


def main() -> None:
    configure_cpu_replicas(len(DEVICES))
    print_every_key_base()
    for patch in (keras_uneven_batches.UnevenBatchesPatch(), keras_jit_compile.JitCompilePatch()):
        patch.probe()
    for width in range(1, STRATEGIES + 1):
        report("tfstrategy", width, lambda: tfstrategy.select(devices=DEVICES, env={}).strategy)
    for width in (3, 5):
        report("plain", width, lambda: tf.distribute.MirroredStrategy(DEVICES))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
