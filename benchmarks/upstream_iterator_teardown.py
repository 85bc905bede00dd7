"""Reproduce, with TensorFlow alone, a tf.data iterator's teardown waiting out its autotuning thread's sleep.

No tfstrategy import: this is an upstream bug report in a script. An iterator of a pipeline that autotunes (the
default) runs a ``tf_data_model`` thread that tunes, then sleeps, each sleep twice the last, from 10 ms to 60 s.
Freeing the iterator cancels the thread and waits for it. ``CancellationManager::StartCancel`` runs the thread's
wake-up callback before it marks itself cancelled, and ``Model::OptimizeLoop`` checks "cancelled?" on waking: a
thread that wakes in between sleeps out its period again, and the teardown (holding Python's GIL) waits with it.

Each trial makes an iterator over ``Dataset.range(...).map(..., num_parallel_calls=AUTOTUNE)``, takes one element,
keeps the iterator ``--lived`` seconds (its sleep grows to about that), then frees it and times the teardown;
trials alternate between autotuning on and off (``options.autotune.enabled``), so that the machine's load hits
both alike. ``--load N`` runs N busy processes beside it: the race is won more often on a busy machine::

    .venv/bin/python benchmarks/upstream_iterator_teardown.py --lived 3 --trials 40 --load 2

It exits 0; the summary lines (how many teardowns of each kind took longer than ``--slow`` seconds) are the result.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time


def spin() -> None:
    """Keep one core busy until killed."""
    while True:
        pass


def teardown_seconds(tf: object, lived: float, autotune: bool) -> float:
    """Seconds that freeing one iterator took, after it was kept ``lived`` seconds."""
    options = tf.data.Options()
    options.autotune.enabled = autotune
    dataset = tf.data.Dataset.range(10**9).map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE)
    iterator = iter(dataset.with_options(options))
    next(iterator)
    time.sleep(lived)
    start = time.monotonic()
    del iterator  # the last reference: the C++ iterator goes here
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lived", type=float, default=3.0, help="seconds each iterator is kept (default 3)")
    parser.add_argument("--trials", type=int, default=40, help="iterators of each kind (default 40)")
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the trials (default 2)")
    parser.add_argument("--slow", type=float, default=0.5, help="a teardown longer than this is counted (default 0.5)")
    parser.add_argument("--json", help="also write the summary to this file")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for process in spinners:
        process.start()
    took: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for trial in range(args.trials):
            for kind in ("on", "off"):
                seconds = teardown_seconds(tf, args.lived, autotune=kind == "on")
                took[kind].append(seconds)
                if seconds > args.slow:
                    print(f"trial {trial}, autotuning {kind}: teardown {seconds:.2f} s", flush=True)
    finally:
        for process in spinners:
            process.kill()
    summary = {"tensorflow": tf.__version__, "lived": args.lived, "load": args.load, "slow": args.slow}
    for kind, seconds in took.items():
        slow = [round(value, 2) for value in seconds if value > args.slow]
        summary[f"autotuning {kind}"] = {"trials": len(seconds), "slow": len(slow), "slow_seconds": slow,
                                         "median": round(sorted(seconds)[len(seconds) // 2], 4)}
        print(f"TensorFlow {tf.__version__}, autotuning {kind}: {len(slow)} of {len(seconds)} teardowns took more "
              f"than {args.slow} s {slow} (median {summary[f'autotuning {kind}']['median']} s), iterators "
              f"{args.lived} s old, {args.load} busy processes beside", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(summary, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
