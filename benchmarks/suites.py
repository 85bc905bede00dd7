"""The benchmark suites ``run.py`` runs, in order, and how to add one.

A suite is a :class:`Suite`: a name, and a function taking the run's
:class:`Budget` and returning a :class:`~stats.SuiteResult` whose rows compare
tfstrategy with plain TensorFlow doing the same work in the same run. To add
one, write a module (as ``multi_worker.py`` does) in this folder with a function ``run_<name>_suite(budget)`` and append
``Suite("<name>", run_<name>_suite)`` to :data:`SUITES`; ``run.py`` prints its
table, stores it in the JSON and gives it a panel in the plot.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from auto_k import run_auto_k_suite
from budgets import Budget as Budget  # the suites' one argument, in a module of its own that each suite's main() reads
from multi_worker import run_multi_worker_suite
from process_time import ROOT, clean_env, run_process_suite
from profile_report import run_profile_report_suite
from stats import Comparison, SuiteResult

WORKLOADS = Path(__file__).resolve().parent / "workloads.py"


@dataclass(frozen=True)
class Suite:
    name: str
    run: Callable[[Budget], SuiteResult | list[SuiteResult]]


def run_workload(replicas: int, budget: Budget, timeout: float = 900.0) -> dict:
    """Run ``workloads.py`` in a fresh process (logical devices need one) and read its JSON."""
    command = [sys.executable, str(WORKLOADS), "--replicas", str(replicas), "--repeats", str(budget.fit_repeats),
               "--steps", str(budget.steps), "--epochs", str(budget.epochs)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=clean_env(), cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-800:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _rows(name: str, run: dict, baseline: str, candidate: str, labels: tuple[str, str]) -> tuple[Comparison, ...]:
    """Examples per second of wall time, then per CPU-second (steadier on a shared machine)."""
    sides = run["sides"]
    return tuple(
        Comparison(
            name=f"{name}{suffix}", unit=unit, better="higher", baseline_label=labels[0], candidate_label=labels[1],
            baseline=tuple(sides[baseline][key]), candidate=tuple(sides[candidate][key]),
        )
        for key, unit, suffix in (("samples", "examples/s", ", wall time"), ("cpu_samples", "examples/CPU-s", ", per CPU-second"))
    )


def run_fit_suites(budget: Budget) -> list[SuiteResult]:
    """Suites 2 and 3 share processes: one per replica count, all sides interleaved inside it."""
    counts = budget.replica_counts
    runs = {replicas: run_workload(replicas, budget) for replicas in counts}
    details = {
        "global_batch": 256, "steps_per_epoch": budget.steps, "epochs_per_sample": budget.epochs,
        "repeats": budget.fit_repeats,
        "examples": {r: {side: v["examples"] for side, v in run["sides"].items()} for r, run in runs.items()},
        "replicas_in_sync": {r: {side: v["replicas"] for side, v in run["sides"].items()} for r, run in runs.items()},
        "steps_per_execution": {r: {side: v["steps_per_execution"] for side, v in run["sides"].items()} for r, run in runs.items()},
    }
    curve = {
        "x": list(counts), "xlabel": "logical CPU replicas (one process)", "unit": "examples/s",
        "series": {
            label: [statistics.median(runs[r]["sides"][side]["samples"]) for r in counts]
            for side, label in (("seed", "seed recipe"), ("tfstrategy", "tfstrategy, same settings"),
                                ("recommended", "recommended (K auto)"))
        },
    }
    overhead = SuiteResult(
        name="fit_overhead",
        title="2. Keras fit on a model prepared by tfstrategy vs by hand, same settings (higher is better)",
        rows=tuple(
            row
            for r in counts
            for row in _rows(f"{r} replica{'s' if r > 1 else ''}", runs[r], "seed", "tfstrategy", ("by hand", "tfstrategy"))
        ),
        notes=("By hand: `tf.distribute.MirroredStrategy()` (over `/cpu:0..3` for 4 replicas), model and `compile` in its "
               "scope, `batch(256).prefetch(AUTOTUNE)`; tfstrategy: `tfstrategy.select()` (`cpu_replicas=4` for 4), "
               "`build_in_scope` (fit guarded by the scope audit), `prepare_dataset(global_batch=256, training=False)` "
               "(the partial batch kept, as by hand). Same model (4-64-64-1 MLP), data, `compile(adam, mse, mae)` and "
               "`fit`. Target: ratio 1.0 (no overhead).",),
        details=details,
    )
    reference = SuiteResult(
        name="reference_mlp",
        title="3. Small-MLP reference workload: tfstrategy recommended settings vs the seed recipe (higher is better)",
        rows=tuple(
            row
            for r in counts
            for row in _rows(f"{r} logical replica{'s' if r > 1 else ''}", runs[r], "seed", "recommended",
                             ("seed recipe", "recommended"))
        ),
        notes=("Seed-shaped regression (4 features, 1 target), global batch 256, with a partial last batch. "
               "Seed recipe: `MirroredStrategy`, `batch(256).prefetch(AUTOTUNE)`, `steps_per_execution=1`. Recommended: "
               "`tfstrategy.select`, `build_in_scope(..., steps_per_execution=\"auto\")` (K measured at the warm-up fit, "
               "the chosen K in the JSON; the multi-step loop fixed on 4 replicas, where plain Keras fails with K > 1), "
               "`plan_dataset` + `prepare_dataset` (remainder "
               "dropped, explicit shard policy, prefetch); see `benchmarks/workloads.py`.",),
        details={**details, "curve": curve},
    )
    return [overhead, reference]


SUITES: list[Suite] = [
    Suite("process", lambda budget: run_process_suite(budget.process_repeats)),
    Suite("fit", run_fit_suites),
    Suite("multi_worker", run_multi_worker_suite),
    Suite("auto_k", run_auto_k_suite),
    Suite("profile_report", run_profile_report_suite),
]
