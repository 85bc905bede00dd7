"""A launched worker that counts its threads over many all-reduce steps (tests/selection/test_collective_threads.py).

``tfstrategy.select()`` makes the MultiWorkerMirroredStrategy with tfstrategy's default collective timeout;
each step all-reduces once across the workers. The worker writes its thread count (``/proc/self/status``)
after the first steps and after all of them to ``<out>/worker-<index>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import tensorflow as tf

import tfstrategy

FIRST_STEPS = 20


def threads() -> int:
    """The process's thread count, as the kernel reports it."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    selection = tfstrategy.select()
    strategy = selection.strategy

    @tf.function
    def step() -> tf.Tensor:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", tf.constant(1.0)))

    counts = {}
    for number in range(1, args.steps + 1):
        step()
        if number == FIRST_STEPS:
            counts["first"] = threads()
    counts["last"] = threads()
    counts["explain"] = selection.explain()
    index = os.environ["TFSTRATEGY_WORKER_INDEX"]
    (args.out / f"worker-{index}.json").write_text(json.dumps(counts))


if __name__ == "__main__":
    main()
