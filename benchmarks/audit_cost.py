"""What the scope audit and creation-site recording cost, next to plain TensorFlow work.

Measures, on N logical-CPU replicas, in one process:
  - audit_scope on a compiled, trained model vs one fit epoch of the same model;
  - creating tf.Variables with creation-site recording vs without it (plain
    TensorFlow), i.e. the per-variable cost of recording.

Prints a table and writes benchmarks/results/audit_cost.json.

    python benchmarks/audit_cost.py --cpu-replicas 4 --layers 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import tfstrategy


def median_seconds(run, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-replicas", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8, help="Dense layers in the model (2 variables each)")
    parser.add_argument("--variables", type=int, default=2000, help="tf.Variables created to time recording")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    selection = tfstrategy.select(cpu_replicas=args.cpu_replicas, env={})
    import keras
    import numpy as np
    import tensorflow as tf

    from tfstrategy.scope.creation_sites import recording

    def build_model() -> keras.Model:
        inputs = keras.Input(shape=(32,))
        hidden = inputs
        for _ in range(args.layers):
            hidden = keras.layers.Dense(32, activation="relu")(hidden)
        return keras.Model(inputs, keras.layers.Dense(1)(hidden))

    def create_variables() -> None:
        for _ in range(args.variables):
            tf.Variable(0.0)

    x = np.random.default_rng(0).random((256, 32), dtype=np.float32)
    y = np.ones((256, 1), np.float32)
    model, report = tfstrategy.build_in_scope(selection, build_model, optimizer="adam", loss="mse", metrics=["mae"])
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # trace once
    fit_epoch = median_seconds(lambda: model.fit(x, y, batch_size=64, epochs=1, verbose=0), args.repeat)
    audit = median_seconds(lambda: tfstrategy.audit_scope(model, selection), args.repeat * 10)
    variables = len(tfstrategy.audit_scope(model, selection).variables)

    # Recording on vs off: select() installed the recorder in this thread only,
    # so create variables in a fresh thread (plain TensorFlow) and there inside
    # recording(), alternating the two so load changes hit both alike.
    import threading

    def plain() -> float:
        started = time.perf_counter()
        create_variables()
        return time.perf_counter() - started

    def recorded() -> float:
        with recording():
            return plain()

    timings: dict[str, list[float]] = {"plain": [], "recorded": []}

    def work() -> None:
        plain(), recorded()  # warm up
        for _ in range(args.repeat):
            timings["plain"].append(plain())
            timings["recorded"].append(recorded())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    plain_create = statistics.median(timings["plain"])
    recorded_create = statistics.median(timings["recorded"])

    # The recorder's own work per variable (stack walk + bookkeeping), without
    # TensorFlow's variable creation around it.
    from tfstrategy.scope.creation_sites import _record_site

    variable = tf.Variable(0.0)
    calls = 20000
    recorder_alone = (
        median_seconds(lambda: [_record_site(lambda **kwargs: variable) for _ in range(calls)], args.repeat) / calls
    )
    rows = {
        "replicas": selection.num_replicas,
        "variables_audited": variables,
        "audit_seconds": audit,
        "fit_epoch_seconds": fit_epoch,
        "audit_vs_fit_epoch": audit / fit_epoch,
        "audit_microseconds_per_variable": audit / variables * 1e6,
        "create_variables": args.variables,
        "create_plain_seconds": plain_create,
        "create_recorded_seconds": recorded_create,
        "recording_vs_plain_create": recorded_create / plain_create,
        "recording_microseconds_per_variable": (recorded_create - plain_create) / args.variables * 1e6,
        "recorder_alone_microseconds_per_variable": recorder_alone * 1e6,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    width = max(len(key) for key in rows)
    for key, value in rows.items():
        print(f"{key:<{width}}  {value:.4g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    out = Path(__file__).parent / "results" / "audit_cost.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
