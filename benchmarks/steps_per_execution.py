"""Speed-up of ``steps_per_execution`` with tfstrategy's fix, at 1 and N replicas.

For each replica count it times Keras ``fit`` epochs (after a warm-up epoch that
traces) for three set-ups in the same process:

- plain Keras, ``steps_per_execution=1``: the baseline that works everywhere;
- plain Keras, ``steps_per_execution=K``: fails on 2+ replicas (Keras 3.15);
- ``steps_per_execution=K`` with ``tfstrategy.fix_steps_per_execution``.

and prints the ratio baseline / fixed (higher is faster), then writes JSON.
Timings on a shared machine are noisy; each set-up runs ``--rounds`` times,
interleaved, and the fastest median epoch counts. Process CPU time per epoch
(all threads) is reported beside wall time: it is less disturbed by other jobs.

    python benchmarks/steps_per_execution.py --replicas 1,4 --steps-per-execution 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,4", help="replica counts, comma-separated (default: 1,4)")
    parser.add_argument("--steps-per-execution", type=int, default=32, help="K (default: 32)")
    parser.add_argument("--examples", type=int, default=16384, help="training examples per epoch (default: 16384)")
    parser.add_argument("--global-batch", type=int, default=64, help="global batch (default: 64)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per run (default: 3)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions (default: 2)")
    parser.add_argument("--json", type=Path, default=Path(__file__).with_name("steps_per_execution.json"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    replica_counts = [int(part) for part in args.replicas.split(",")]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tfstrategy
    from tfstrategy.patches.keras_steps_per_execution import fix_steps_per_execution
    from tfstrategy.selection.cpu_split import configure_cpu_replicas

    configure_cpu_replicas(max(replica_counts))
    import keras
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.examples, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    source = tf.data.Dataset.from_tensor_slices((x, y)).cache()

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []
            self.cpu_seconds: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.started, self.cpu_started = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.started)
            self.cpu_seconds.append(time.process_time() - self.cpu_started)

    def epoch_seconds(strategy, spe: int, fixed: bool) -> tuple[float, float] | str:
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=spe)
        if fixed:
            fix_steps_per_execution(model)
        data = tfstrategy.prepare_dataset(source, strategy, global_batch=args.global_batch)
        try:
            model.fit(data, epochs=1, verbose=0)  # warm-up: tracing
        except tf.errors.InvalidArgumentError as error:
            lines = str(error).strip().splitlines()
            return "fails: " + next((line.strip() for line in lines if "You must feed" in line), lines[0])[:120]
        timer = EpochTimer()
        model.fit(data, epochs=args.epochs, verbose=0, callbacks=[timer])
        return statistics.median(timer.seconds), statistics.median(timer.cpu_seconds)

    setups = [("keras_spe1", 1, False), (f"keras_spe{args.steps_per_execution}", args.steps_per_execution, False)]
    setups.append((f"tfstrategy_spe{args.steps_per_execution}", args.steps_per_execution, True))
    strategies = {n: tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)]) for n in replica_counts}
    runs: dict[int, dict[str, list]] = {n: {name: [] for name, _, _ in setups} for n in replica_counts}
    for _ in range(args.rounds):
        for n in replica_counts:
            for name, spe, fixed in setups:
                runs[n][name].append(epoch_seconds(strategies[n], spe, fixed))
    # The fastest round of each set-up (wall and CPU separately); a failed set-up reports its error.
    def fastest(results: list, index: int) -> float | str:
        return min((r[index] for r in results if isinstance(r, tuple)), default=results[0])

    best = {n: {name: fastest(results, 0) for name, results in by_setup.items()} for n, by_setup in runs.items()}
    best_cpu = {n: {name: fastest(results, 1) for name, results in by_setup.items()} for n, by_setup in runs.items()}

    k = args.steps_per_execution
    names = ("keras_spe1", f"keras_spe{k}", f"tfstrategy_spe{k}")
    print(f"Keras {keras.version()}, TensorFlow {tf.__version__}; {args.examples} examples, global batch {args.global_batch}")
    print("seconds per epoch, wall (process CPU); speed-up = keras spe=1 / tfstrategy spe=K")
    print(f"{'replicas':>8}  {'keras spe=1':>18}  {f'keras spe={k}':>18}  {f'tfstrategy spe={k}':>18}  {'speed-up wall (CPU)':>20}")

    def cell(wall: float | str, cpu: float | str) -> str:
        return f"{wall:.2f} ({cpu:.2f})" if isinstance(wall, float) else "fails"

    def ratio(table: dict, n: int) -> float | None:
        base, fixed = table[n][names[0]], table[n][names[2]]
        return base / fixed if isinstance(base, float) and isinstance(fixed, float) else None

    rows = []
    for n in replica_counts:
        cells = [cell(best[n][name], best_cpu[n][name]) for name in names]
        wall_ratio, cpu_ratio = ratio(best, n), ratio(best_cpu, n)
        print(f"{n:>8}  {cells[0]:>18}  {cells[1]:>18}  {cells[2]:>18}  {f'{wall_ratio:.2f}x ({cpu_ratio:.2f}x)':>20}")
        rows.append(
            {
                "replicas": n,
                "wall_seconds_per_epoch": best[n],
                "cpu_seconds_per_epoch": best_cpu[n],
                "speedup_wall": wall_ratio,
                "speedup_cpu": cpu_ratio,
            }
        )
    payload = {
        "keras": keras.version(),
        "tensorflow": tf.__version__,
        "examples": args.examples,
        "global_batch": args.global_batch,
        "steps_per_execution": args.steps_per_execution,
        "rows": rows,
    }
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
