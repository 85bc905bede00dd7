"""What the divergence sentinel costs: ``fit`` with and without it, in one process.

Run once per replica count (logical CPU devices are set before TensorFlow starts)::

    python benchmarks/sentinel_cost.py --replicas 2 --repeats 5 --epochs 3 --steps 64

The workload is the benchmark MLP of ``benchmarks/workloads.py`` (global batch
256). Both sides train the same model from the same weights on the same data,
in alternating order; the sentinel side adds ``tfstrategy.divergence_sentinel()``
at its default interval (each epoch's end). Prints one JSON object: per repeat
the CPU seconds of each side and their ratio (with / without), and min-max over
repeats. The target is a ratio under 1.01.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workloads  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64, help="steps per epoch")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)

    import tfstrategy

    selection = tfstrategy.select(cpu_replicas=args.replicas if args.replicas > 1 else None, env={})
    features, labels = workloads.make_data(args.steps * workloads.GLOBAL_BATCH)
    dataset = tfstrategy.prepare_dataset(workloads.examples_dataset(features, labels), selection,
                                         global_batch=workloads.GLOBAL_BATCH)
    with selection.scope():
        model = workloads.build_model()
        model.compile(**workloads.COMPILE_ARGS)
    model.fit(dataset, epochs=1, verbose=0)  # warm-up: trace the step once
    start = model.get_weights()

    def timed(with_sentinel: bool) -> float:
        model.set_weights(start)
        callbacks = [tfstrategy.divergence_sentinel()] if with_sentinel else []
        began = time.process_time()
        model.fit(dataset, epochs=args.epochs, verbose=0, callbacks=callbacks)
        return time.process_time() - began

    began = time.process_time()
    timed(True)  # warm-up: trace the sentinel's check once (a job pays this once; later fits reuse it)
    first_fit_with = time.process_time() - began
    rows = []
    for repeat in range(args.repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        seconds = {side: timed(side) for side in order}
        rows.append({"without": seconds[False], "with": seconds[True], "ratio": seconds[True] / seconds[False]})
    # One check on its own: what the sentinel adds at each epoch end, whatever the epoch's length.
    from tfstrategy.training.sentinel import Sentinel

    sentinel = Sentinel(selection, model.weights)
    sentinel.check()
    began = time.process_time()
    for _ in range(50):
        sentinel.check()
    check_seconds = (time.process_time() - began) / 50
    ratios = [row["ratio"] for row in rows]
    result = {
        "replicas": args.replicas, "epochs": args.epochs, "steps_per_epoch": args.steps,
        "interval": "epoch", "repeats": rows, "ratio_min": min(ratios), "ratio_max": max(ratios),
        "ratio_median": sorted(ratios)[len(ratios) // 2],
        "check_cpu_seconds": check_seconds,
        "first_fit_with_sentinel_cpu_seconds": first_fit_with,
        "epoch_cpu_seconds_without": sorted(row["without"] for row in rows)[len(rows) // 2] / args.epochs,
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return result


if __name__ == "__main__":
    main()
