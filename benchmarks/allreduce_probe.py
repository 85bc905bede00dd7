"""Where a small all-reduce's time goes under a 2-worker MultiWorkerMirroredStrategy (benchmarks/README.md).

Run on one host, each worker pinned to its own core::

    python -m tfstrategy launch -n 2 -- python benchmarks/allreduce_probe.py --repeats 60

Each worker prints one JSON line: the median milliseconds of a call of each
``tf.function`` below (``.numpy()`` waits for it), so the cost of the call
itself, of one collective, of a chain of collectives and of several small
collectives against one packed one can be told apart. Communication options:
``AUTO`` and ``RING`` implementations, and a collective timeout (tfstrategy's
strategies carry one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def median_ms(function, argument, repeats: int) -> float:
    """Median wall milliseconds of ``function(argument)`` to completion, after two warm-up calls."""
    import tensorflow as tf

    def finish(result):
        return tf.nest.map_structure(lambda value: value.numpy() if hasattr(value, "numpy") else value, result)

    finish(function(argument))
    finish(function(argument))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        finish(function(argument))
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    index = int(os.environ.get("TFSTRATEGY_WORKER_INDEX", "0"))
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[index % len(cores)]})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    options = tf.distribute.experimental.CommunicationOptions
    implementation = tf.distribute.experimental.CommunicationImplementation
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    local = strategy.experimental_local_results
    kilobyte = strategy.experimental_distribute_values_from_function(lambda _: tf.ones([256]))
    scalars = [strategy.experimental_distribute_values_from_function(lambda _, i=i: tf.constant(float(i)))
               for i in range(3)]
    result: dict[str, float] = {}

    @tf.function(autograph=False)
    def no_collective(value):
        return strategy.run(lambda t: t + 1.0, args=(value,))

    result["call with strategy.run, no collective"] = median_ms(lambda v: local(no_collective(v)), kilobyte, args.repeats)
    for name, option in (("AUTO", options()), ("RING", options(implementation=implementation.RING)),
                         ("AUTO, timeout 60 s", options(timeout_seconds=60.0))):
        @tf.function(autograph=False)
        def one(value, option=option):
            return strategy.extended.reduce_to("SUM", value, destinations=value, options=option)

        result[f"1 KB all-reduce, {name}"] = median_ms(lambda v, one=one: local(one(v)), kilobyte, args.repeats)

    @tf.function(autograph=False)
    def chain(value):
        for _ in range(10):
            value = strategy.extended.reduce_to("SUM", value, destinations=value)
        return value

    result["10 chained 1 KB all-reduces in one call, per all-reduce"] = round(
        median_ms(lambda v: local(chain(v)), kilobyte, args.repeats) / 10, 3)

    @tf.function(autograph=False)
    def separate(values):
        return [strategy.extended.reduce_to("SUM", value, destinations=value) for value in values]

    @tf.function(autograph=False)
    def packed(values):
        return strategy.extended.batch_reduce_to("SUM", [(value, value) for value in values])

    result["3 scalars, 3 all-reduces in one call"] = median_ms(
        lambda v: [local(x) for x in separate(v)], scalars, args.repeats)
    result["3 scalars, one batch_reduce_to (packed)"] = median_ms(
        lambda v: [local(x) for x in packed(v)], scalars, args.repeats)
    print(json.dumps({"worker": index, "ms": result}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
