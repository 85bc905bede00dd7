"""Suite 5: the performance report (``--profile``): its verdicts on three workloads, and its own cost.

Verdicts. ``profile_workloads.py`` holds three plain training scripts built to
be input-bound (a slow sequential ``map``), compute-bound (the CNN) and
reduction-bound (a wide MLP, 5 MB of gradients, 8 examples per replica). Each
runs through the real CLI, as a user runs it, in three settings::

    tfstrategy run --profile --profile-dir D -- python profile_workloads.py --workload W                   # 1 replica
    tfstrategy run --profile --profile-dir D --cpu-replicas 4 -- python profile_workloads.py --workload W   # 4 replicas
    tfstrategy launch -n 2 --profile --profile-dir D -- python profile_workloads.py --workload W           # 2 workers

and the report's ``D/worker-<i>.json`` gives each worker's bottleneck, shares,
probes and probe seconds (``D/report.json``: the job's throughput). The suite
lets the probes take up to 50x the time trained (``TFSTRATEGY_PROFILE_PROBES``):
its workloads train seconds, and it judges the verdicts. The verdict is right when every worker names the
bottleneck the workload was built for (the wide MLP in one process: on one
replica there is nothing to reduce, so compute; on 4 logical replicas sharing
2 cores its compute and its in-memory all-reduce are of a size: either).

Cost, two ways. (a) Per step: in one process (1 replica), the same ``fit`` with
and without ``tfstrategy.performance_report(ds)``, reporting switched off
(``Tracker.due`` returns False, so no probe runs), in interleaved pairs: the
per-step time of each fit's median epoch after the first (wall and process
CPU); plus the callback's own Python work per step, timed alone. On the
compute- and reduction-bound workloads, whose steps are the shortest (the
callback's cost is fixed per step; the input-bound step is its slow pipeline).
(b) Once per report: the probes' seconds (``cost.probe_seconds``) against the
seconds trained.

    python benchmarks/profile_report.py                  # the suite at the default budget, a table
    python benchmarks/profile_report.py --quick --json /tmp/profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from process_time import ROOT, clean_env
from stats import Comparison, SuiteResult, format_table, interleaved_order, machine_info

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "profile_workloads.py"
SOURCE = ROOT / "src"
#: The CLI arguments of each setting (before ``--profile``).
SETTINGS = {
    "1 replica": ["run"],
    "4 replicas": ["run", "--cpu-replicas", "4"],
    "2 workers": ["launch", "-n", "2"],
}
WORKLOAD_TITLES = {"input": "input-bound (slow map)", "compute": "compute-bound (CNN)",
                   "reduction": "reduction-bound (wide MLP)"}
PARTS = ("input", "reduction", "dispatch", "compute")
#: Cost (a): each fit trains one epoch (set-up, first execution), then this many timed epochs; their median counts.
COST_EPOCHS = 6


def expected(workload: str, setting: str) -> tuple[str, ...]:
    """The bottleneck(s) a right report may name: what the workload was built for, except for the wide MLP in one process.

    On one replica there is nothing to reduce: compute. On 4 logical replicas the 4 replicas' compute shares 2 cores
    and the all-reduce is a copy in memory: the probes put it at a third of the cached step, so either may lead.
    """
    if workload == "reduction" and setting == "1 replica":
        return ("compute",)
    if workload == "reduction" and setting == "4 replicas":
        return ("reduction", "compute")
    return (workload,)


def _env() -> dict[str, str]:
    """The benchmarks' quiet environment, importing tfstrategy from this tree (checked in each run's JSON)."""
    env = clean_env()
    env["PYTHONPATH"] = os.pathsep.join([str(SOURCE), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_setting(workload: str, setting: str, steps: int | None, timeout: float = 600.0) -> dict[str, Any]:
    """One CLI run of a workload with ``--profile``; each worker's report JSON and the script's own JSON."""
    with tempfile.TemporaryDirectory(prefix="tfstrategy-profile-") as folder:
        out = Path(folder)
        command = [sys.executable, "-m", "tfstrategy", *SETTINGS[setting], "--profile", "--profile-dir", str(out),
                   "--", sys.executable, str(SCRIPT), "--workload", workload, "--out", str(out)]
        if steps:
            command += ["--steps", str(steps)]
        began = time.perf_counter()
        # The suite judges the verdicts, so it lets the probes run on its short workloads (by default they may take
        # a tenth of the time trained, and would not).
        env = {**_env(), "TFSTRATEGY_PROFILE_PROBES": "50"}
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        seconds = time.perf_counter() - began
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-1500:]}")
        reports = [json.loads(path.read_text()) for path in sorted(out.glob("worker-*.json"))]
        job = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
        runs = [json.loads(path.read_text()) for path in sorted(out.glob("run-*.json"))]
    workers = 2 if setting == "2 workers" else 1
    if len(reports) != workers or len(runs) != workers:
        raise RuntimeError(f"{workload}, {setting}: expected {workers} report(s) and run(s), found {len(reports)} and "
                           f"{len(runs)}; stderr: {result.stderr.strip()[-1500:]}")
    imported = {run["tfstrategy"] for run in runs}
    if imported != {str(SOURCE / "tfstrategy")}:
        raise RuntimeError(f"{workload}, {setting}: the hook imported tfstrategy from {imported}, not {SOURCE}")
    return {"reports": reports, "job": job, "runs": runs, "seconds": seconds,
            "command": " ".join(["tfstrategy", *SETTINGS[setting], "--profile", "--profile-dir", "D", "--", "python",
                                 "benchmarks/profile_workloads.py", "--workload", workload])}


def _shares_text(shares: dict[str, float]) -> str:
    return ", ".join(f"{part} {shares[part]:.0%}" for part in PARTS)


def summarise_setting(workload: str, setting: str, run: dict[str, Any]) -> dict[str, Any]:
    reports, runs = run["reports"], run["runs"]
    want = expected(workload, setting)
    bottlenecks = [report["bottleneck"] for report in reports]
    return {
        "expected": list(want), "right": all(found in want for found in bottlenecks), "bottleneck": bottlenecks,
        "shares": [report["shares"] for report in reports],
        "step_ms": [report["step_seconds"]["median"] * 1000 for report in reports],
        "p90_ms": [report["step_seconds"]["p90"] * 1000 for report in reports],
        "examples_per_second": run["job"].get("examples_per_second"),
        "replicas": reports[0]["replicas"], "workers": reports[0]["workers"],
        "global_batch": reports[0]["global_batch"], "steps_timed": [report["steps"] for report in reports],
        "probes": [report["probes"] for report in reports],
        "recommendations": [[r["action"] for r in report["recommendations"]] for report in reports],
        "probe_seconds": [report["cost"]["probe_seconds"] for report in reports],
        "trained_seconds": [report["seconds"] for report in reports],
        "fit_seconds": [r["fit_seconds"] for r in runs],
        "strategy": runs[0]["strategy"], "run_seconds": run["seconds"], "command": run["command"],
    }


# --- cost (a): the callback with reporting switched off, in one process ---------------------------------------------


def cost_worker(workloads: list[str], pairs: int, steps: int, hook_calls: int) -> dict[str, Any]:
    """In this process (1 replica): per-step time of fit with/without the callback, and the callback's own work."""
    import keras
    import tensorflow as tf

    import profile_workloads
    import tfstrategy
    from tfstrategy.performance import report as report_module

    report_module.Tracker.due = lambda self, strategy, *, final: False  # time each step, never report (no probe)

    class EpochTimer(keras.callbacks.Callback):
        """Epoch hooks only: no per-step work, on both sides."""

        def __init__(self) -> None:
            super().__init__()
            self.wall: list[float] = []
            self.cpu: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.began = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.wall.append(time.perf_counter() - self.began[0])
            self.cpu.append(time.process_time() - self.began[1])

    strategy = tf.distribute.MirroredStrategy()
    results: dict[str, Any] = {"tfstrategy": os.path.dirname(tfstrategy.__file__),
                               "replicas": int(strategy.num_replicas_in_sync), "workloads": {}}
    for workload in workloads:
        dataset = profile_workloads.make_dataset(workload, profile_workloads.global_batch(workload, 1))
        with strategy.scope():
            model = profile_workloads.build_model(workload)

        def fit(with_report: bool, model: Any = model, dataset: Any = dataset) -> tuple[float, float]:
            timer = EpochTimer()
            callbacks = [timer] + ([tfstrategy.performance_report(dataset)] if with_report else [])
            model.fit(dataset, epochs=1 + COST_EPOCHS, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
            # The median epoch after the first (no fit set-up, no first execution): a neighbour's burst hits one epoch.
            return statistics.median(timer.wall[1:]) / steps, statistics.median(timer.cpu[1:]) / steps

        fit(False), fit(True)  # trace, warm up both sides
        sides: dict[str, dict[str, list[float]]] = {side: {"wall": [], "cpu": []} for side in ("without", "with")}
        for pair in range(pairs):
            for side in interleaved_order(["without", "with"], pair):
                wall, cpu = fit(side == "with")
                sides[side]["wall"].append(wall)
                sides[side]["cpu"].append(cpu)
        results["workloads"][workload] = {"steps": steps, "pairs": pairs, **sides,
                                          "hook_seconds": hook_cost(model, dataset, hook_calls)}
    return results


def hook_cost(model: Any, dataset: Any, calls: int) -> dict[str, float]:
    """Seconds per step of the callback's own batch hooks, and of Keras' callback list with it minus without it."""
    import keras
    import tensorflow as tf

    import tfstrategy

    logs = {"loss": tf.constant(1.0)}

    def per_step(callbacks: list[Any], direct: Any = None) -> float:
        if direct is not None:  # the callback's hooks alone
            direct.on_train_begin()
            began = time.perf_counter()
            for batch in range(calls):
                direct.on_train_batch_begin(batch)
                direct.on_train_batch_end(batch, logs)
            return (time.perf_counter() - began) / calls
        listed = keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=False, model=model)
        listed.on_train_begin()
        began = time.perf_counter()
        for batch in range(calls):
            listed.on_train_batch_begin(batch)
            listed.on_train_batch_end(batch, logs)
        listed.on_train_end()  # waits for batch-end work dispatched to Keras' thread, if any
        return (time.perf_counter() - began) / calls

    callback = tfstrategy.performance_report(dataset)
    callback.set_model(model)
    own = statistics.median(per_step([], direct=callback) for _ in range(3))
    without = statistics.median(per_step([]) for _ in range(3))
    with_it = statistics.median(per_step([tfstrategy.performance_report(dataset)]) for _ in range(3))
    return {"callback": own, "callback_list_without": without, "callback_list_with": with_it}


def run_cost(workloads: list[str], pairs: int, steps: int, hook_calls: int, timeout: float = 900.0) -> dict[str, Any]:
    """The cost worker in a fresh process (a clean TensorFlow, one replica); its JSON."""
    command = [sys.executable, str(Path(__file__).resolve()), "--cost-worker", "--workloads", ",".join(workloads),
               "--pairs", str(pairs), "--cost-steps", str(steps), "--hook-calls", str(hook_calls)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-1500:]}")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    if found["tfstrategy"] != str(SOURCE / "tfstrategy"):
        raise RuntimeError(f"the cost worker imported tfstrategy from {found['tfstrategy']}, not {SOURCE}")
    return found


# --- the suite ---------------------------------------------------------------------------------------------------------


def _range(values: list[float], scale: float = 1.0, digits: str = ".2f") -> str:
    return f"{statistics.median(values) * scale:{digits}} [{min(values) * scale:{digits}}-{max(values) * scale:{digits}}]"


def run_profile_report_suite(budget: Any) -> SuiteResult:
    """Verdicts on every workload x setting of the budget, then the cost worker."""
    workloads, settings = list(budget.profile_workloads), list(budget.profile_settings)
    started = time.perf_counter()
    verdicts: dict[str, dict[str, Any]] = {workload: {} for workload in workloads}
    for workload in workloads:
        for setting in settings:
            run = run_setting(workload, setting, budget.profile_steps)
            verdicts[workload][setting] = summarise_setting(workload, setting, run)
    verdict_seconds = time.perf_counter() - started
    cost_workloads = list(budget.profile_cost_workloads)
    cost = run_cost(cost_workloads, budget.profile_pairs, budget.profile_cost_steps, budget.profile_hook_calls)
    cost_seconds = time.perf_counter() - started - verdict_seconds

    rows: list[Comparison] = []
    notes: list[str] = []
    per_step_share: dict[str, dict[str, Any]] = {}
    for workload in cost_workloads:
        measured = cost["workloads"][workload]
        title = WORKLOAD_TITLES[workload]
        for key, unit, label in (("wall", "ms", "wall"), ("cpu", "ms CPU", "process CPU")):
            rows.append(Comparison(
                name=f"{title}, 1 replica: per-step {label} time, report callback (reporting off) vs none",
                unit=unit, better="lower", baseline_label="fit", candidate_label="fit + callback",
                baseline=tuple(value * 1000 for value in measured["without"][key]),
                candidate=tuple(value * 1000 for value in measured["with"][key])))
        step = statistics.median(measured["without"]["wall"])
        hooks = measured["hook_seconds"]
        per_step_share[workload] = {
            "step_ms": step * 1000, "callback_us": hooks["callback"] * 1e6,
            "callback_list_extra_us": (hooks["callback_list_with"] - hooks["callback_list_without"]) * 1e6,
            "callback_share_of_step": hooks["callback"] / step,
            "callback_list_extra_share_of_step": (hooks["callback_list_with"] - hooks["callback_list_without"]) / step,
        }
    for workload in workloads:
        found = verdicts[workload]
        # (b) once per report: worker 0's probes against the seconds it trained, one sample per setting.
        rows.append(Comparison(
            name=f"{WORKLOAD_TITLES[workload]}: the probes' one-off seconds vs the seconds trained "
                 f"({', '.join(found)})",
            unit="s", better="lower", baseline_label="trained", candidate_label="probes",
            baseline=tuple(found[setting]["trained_seconds"][0] for setting in found),
            candidate=tuple(found[setting]["probe_seconds"][0] for setting in found)))
    right = sum(entry["right"] for found in verdicts.values() for entry in found.values())
    total = sum(len(found) for found in verdicts.values())
    notes.append(f"Verdicts: {right} of {total} name the bottleneck the workload was built for "
                 "(every worker's report). The wide MLP on 1 replica has nothing to reduce: compute is right; on 4 "
                 "logical replicas in one process its 4 replicas' compute shares the 2 cores and its all-reduce is a "
                 "copy in memory (the probe: about a third of the step on a cached batch): reduction or compute.")
    for workload in workloads:
        for setting, entry in verdicts[workload].items():
            mark = "right" if entry["right"] else f"WRONG (expected {' or '.join(entry['expected'])})"
            per_worker = "; ".join(
                f"{'worker ' + str(index) + ': ' if len(entry['shares']) > 1 else ''}{bottleneck} "
                f"({_shares_text(shares)}, step {step:.3g} ms)"
                for index, (bottleneck, shares, step) in enumerate(zip(entry["bottleneck"], entry["shares"],
                                                                       entry["step_ms"])))
            notes.append(f"{WORKLOAD_TITLES[workload]}, {setting}: {per_worker} -> {mark}")
    probe_all = [value for found in verdicts.values() for entry in found.values() for value in entry["probe_seconds"]]
    wall_ratios = [c / b for workload in cost_workloads
                   for b, c in zip(cost["workloads"][workload]["without"]["wall"], cost["workloads"][workload]["with"]["wall"])]
    cpu_ratios = [c / b for workload in cost_workloads
                  for b, c in zip(cost["workloads"][workload]["without"]["cpu"], cost["workloads"][workload]["with"]["cpu"])]
    own = [entry["callback_share_of_step"] for entry in per_step_share.values()]
    listed = [entry["callback_list_extra_share_of_step"] for entry in per_step_share.values()]
    notes += [
        f"Report cost (a), per step (target under 2% of step time): fit with the callback / without, per-step time "
        f"{_range(wall_ratios, digits='.3f')} wall, {_range(cpu_ratios, digits='.3f')} CPU (median [min-max] over "
        f"{len(wall_ratios)} pairs, every cost workload); the callback's own batch hooks "
        f"{_range([e['callback_us'] for e in per_step_share.values()], digits='.1f')} us a step = "
        f"{_range(own, 100, '.3f')}% of the step, {_range(listed, 100, '.3f')}% with Keras' callback dispatch "
        "(a batch-end hook turns off Keras 3's asynchronous batch-end dispatch).",
        f"Report cost (b), once per report: probes {_range(probe_all)} s over every run and worker; against the "
        f"seconds trained see the rows (a short benchmark fit); at the default --profile-every 10 that is "
        f"{_range([value / 600 for value in probe_all], 100, '.2f')}% of each 10 minutes.",
        f"Steps per fit: {budget.profile_steps or 'each workload its default (input 200, compute 120, reduction 300)'}; "
        f"cost: {budget.profile_pairs} pairs of fits on {', '.join(cost_workloads)} (the shortest steps: the callback's "
        f"cost is fixed per step), each fit 1 + {COST_EPOCHS} epochs of {budget.profile_cost_steps} steps, the median "
        "timed epoch counts. Verdict runs took "
        f"{verdict_seconds:.0f} s, the cost process {cost_seconds:.0f} s.",
    ]
    return SuiteResult(
        name="profile_report",
        title="5. The performance report (--profile): its verdicts on three workloads and its own cost (lower is better)",
        rows=tuple(rows), notes=tuple(notes),
        details={"verdicts": verdicts, "cost": cost, "per_step_share": per_step_share,
                 "seconds": {"verdicts": verdict_seconds, "cost": cost_seconds},
                 "settings": {setting: " ".join(["tfstrategy", *arguments]) for setting, arguments in SETTINGS.items()}},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the quick budget (checks the suite runs; numbers mean nothing)")
    parser.add_argument("--json", type=Path, help="also write the suite's result here")
    parser.add_argument("--cost-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default="input,compute,reduction", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=9, help=argparse.SUPPRESS)
    parser.add_argument("--cost-steps", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--hook-calls", type=int, default=5000, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cost_worker:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        print(json.dumps(cost_worker(args.workloads.split(","), args.pairs, args.cost_steps, args.hook_calls)))
        return 0
    from budgets import Budget

    budget = Budget.quick() if args.quick else Budget()
    machine = machine_info()
    began = time.perf_counter()
    result = run_profile_report_suite(budget)
    print(format_table(result, machine), flush=True)
    print(f"suite took {time.perf_counter() - began:.0f} s", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine, "budget": vars(budget), "suite": result.as_dict()},
                                        indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
