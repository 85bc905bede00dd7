"""Suites 2 and 3 inside one process: Keras ``fit`` prepared by tfstrategy vs by hand.

Run as a script, once per replica count, because logical CPU devices can only be
configured before TensorFlow's runtime starts::

    python benchmarks/workloads.py --replicas 4 --repeats 9 --steps 96 --epochs 1

It prints one JSON object: examples per second (wall) and per CPU-second for
three sides, timed in rotating order within the process so drift hits all of
them alike.

- ``seed``: the how-to's recipe by hand: ``MirroredStrategy`` (over ``/cpu:0..N-1``
  once the CPU is split, the how-to's step 5 form), model built and compiled in
  its scope, ``dataset.batch(256).prefetch(AUTOTUNE)``, ``fit``.
- ``tfstrategy``: the same model, data and settings, prepared with
  ``tfstrategy.select`` and ``tfstrategy.build_in_scope`` (fit guarded by the
  scope audit, as users get it), input from ``tfstrategy.prepare_dataset``
  keeping the last partial batch like the seed (suite 2: overhead).
- ``recommended``: tfstrategy's recommended settings (suite 3): the batch plan
  (``plan_dataset``: remainder dropped), ``prepare_dataset`` and
  ``steps_per_execution="auto"`` (K measured and chosen at the first, warm-up,
  fit), see :func:`prepare_recommended`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

GLOBAL_BATCH = 256
FEATURES = 4
SIDES = ("seed", "tfstrategy", "recommended")
COMPILE_ARGS = {"optimizer": "adam", "loss": "mse", "metrics": ["mae"]}
#: tfstrategy's recommended ``steps_per_execution``: measured and chosen at the first fit.
STEPS_PER_EXECUTION = "auto"


def make_data(examples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seed-shaped regression: 4 features, one target, a little noise."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(examples, FEATURES)).astype("float32")
    weights = rng.normal(size=(FEATURES, 1)).astype("float32")
    labels = features @ weights + 0.1 * rng.normal(size=(examples, 1)).astype("float32")
    return features, labels


def build_model() -> Any:
    """The small reference MLP (the how-to's ``build_model()``)."""
    import tensorflow as tf

    inputs = tf.keras.Input(shape=(FEATURES,))
    hidden = tf.keras.layers.Dense(64, activation="relu")(inputs)
    hidden = tf.keras.layers.Dense(64, activation="relu")(hidden)
    outputs = tf.keras.layers.Dense(1)(hidden)
    return tf.keras.Model(inputs, outputs)


def seed_dataset(_: Any, features: np.ndarray, labels: np.ndarray) -> Any:
    """The how-to's step 3: batch with the global batch, prefetch."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH).prefetch(tf.data.AUTOTUNE)


def examples_dataset(features: np.ndarray, labels: np.ndarray) -> Any:
    """Unbatched examples: what tfstrategy's dataset preparation starts from."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((features, labels))


def tfstrategy_dataset(selection: Any, features: np.ndarray, labels: np.ndarray) -> Any:
    """Suite 2's input through tfstrategy, same settings as the seed: every example, the partial batch kept."""
    import tfstrategy

    return tfstrategy.prepare_dataset(examples_dataset(features, labels), selection, global_batch=GLOBAL_BATCH, training=False)


def recommended_dataset(selection: Any, features: np.ndarray, labels: np.ndarray) -> Any:
    """tfstrategy's recommended input: the batch plan (remainder dropped, so every replica gets an
    equal share of every step), an explicit shard policy and AUTOTUNE prefetch."""
    import tfstrategy

    source = examples_dataset(features, labels)
    plan = tfstrategy.plan_dataset(source, selection, global_batch=GLOBAL_BATCH)
    return tfstrategy.prepare_dataset(source, selection, plan=plan)


def prepare_by_hand(replicas: int) -> tuple[Any, Any]:
    """The seed's way: a strategy, then model and compile inside its scope."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy() if replicas == 1 else tf.distribute.MirroredStrategy(
        devices=[f"/cpu:{i}" for i in range(replicas)]
    )
    with strategy.scope():
        model = build_model()
        model.compile(**COMPILE_ARGS)
    return strategy, model


def _select(replicas: int) -> Any:
    import tfstrategy

    return tfstrategy.select(cpu_replicas=replicas if replicas > 1 else None, env={})


def prepare_with_tfstrategy(replicas: int) -> tuple[Any, Any]:
    """tfstrategy's way, same settings as by hand: ``select`` then ``build_in_scope``."""
    import tfstrategy

    selection = _select(replicas)
    model, _ = tfstrategy.build_in_scope(selection, build_model, **COMPILE_ARGS)
    return selection, model


def prepare_recommended(replicas: int) -> tuple[Any, Any]:
    """tfstrategy's recommended settings: ``build_in_scope(steps_per_execution="auto")`` (K tuned at the first fit,
    the multi-step loop fixed for 2+ replicas)."""
    import tfstrategy

    selection = _select(replicas)
    model, _ = tfstrategy.build_in_scope(selection, build_model, **COMPILE_ARGS, steps_per_execution=STEPS_PER_EXECUTION)
    return selection, model


def split_cpu(replicas: int) -> None:
    """Split the CPU by hand, before either side runs, so both sides find the same devices."""
    import tensorflow as tf

    if replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])


def run(replicas: int, repeats: int, steps: int, epochs: int) -> dict[str, Any]:
    """Prepare the three sides, warm each up, then time ``fit`` in rotating order."""
    import tensorflow as tf

    split_cpu(replicas)
    # A partial last batch, as real datasets have: the seed recipe trains on it, the recommended one drops it.
    features, labels = make_data(steps * GLOBAL_BATCH + GLOBAL_BATCH // 2)
    preparers: dict[str, tuple[Callable[[int], tuple[Any, Any]], Callable[..., Any]]] = {
        "seed": (prepare_by_hand, seed_dataset),
        "tfstrategy": (prepare_with_tfstrategy, tfstrategy_dataset),
        "recommended": (prepare_recommended, recommended_dataset),
    }
    sides: dict[str, dict[str, Any]] = {}
    for name, (prepare, make_dataset) in preparers.items():
        strategy, model = prepare(replicas)  # a strategy by hand, a Selection through tfstrategy
        dataset = make_dataset(strategy, features, labels)
        examples = sum(int(batch[0].shape[0]) for batch in dataset) * epochs
        model.fit(dataset, epochs=1, verbose=0)  # warm-up: tracing and first-step costs are not throughput
        sides[name] = {"model": model, "dataset": dataset, "examples": examples, "samples": [],
                       "cpu_samples": [], "replicas": int(getattr(strategy, "strategy", strategy).num_replicas_in_sync),
                       "steps_per_execution": int(getattr(model, "steps_per_execution", 1) or 1)}
    for repeat in range(repeats):
        for name in SIDES[repeat % len(SIDES):] + SIDES[: repeat % len(SIDES)]:
            side = sides[name]
            start, cpu_start = time.perf_counter(), time.process_time()
            side["model"].fit(side["dataset"], epochs=epochs, verbose=0)
            side["samples"].append(side["examples"] / (time.perf_counter() - start))
            # CPU seconds of all this process's threads: steadier than wall time on a shared machine.
            side["cpu_samples"].append(side["examples"] / (time.process_time() - cpu_start))
    return {
        "replicas": replicas,
        "tensorflow": tf.__version__,
        "keras": tf.keras.__version__,
        "sides": {name: {key: side[key] for key in ("samples", "cpu_samples", "examples", "replicas", "steps_per_execution")} for name, side in sides.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=1, help="logical CPU replicas (1 = the CPU unsplit)")
    parser.add_argument("--repeats", type=int, default=9, help="timed fit calls per side")
    parser.add_argument("--steps", type=int, default=96, help="full global batches per epoch")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per timed fit call")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.replicas, args.repeats, args.steps, args.epochs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
