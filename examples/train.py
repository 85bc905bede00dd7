"""The how-to's steps 2-4, runnable on any host: select, build in scope, batch, fit.

The same file runs on a CPU laptop, one GPU, several GPUs or as one worker of a
multi-worker job; only the command line (or the TFSTRATEGY_* variables) changes:

    python examples/train.py                      # every GPU, or the CPU
    python examples/train.py --cpu-replicas 4     # rehearse 4 replicas on a CPU
    python examples/train.py --devices gpu:0,gpu:1 --steps-per-execution 8
    TFSTRATEGY_CPU_REPLICAS=2 python examples/train.py --epochs 1

It trains on a synthetic regression problem it generates (no downloads).
"""

from __future__ import annotations

import argparse
import os
import sys

#: The how-to's global batch: the total across all replicas.
GLOBAL_BATCH = 256
FEATURES = 8
TRAIN_EXAMPLES = 10_000
VALIDATION_EXAMPLES = 2_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", help="auto, mirrored, one_device, default, multi_worker or tpu (env TFSTRATEGY_STRATEGY)")
    parser.add_argument("--devices", help="e.g. gpu:0,gpu:1 or cpu (env TFSTRATEGY_DEVICES)")
    parser.add_argument("--cpu-replicas", type=int, help="split the CPU into N logical replicas (env TFSTRATEGY_CPU_REPLICAS)")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the training data (default: 10)")
    parser.add_argument("--steps-per-execution", type=int, default=1, help="training steps per tf.function call (default: 1)")
    return parser.parse_args(argv)


def _synthetic(examples: int, seed: int):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    true_weights = np.random.default_rng(42).normal(size=(FEATURES, 1))
    x = rng.normal(size=(examples, FEATURES)).astype("float32")
    y = (np.sin(x) @ true_weights + 0.05 * rng.normal(size=(examples, 1))).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y))


def build_model():
    """A small MLP regressor (the how-to's ``build_model()``)."""
    import keras

    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def make_train_dataset():
    """Unbatched, shuffled training examples; tfstrategy batches them."""
    return _synthetic(TRAIN_EXAMPLES, seed=0).shuffle(TRAIN_EXAMPLES, seed=0)


def make_validation_dataset():
    """Unbatched validation examples from the same distribution."""
    return _synthetic(VALIDATION_EXAMPLES, seed=1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tfstrategy
    from tfstrategy.patches.keras_steps_per_execution import fix_steps_per_execution

    # Step 2: select the strategy first (before anything starts TensorFlow, so
    # --cpu-replicas can split the CPU), then build and compile in its scope.
    selection = tfstrategy.select(strategy=args.strategy, devices=args.devices, cpu_replicas=args.cpu_replicas)
    print(f"strategy {selection.strategy.__class__.__name__} with {selection.num_replicas} replica(s): {selection.explain()}")
    with selection.scope():
        model = build_model()
        model.compile(optimizer="adam", loss="mse", metrics=["mae"], steps_per_execution=args.steps_per_execution)
    # Keras 3.15 fails steps_per_execution > 1 on 2+ replicas; a no-op elsewhere.
    fix_steps_per_execution(model)

    # Step 3: batch with the global batch, checked against the replicas.
    train_source, validation_source = make_train_dataset(), make_validation_dataset()
    train_plan = tfstrategy.plan_dataset(train_source, selection, global_batch=GLOBAL_BATCH)
    validation_plan = tfstrategy.plan_dataset(validation_source, selection, global_batch=GLOBAL_BATCH, training=False)
    print("train plan:\n  " + "\n  ".join(train_plan.lines()))
    print("validation plan:\n  " + "\n  ".join(validation_plan.lines()))
    train_ds = tfstrategy.prepare_dataset(train_source, selection, plan=train_plan)
    val_ds = tfstrategy.prepare_dataset(validation_source, selection, plan=validation_plan)

    # Step 4: fit; the model holds the strategy, so no scope is needed here.
    history = model.fit(train_ds, validation_data=val_ds, epochs=args.epochs, shuffle=False)
    final = {name: round(values[-1], 4) for name, values in history.history.items()}
    print("final " + " ".join(f"{name}={value}" for name, value in final.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
