"""Three plain training scripts for the performance report's benchmark, one per bottleneck.

A user's script, nothing of tfstrategy in it: it makes its own strategy,
``MultiWorkerMirroredStrategy()`` when ``TF_CONFIG`` is set (``tfstrategy
launch``), else ``MirroredStrategy()`` (``tfstrategy run``, whose
``--cpu-replicas N`` gives it N logical CPU replicas), builds its data and model
in the usual way and calls ``fit`` once. Run through the CLI to get the report::

    tfstrategy run --profile --profile-dir D -- python benchmarks/profile_workloads.py --workload input
    tfstrategy run --profile --profile-dir D --cpu-replicas 4 -- python benchmarks/profile_workloads.py --workload compute
    tfstrategy launch -n 2 --profile --profile-dir D -- python benchmarks/profile_workloads.py --workload reduction

- ``input``: a small Dense model (32-64-1, Adam, batch 64) on data whose
  ``map`` is slow: 15 chained ``matvec`` + ``sin`` per element (30 ops), one
  element at a time (no ``num_parallel_calls``) and no ``prefetch``.
- ``compute``: the CNN of ``benchmarks/mw_worker.py`` (``build_cnn``: conv16-
  pool-conv32-pool-dense64-10 on 28x28x1), 128 per replica, data in memory
  with ``.prefetch(AUTOTUNE)``.
- ``reduction``: a wide MLP (256-1024-1024-1, ~1.3 M parameters, 5 MB of
  gradients), 8 per replica, SGD: little compute against a large all-reduce.

With ``--out``, worker ``i`` writes ``<out>/run-<i>.json``: its strategy and
replicas, the fit's wall seconds, and which ``tfstrategy`` package the hook
imported (so the benchmark can check it ran the tree under test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WORKLOADS = ("input", "compute", "reduction")
#: Per-replica batch of each workload (the input-bound one's is global: 64 whatever the replicas).
BATCH = {"input": 64, "compute": 128, "reduction": 8}
#: Default steps of the one fit (a few hundred; the CNN's steps are the longest).
STEPS = {"input": 200, "compute": 120, "reduction": 300}
#: The input-bound map: CHAIN x (matvec by a FEATURES x FEATURES matrix, sin) per element. With 32 features the
#: map is ~9 ms of CPU a batch, no more than the step itself on 4 replicas or 2 workers (not input-bound there);
#: with 512, ~30 ms.
INPUT_FEATURES, CHAIN = 512, 15


def make_strategy() -> Any:
    import tensorflow as tf

    if os.environ.get("TF_CONFIG"):
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.MirroredStrategy()


def global_batch(workload: str, replicas: int) -> int:
    return BATCH[workload] if workload == "input" else BATCH[workload] * replicas


def make_dataset(workload: str, batch: int, seed: int = 0) -> Any:
    """The workload's training data, batched with the global ``batch``, repeating."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    if workload == "input":
        x = rng.normal(size=(4096, INPUT_FEATURES)).astype("float32")
        y = rng.normal(size=(4096, 1)).astype("float32")
        mix = tf.constant(rng.normal(size=(INPUT_FEATURES, INPUT_FEATURES)).astype("float32") / INPUT_FEATURES**0.5)

        def slow(features: Any, label: Any) -> Any:
            for _ in range(CHAIN):  # 30 small ops, one after the other, per element
                features = tf.sin(tf.linalg.matvec(mix, features))
            return features, label

        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().map(slow).batch(batch, drop_remainder=True)
    if workload == "compute":
        x = rng.random((2048, 28, 28, 1), dtype="float32")
        y = rng.integers(0, 10, size=(2048,)).astype("int32")
        return (tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
                .prefetch(tf.data.AUTOTUNE))
    x = rng.normal(size=(4096, 256)).astype("float32")
    y = rng.normal(size=(4096, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def build_model(workload: str) -> Any:
    """The workload's model, compiled (call in the strategy's scope)."""
    import keras

    if workload == "input":
        model = keras.Sequential([keras.Input((INPUT_FEATURES,)), keras.layers.Dense(64, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    elif workload == "compute":
        model = keras.Sequential([  # benchmarks/mw_worker.py's build_cnn
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(),
            keras.layers.Flatten(), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10),
        ])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    else:
        model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")
    return model


def worker_index() -> int:
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
    return int(task.get("index", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=WORKLOADS, required=True)
    parser.add_argument("--steps", type=int, help="steps of the one fit (default: per workload, a few hundred)")
    parser.add_argument("--out", type=Path, help="folder for run-<i>.json")
    args = parser.parse_args(argv)
    strategy = make_strategy()
    replicas = int(strategy.num_replicas_in_sync)
    batch = global_batch(args.workload, replicas)
    dataset = make_dataset(args.workload, batch, seed=worker_index())
    with strategy.scope():
        model = build_model(args.workload)
    steps = args.steps or STEPS[args.workload]
    began = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    seconds = time.perf_counter() - began
    hooked = sys.modules.get("tfstrategy")
    result = {"workload": args.workload, "worker": worker_index(), "strategy": type(strategy).__name__,
              "replicas": replicas, "global_batch": batch, "steps": steps, "fit_seconds": seconds,
              "tfstrategy": os.path.dirname(hooked.__file__) if hooked is not None else None}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"run-{result['worker']}.json").write_text(json.dumps(result), encoding="utf-8")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
