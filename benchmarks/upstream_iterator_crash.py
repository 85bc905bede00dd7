"""Reproduce, with TensorFlow and Keras alone, the segfault that auto K once hit in the test suite.

No tfstrategy import: this is an upstream bug report in a script. Each round does what the
``steps_per_execution="auto"`` tuner does before a ``fit``, with Keras' own API:

1. a distributed iterator over the dataset, repeated, consumed by Keras' train function
   (K = 1, 4, 8, six calls each), then dropped;
2. ``model.fit`` on arrays with K = 8 under a one-device ``MirroredStrategy``.

Sooner or later a round dies with ``Fatal Python error: Segmentation fault`` in Keras'
``epoch_iterator.reset`` (the fit drops the iterator it built the model from). Under gdb, the main
thread is in ``MultiDeviceIterator::MultiDeviceBuffer::Reset``, waiting for the buffer's background
thread; that thread crashes calling ``host_iterator_->GetNext``, jumping to address 0x1. The
crash needs the first step, the dropped iterator that a ``tf.function`` consumed: ``fit`` alone
(600 rounds at K = 1, 800 at K = 8) and ``fit`` after an iterator consumed eagerly (900 rounds)
never crashed (see ``benchmarks/README.md``).

Run it with other processes loading the machine (two ``python3 -c "while True: pass"``), then::

    .venv/bin/python benchmarks/upstream_iterator_crash.py --rounds 1000

It exits 0 if every round passed. A crash kills it with SIGSEGV (shell status 139). The last
``round N`` line printed says how far it got.
"""

from __future__ import annotations

import argparse
import faulthandler
from collections.abc import Callable
from typing import Any

import numpy as np


def rounds_argument(description: str, default: int) -> argparse.ArgumentParser:
    """A parser with ``--rounds`` (1 or more), shared with ``auto_k_crash_loop.py``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=default, help=f"rounds to run (default {default})")
    return parser


def checked_rounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more; received {args.rounds}")
    faulthandler.enable()
    return args.rounds


def regression_data() -> tuple[np.ndarray, np.ndarray]:
    """The test's data: 1024 rows of 4 features and a linear target (8 steps at batch 128)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 4)).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32")).astype("float32")


def small_model(keras: Any) -> Any:
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])


def run_rounds(rounds: int, one_round: Callable[[], None]) -> None:
    """Run ``one_round`` ``rounds`` times, saying how far it got every 10 rounds (a crash ends the process)."""
    for round_ in range(rounds):
        one_round()
        if round_ % 10 == 0:
            print(f"round {round_}", flush=True)
    print(f"all {rounds} rounds passed")


def main() -> None:
    parser = rounds_argument(__doc__.splitlines()[0], default=1000)
    rounds = checked_rounds(parser, parser.parse_args())

    import tensorflow as tf

    # The test suite's set-up, split by hand (tfstrategy's configure_cpu_replicas would import tfstrategy);
    # the strategy uses only the first of the 4.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    import keras

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    x, y = regression_data()

    def one_round() -> None:
        with strategy.scope():
            model = small_model(keras)
            model.compile(optimizer="sgd", loss="mse")
        iterator = iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(128).repeat()))
        for k in (1, 4, 8):
            model.steps_per_execution = k
            model.make_train_function(force=True)
            for _ in range(6):
                model.train_function(iterator)
        del iterator
        model.steps_per_execution = 8
        model.train_function = None
        model.fit(x, y, batch_size=128, epochs=1, verbose=0)

    run_rounds(rounds, one_round)

if __name__ == "__main__":
    main()
