"""Suite 5: ``steps_per_execution="auto"``: the K it chooses, and what that K is worth, at two loads.

For each workload (the small MLP on 1 and on 4 logical replicas, the
compute-bound CNN on 1) a fresh worker process (logical CPU devices must be
configured before TensorFlow starts) does two things:

(a) ``--tunings`` times: a fresh model from ``tfstrategy.build_in_scope(...,
    steps_per_execution=1)``, then ``tfstrategy.tune_steps_per_execution(model,
    dataset)``; it records the K chosen and the choice's line (timings and why).
(b) With the K chosen most often fixed, ``--pairs`` interleaved rounds (the order
    rotated each round, after a warm-up ``fit`` each) of one ``fit(epochs=1)``
    of three sides:

    - ``auto``: ``build_in_scope(..., steps_per_execution=K)``, the recommended
      dataset (``plan_dataset`` + ``prepare_dataset``): what ``"auto"`` trains
      with once it has chosen;
    - ``k1``: the same model, data and settings with K = 1;
    - ``seed``: the seed recipe by hand (``MirroredStrategy``, model and
      ``compile`` in its scope, ``batch().prefetch()``, K = 1), as
      ``workloads.py`` writes it.

It prints one JSON line: the choices and examples/s of each side, wall and per
CPU-second of the process. The parent runs every worker at each load of
``Budget.auto_k_loads``: ``load`` competing busy processes (a ``while True:
pass`` loop, see :data:`BUSY_LOOP`) run for the whole of that load's workers, so "load 2" means two
processes each wanting a full core of the 2 the machine may have::

    python benchmarks/auto_k.py --workload cnn --replicas 1 --tunings 5 --pairs 9 --steps 96
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from process_time import ROOT, clean_env
from stats import Comparison, SuiteResult, interleaved_order

WORKER = Path(__file__).resolve().parent / "auto_k.py"
#: (workload, logical replicas): one worker process each, in this order.
WORKLOADS = (("mlp", 1), ("mlp", 4), ("cnn", 1))
TITLES = {"mlp": "MLP", "cnn": "CNN"}
SIDES = ("auto", "k1", "seed")
#: Global batch per workload (the CNN's is suite 4's per-worker batch).
BATCH = {"mlp": 256, "cnn": 128}


def workload_label(name: str, replicas: int) -> str:
    return f"{TITLES[name]}, {replicas} replica{'s' if replicas > 1 else ''}"


# --- the worker: one process per (workload, replicas) -------------------------------------


@dataclass(frozen=True)
class _Spec:
    build: Any
    compile_args: dict[str, Any]
    batch: int
    data: Any


def _spec(name: str) -> _Spec:
    import keras

    if name == "mlp":
        import workloads

        return _Spec(workloads.build_model, dict(workloads.COMPILE_ARGS), BATCH["mlp"], workloads.make_data)
    import mw_worker

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _Spec(mw_worker.build_cnn, {"optimizer": "adam", "loss": loss, "metrics": ["accuracy"]}, BATCH["cnn"],
                 lambda examples: mw_worker.make_images(0, examples))


def _seed_side(name: str, spec: _Spec, replicas: int, features: Any, labels: Any) -> tuple[Any, Any]:
    """The seed recipe by hand: ``workloads.py``'s for the MLP, the same steps for the CNN."""
    import tensorflow as tf

    import workloads

    if name == "mlp":
        strategy, model = workloads.prepare_by_hand(replicas)
        return model, workloads.seed_dataset(strategy, features, labels)
    strategy = tf.distribute.MirroredStrategy() if replicas == 1 else tf.distribute.MirroredStrategy(
        devices=[f"/cpu:{i}" for i in range(replicas)])
    with strategy.scope():
        model = spec.build()
        model.compile(**spec.compile_args)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(spec.batch).prefetch(tf.data.AUTOTUNE)
    return model, dataset


def _recommended_dataset(selection: Any, spec: _Spec, features: Any, labels: Any) -> Any:
    """tfstrategy's recommended input (as ``workloads.recommended_dataset``): remainder dropped, prefetch."""
    import tensorflow as tf

    import tfstrategy

    source = tf.data.Dataset.from_tensor_slices((features, labels))
    plan = tfstrategy.plan_dataset(source, selection, global_batch=spec.batch)
    return tfstrategy.prepare_dataset(source, selection, plan=plan)


def run_worker(name: str, replicas: int, tunings: int, pairs: int, steps: int) -> dict[str, Any]:
    """Tune ``tunings`` fresh models, then time auto (K chosen), K = 1 and the seed recipe in rotating order."""
    import tensorflow as tf

    import tfstrategy
    import workloads

    workloads.split_cpu(replicas)
    spec = _spec(name)
    # A partial last batch, as in workloads.py: the seed recipe trains on it, the recommended input drops it.
    features, labels = spec.data(steps * spec.batch + spec.batch // 2)
    selection = workloads._select(replicas)
    dataset = _recommended_dataset(selection, spec, features, labels)

    def build(k: int) -> Any:
        model, _ = tfstrategy.build_in_scope(selection, spec.build, **spec.compile_args, steps_per_execution=k)
        return model

    choices = []
    for _ in range(tunings):
        model = build(1)
        start = time.perf_counter()
        choice = tfstrategy.tune_steps_per_execution(model, dataset)
        choices.append({"steps": choice.steps, "cap": choice.cap, "line": choice.line(), "rounds": choice.rounds,
                        "seconds_per_step": [list(pair) for pair in choice.seconds_per_step],
                        "seconds": round(time.perf_counter() - start, 3)})
    counts = collections.Counter(choice["steps"] for choice in choices)
    chosen = max(counts, key=lambda k: (counts[k], -k))  # the most common; a tie goes to the smaller K

    seed_model, seed_data = _seed_side(name, spec, replicas, features, labels)
    models = {"auto": (build(chosen), dataset, chosen), "k1": (build(1), dataset, 1), "seed": (seed_model, seed_data, 1)}
    sides: dict[str, dict[str, Any]] = {}
    for side, (model, data, k) in models.items():
        examples = sum(int(batch[0].shape[0]) for batch in data)
        model.fit(data, epochs=1, verbose=0)  # warm-up: tracing and first-step costs are not throughput
        sides[side] = {"model": model, "dataset": data, "examples": examples, "steps_per_execution": k,
                       "samples": [], "cpu_samples": [], "seconds": []}
    for repeat in range(pairs):
        for side_name in interleaved_order(SIDES, repeat):
            side = sides[side_name]
            start, cpu_start = time.perf_counter(), time.process_time()
            side["model"].fit(side["dataset"], epochs=1, verbose=0)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            side["samples"].append(side["examples"] / wall)
            side["cpu_samples"].append(side["examples"] / cpu)  # CPU seconds of all this process's threads
            side["seconds"].append(round(wall, 4))
    keep = ("samples", "cpu_samples", "seconds", "examples", "steps_per_execution")
    return {
        "workload": name, "replicas": replicas, "steps_per_epoch": steps, "global_batch": spec.batch,
        "tensorflow": tf.__version__, "tunings": choices, "chosen": chosen,
        "sides": {side_name: {key: side[key] for key in keep} for side_name, side in sides.items()},
    }


# --- the parent: loads, worker processes, rows -----------------------------------------------


def _worker_command(name: str, replicas: int, budget: Any) -> list[str]:
    return [sys.executable, str(WORKER), "--workload", name, "--replicas", str(replicas),
            "--tunings", str(budget.auto_k_tunings), "--pairs", str(budget.auto_k_pairs),
            "--steps", str(budget.auto_k_steps)]


def _run(command: list[str], timeout: float) -> dict[str, Any]:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-800:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


#: A competing process: a busy loop, that also ends once its parent is gone (killed before its ``finally`` ran,
#: e.g. by a test's timeout), checking about every 10 ms.
BUSY_LOOP = ("import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n"
             "    for _ in range(100_000):\n        pass\n")


def run_at_load(load: int, budget: Any, timeout: float = 1800.0) -> dict[str, Any]:
    """Every worker, one after another, with ``load`` busy processes competing for the cores throughout."""
    hogs = []
    try:
        hogs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(load)]
        start = time.perf_counter()
        runs = {}
        for name, replicas in budget.auto_k_workloads:
            runs[workload_label(name, replicas)] = _run(_worker_command(name, replicas, budget), timeout)
        return {"runs": runs, "seconds": round(time.perf_counter() - start, 1),
                "load_average_1m_end": round(os.getloadavg()[0], 2)}
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def _row(name: str, run: dict, baseline: str, candidate: str, key: str, labels: tuple[str, str]) -> Comparison:
    unit = "examples/s" if key == "samples" else "examples/CPU-s"
    return Comparison(name=name, unit=unit, better="higher", baseline_label=labels[0], candidate_label=labels[1],
                      baseline=tuple(run["sides"][baseline][key]), candidate=tuple(run["sides"][candidate][key]))


def run_auto_k_suite(budget: Any) -> SuiteResult:
    loads = tuple(budget.auto_k_loads)
    phases = {load: run_at_load(load, budget) for load in loads}
    rows, details_runs, chosen_notes = [], {}, []
    for load in loads:
        for label, run in phases[load]["runs"].items():
            k = run["chosen"]
            auto = f"auto (K={k})"
            for key, suffix in (("cpu_samples", "per CPU-second"), ("samples", "wall time")):
                rows.append(_row(f"{label}, load {load}: {auto} vs K=1, {suffix}", run, "k1", "auto", key, ("K=1", auto)))
            for key, suffix in (("cpu_samples", "per CPU-second"), ("samples", "wall time")):
                rows.append(_row(f"{label}, load {load}: {auto} vs seed recipe, {suffix}", run, "seed", "auto", key,
                                 ("seed recipe", auto)))
            ks = [choice["steps"] for choice in run["tunings"]]
            details_runs.setdefault(label, {})[str(load)] = {
                "chosen": ks, "all_equal": len(set(ks)) == 1, "steps_per_execution": k,
                "cap": run["tunings"][0]["cap"], "lines": [choice["line"] for choice in run["tunings"]],
                "tuning_seconds": [choice["seconds"] for choice in run["tunings"]],
                "fit_seconds": {side: values["seconds"] for side, values in run["sides"].items()},
                "examples": {side: values["examples"] for side, values in run["sides"].items()},
            }
            chosen_notes.append(f"{label} at load {load}: {ks}")
    loads_text = " and ".join(str(load) for load in loads)
    return SuiteResult(
        name="auto_k",
        title=f"5. steps_per_execution=\"auto\": the K chosen, against K=1 and the seed recipe, at load {loads_text} "
              "(higher is better)",
        rows=tuple(rows),
        notes=(
            f"Each workload runs in a fresh process: {budget.auto_k_tunings} tunings "
            "(`build_in_scope(..., steps_per_execution=1)` then `tune_steps_per_execution(model, dataset)`, a fresh model "
            f"each), then the K chosen most often fixed and {budget.auto_k_pairs} interleaved rounds of one "
            f"`fit(epochs=1)` ({budget.auto_k_steps} steps) per side, after a warm-up fit each. The cap K=1 is timed against "
            f"is min(steps per epoch, 64) = {min(budget.auto_k_steps, 64)}.",
            "Sides: auto = `build_in_scope(..., steps_per_execution=K chosen)` on the recommended input (`plan_dataset` + "
            "`prepare_dataset`, remainder dropped); K=1 = the same model, input and settings with K=1; seed recipe = "
            "`MirroredStrategy` by hand, model and `compile` in its scope, `batch().prefetch()`, K=1 (the partial last "
            "batch kept). MLP: 4-64-64-1, adam, mse + mae, batch 256; CNN: conv16-pool-conv32-pool-dense64-10 on 28x28x1, "
            "adam, sparse categorical cross-entropy (logits) + accuracy, batch 128.",
            "Load N: N competing busy processes (a Python busy loop) run throughout that load's workers "
            "(on a 2-core machine load 2 leaves no core free). Per CPU-second counts the CPU time of the benchmark "
            "process alone; wall time also counts waiting for the cores.",
            "K chosen per tuning: " + "; ".join(chosen_notes) + ".",
        ),
        details={
            "tunings": budget.auto_k_tunings, "pairs": budget.auto_k_pairs, "steps_per_epoch": budget.auto_k_steps,
            "loads": list(loads), "runs": details_runs,
            "phases": {str(load): {"seconds": phase["seconds"], "load_average_1m_end": phase["load_average_1m_end"]}
                       for load, phase in phases.items()},
        },
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(TITLES), default="mlp")
    parser.add_argument("--replicas", type=int, default=1, help="logical CPU replicas (1 = the CPU unsplit)")
    parser.add_argument("--tunings", type=int, default=5, help="fresh models tuned, one after another")
    parser.add_argument("--pairs", type=int, default=9, help="timed fit calls per side")
    parser.add_argument("--steps", type=int, default=96, help="full global batches per epoch")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print(json.dumps(run_worker(args.workload, args.replicas, args.tunings, args.pairs, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
