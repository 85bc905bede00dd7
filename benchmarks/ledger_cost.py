"""What the worker's ledger (issue 38) costs: ``fit`` step time with and without it, against plain TensorFlow.

Run once per replica count (logical CPU devices are set before TensorFlow starts)::

    python benchmarks/ledger_cost.py --workload mlp --replicas 2 --pairs 9 --epochs 2 --steps 64

Three sides train the same model from the same weights on the same data, in one process and in
rotating order, so drift on a shared machine hits them alike:

- ``plain``: plain TensorFlow, ``fit`` with no callback and no heartbeat thread;
- ``progress``: what ``tfstrategy launch`` did before the ledger: the progress file's two
  callbacks and its heartbeat thread (4 beats a second);
- ``ledger``: the same with the ledger kept (the ``ledger`` step taken: the keeper's callbacks,
  the heartbeat sampling and writing the ledger file, ``Strategy.run`` fingerprinting).

Per pair: seconds per step (wall and process CPU) of each side and the ratios ledger/plain and
ledger/progress, and each side's best step time over the pairs. Apart from ``fit``: the
callbacks' cost per batch, one heartbeat sample and one ledger write (hence the heartbeat's share
of a core), and one fingerprint of the train step's graph beside the trace it follows. Prints one JSON object (``--json``: also written there). The target is a ratio under 1.01
and no extra collective (the ledger adds no TensorFlow op: the train graph's fingerprint is the
same with and without it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workloads  # noqa: E402

SIDES = ("plain", "progress", "ledger")


class Heartbeat:
    """The worker's heartbeat loop (:func:`tfstrategy.runtime.worker_watch._heartbeat`), stoppable."""

    def __init__(self, writer: Any) -> None:
        from tfstrategy.launch.reports import HEARTBEAT_SECONDS
        from tfstrategy.runtime import worker_watch

        self._stop = threading.Event()

        def beat() -> None:
            while not self._stop.is_set():
                writer.beat()
                worker_watch._sample_ledger()
                self._stop.wait(HEARTBEAT_SECONDS)

        self._thread = threading.Thread(target=beat, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def per_call(function: Callable[[], Any], calls: int) -> float:
    """Process CPU seconds per call of ``function`` (best of 3 runs of ``calls`` calls)."""
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        for _ in range(calls):
            function()
        best = min(best, (time.process_time() - began) / calls)
    return best


def callbacks_cost(keras: Any) -> dict[str, float]:
    """Seconds per train batch of the two callbacks' begin and end, without and with the ledger."""
    from tfstrategy.runtime import worker_watch
    from tfstrategy.runtime.ledger import _KEEPER

    keeper = _KEEPER[:]
    _KEEPER.clear()
    counting = worker_watch.progress_callbacks(keras)
    _KEEPER.extend(keeper)
    with_ledger = worker_watch.progress_callbacks(keras)
    _KEEPER[0].epoch_begins(0)
    costs = {}
    for name, (first, last) in (("progress", counting), ("ledger", with_ledger)):
        def batch(first: Any = first, last: Any = last) -> None:
            last.on_train_batch_begin(0)
            first.on_train_batch_end(0)

        costs[name] = per_call(batch, 20000)
    return costs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=["mlp"], default="mlp", help="the benchmark MLP of workloads.py")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=9, help="rounds of the three sides, in rotating order")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=64, help="steps per epoch")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)

    from tfstrategy.selection.cpu_split import configure_cpu_replicas

    if args.replicas > 1:
        configure_cpu_replicas(args.replicas)
    import keras
    import tensorflow as tf

    from tfstrategy.launch.ledger import read_ledger
    from tfstrategy.launch.reports import ProgressWriter
    from tfstrategy.runtime import ledger as ledger_module
    from tfstrategy.runtime import worker_watch
    from tfstrategy.runtime.inputs import PlanInputs
    from tfstrategy.runtime.ledger import current_keeper
    from tfstrategy.runtime.ledger_traces import summarize_graph
    from tfstrategy.runtime.steps import KeepLedger
    from tfstrategy.state.registry import RUNTIME

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(args.replicas)])
    features, labels = workloads.make_data(args.steps * workloads.GLOBAL_BATCH)
    dataset = workloads.seed_dataset(None, features, labels)
    with strategy.scope():
        model = workloads.build_model()
        model.compile(**workloads.COMPILE_ARGS)

    model.fit(dataset, epochs=1, verbose=0)  # builds the optimizer: the step can then be traced alone

    # Plain TensorFlow's train graph, traced before the ledger exists.
    def train_graph() -> Any:
        spec = dataset.element_spec

        def replica_step(x: Any, y: Any) -> Any:
            return model.train_step((x, y))

        traced = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))
        return traced.get_concrete_function(*spec).graph

    plain_fingerprint = summarize_graph(train_graph()).fingerprint()

    directory = Path(tempfile.mkdtemp(prefix="ledger-cost-"))
    writer = ProgressWriter(directory / "worker-0.progress")
    RUNTIME.progress.append(writer)
    step = KeepLedger(PlanInputs(consumer="hook", under_launcher=True))
    step.take()
    keeper = current_keeper()
    assert keeper is not None
    began = time.process_time()
    graph = train_graph()  # a trace: TensorFlow's own cost, which the fingerprint adds to
    trace_seconds = time.process_time() - began
    summary = summarize_graph(graph)
    fingerprint_seconds = per_call(lambda: summarize_graph(graph).fingerprint(), 20)

    start = model.get_weights()

    def timed(side: str) -> tuple[float, float]:
        """Seconds per step (wall, process CPU) of one ``fit`` of ``side``."""
        model.set_weights(start)
        ledger_module._KEEPER[:] = [keeper] if side == "ledger" else []  # progress_callbacks asks for it
        callbacks = [] if side == "plain" else list(worker_watch.progress_callbacks(keras) or ())
        beat = None if side == "plain" else Heartbeat(writer)
        if side == "ledger":
            keeper.call_begins("fit")  # what the count_batches rewrite of fit does
        wall, cpu = time.perf_counter(), time.process_time()
        model.fit(dataset, epochs=args.epochs, verbose=0, callbacks=callbacks)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if side == "ledger":
            keeper.call_ends("fit", normally=True)
        if beat is not None:
            beat.stop()
        ledger_module._KEEPER[:] = [keeper]
        steps = args.epochs * args.steps
        return wall / steps, cpu / steps

    model.make_train_function(force=True)
    timed("ledger")  # warm-up: trace the step once, with the fingerprinting Strategy.run
    rows = []
    for index in range(args.pairs):
        order = SIDES[index % 3:] + SIDES[:index % 3]
        seconds = {side: timed(side) for side in order}
        rows.append({
            **{f"{side}_step_seconds": seconds[side][0] for side in SIDES},
            **{f"{side}_step_cpu_seconds": seconds[side][1] for side in SIDES},
            "ledger_vs_plain": seconds["ledger"][0] / seconds["plain"][0],
            "ledger_vs_progress": seconds["ledger"][0] / seconds["progress"][0],
            "ledger_vs_plain_cpu": seconds["ledger"][1] / seconds["plain"][1],
        })

    # The heartbeat's side on its own: one sample (no write), one write.
    keeper._written_at = time.perf_counter() + 1e9  # never due: sample() only samples
    sample_seconds = per_call(keeper.sample, 2000)
    keeper._written_at = float("-inf")
    keeper.epoch_begins(0)

    def write() -> None:
        keeper.batch_begins()  # a change, so flush() writes
        keeper.flush()

    write_seconds = per_call(write, 200)
    written = read_ledger(keeper.path)
    callbacks = callbacks_cost(keras)
    step.undo()
    RUNTIME.progress.clear()

    def spread(key: str) -> dict[str, float]:
        values = [row[key] for row in rows]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    median_step = statistics.median(row["plain_step_seconds"] for row in rows)
    heartbeat_share = 4 * sample_seconds + write_seconds  # per second of wall time: 4 samples, at most one write
    result = {
        "workload": args.workload, "replicas": args.replicas, "pairs": args.pairs, "epochs": args.epochs,
        "steps_per_epoch": args.steps, "global_batch": workloads.GLOBAL_BATCH,
        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at the end, TensorFlow {tf.__version__}, "
                   f"Keras {keras.__version__}",
        "rows": rows,
        "ledger_vs_plain": spread("ledger_vs_plain"),
        "ledger_vs_progress": spread("ledger_vs_progress"),
        "ledger_vs_plain_cpu": spread("ledger_vs_plain_cpu"),
        "plain_step_seconds_median": median_step,
        # Best of the pairs: the least disturbed fit of each side (a shared machine only ever slows one down).
        "best_step_seconds": {side: min(row[f"{side}_step_seconds"] for row in rows) for side in SIDES},
        "best_step_cpu_seconds": {side: min(row[f"{side}_step_cpu_seconds"] for row in rows) for side in SIDES},
        "callbacks_seconds_per_batch": callbacks,
        "ledger_callbacks_share_of_step": (callbacks["ledger"] - callbacks["progress"]) / median_step,
        "heartbeat_sample_seconds": sample_seconds,
        "ledger_write_seconds": write_seconds,
        "heartbeat_core_share": heartbeat_share,
        "fingerprint_seconds_per_trace": fingerprint_seconds,
        "trace_cpu_seconds": trace_seconds,
        "train_graph": f"{summary.describe()}, {summary.collectives} collectives",
        "same_train_graph_with_ledger": summary.fingerprint() == plain_fingerprint,
        "ledger_written": written is not None and written.total_steps > 0,
    }
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return result


if __name__ == "__main__":
    main()
