"""Suite 4: multi-worker on loopback. Weak scaling, and all-reduce time against bytes.

Every run starts ``mw_worker.py`` processes, each pinned to one core:

- ``tfstrategy`` side: ``tfstrategy.launch`` (free loopback ports, ``TF_CONFIG``
  and supervision by the library), workers using ``select``/``build_in_scope``/
  ``prepare_dataset``/``make_train_step``.
- ``plain`` side: the same number of processes started here with a ``TF_CONFIG``
  written by hand, workers using ``MultiWorkerMirroredStrategy`` and TensorFlow's
  tutorial custom loop (Keras ``fit`` is not compared: it fails on plain
  TensorFlow's multi-worker strategy without tfstrategy's fix).

(a) Weak scaling, for a latency-bound MLP and a compute-bound CNN: the same
per-worker batch on 1 worker and on 2 workers x 1 core; efficiency = examples/s
of 2 workers / (2 x examples/s of plain TensorFlow's 1-worker job), the same
baseline for every side, per round, rounds interleaved. The ``tfstrategy`` jobs
also time tfstrategy's recommended settings (Keras ``fit``,
``steps_per_execution="auto"``). (b) All-reduce: inside the 2-worker jobs, the median
time of a SUM ``strategy.reduce`` of float32 tensors from 1 KB to 16 MB.

Quick mode runs one round with 2 steps per window and two tiny sizes (about
40 s). ``Budget(mw_rounds=0)`` runs only the 2-worker jobs, i.e. (b) alone, and
the JSON and the table say that (a) was skipped.
"""

from __future__ import annotations

import io
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from process_time import ROOT, clean_env
from stats import Comparison, SuiteResult, interleaved_order

WORKER = Path(__file__).resolve().parent / "mw_worker.py"
SIDES = ("plain", "tfstrategy")
MODELS = ("mlp", "cnn")
MODEL_TITLES = {"mlp": "MLP (latency-bound)", "cnn": "CNN 28x28 (compute-bound)"}
KB = 1024


def _worker_command(side: str, out: Path, budget: Any, allreduce: bool) -> list[str]:
    command = [sys.executable, str(WORKER), "--side", side, "--out", str(out), "--models", ",".join(MODELS),
               "--per-replica-batch", str(budget.mw_batch), "--steps", str(budget.mw_steps),
               "--windows", str(budget.mw_windows)]
    if side == "tfstrategy":
        command.append("--recommended")
    if allreduce:
        command += ["--allreduce", ",".join(str(size) for size in budget.allreduce_bytes),
                    "--allreduce-repeats", str(budget.allreduce_repeats)]
    return command


def _run_plain(command: list[str], workers: int, timeout: float) -> None:
    """Start ``workers`` processes with a TF_CONFIG written by hand, as a user without tfstrategy would."""
    sockets = [socket.socket() for _ in range(workers)]
    for sock in sockets:  # hold all of them until every port is picked, so none repeats
        sock.bind(("127.0.0.1", 0))
    addresses = [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    for sock in sockets:
        sock.close()
    processes = [
        subprocess.Popen(command, cwd=ROOT, env={
            **clean_env(),
            "TF_CONFIG": json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}),
        },
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for index in range(workers)
    ]
    try:
        errors = [process.communicate(timeout=timeout)[1] for process in processes]
    finally:
        for process in processes:  # a worker whose peer died waits forever: never leave one behind
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    failed = [(i, p.returncode) for i, p in enumerate(processes) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"plain worker(s) {failed} failed: {errors[failed[0][0]][-800:]}")


def _run_tfstrategy(command: list[str], workers: int, timeout: float) -> None:
    import tfstrategy

    out, err = io.StringIO(), io.StringIO()
    result = tfstrategy.launch(command, workers, join_timeout=timeout, env=clean_env(), out=out, err=err)
    if result.returncode != 0:
        raise RuntimeError(f"tfstrategy launch exited {result.returncode}: {err.getvalue()[-400:]} {out.getvalue()[-800:]}")


def run_job(side: str, workers: int, budget: Any, allreduce: bool, timeout: float = 600.0) -> list[dict[str, Any]]:
    """One job of ``workers`` workers; returns each worker's JSON."""
    with tempfile.TemporaryDirectory(prefix="tfstrategy-mw-") as folder:
        out = Path(folder)
        command = _worker_command(side, out, budget, allreduce)
        (_run_plain if side == "plain" else _run_tfstrategy)(command, workers, timeout)
        return [json.loads((out / f"worker-{index}.json").read_text()) for index in range(workers)]


def _throughput(results: list[dict[str, Any]], model: str, kind: str = "samples") -> float:
    """Job examples/s: the sum over workers of each worker's median window."""
    return sum(statistics.median(_samples(worker, model, kind)) for worker in results)


def _samples(worker: dict[str, Any], model: str, kind: str) -> list[float]:
    entry = worker["models"][model]
    return entry["samples"] if kind == "samples" else entry["recommended"]["samples"]


def _size(size: int) -> str:
    return f"{size // (KB * KB)} MB" if size >= KB * KB else f"{size // KB} KB"


def _series(throughput: dict, model: str, kind: str, workers: int) -> tuple[float, ...]:
    side = "plain" if kind == "plain" else "tfstrategy"
    return tuple(throughput[(side, workers)][model][kind if kind != "plain" else "samples"])


def run_multi_worker_suite(budget: Any) -> list[SuiteResult]:
    """Interleaved rounds of 1- and 2-worker jobs per side (only 2-worker jobs when ``mw_rounds`` is 0)."""
    scaling = budget.mw_rounds > 0
    rounds = max(1, budget.mw_rounds)
    jobs = [(side, workers) for workers in ((1, 2) if scaling else (2,)) for side in SIDES]
    # (side, workers) -> model -> "samples" (custom loop) / "recommended" (fit, K auto) -> one value per round
    throughput: dict[tuple[str, int], dict[str, dict[str, list[float]]]] = {
        job: {model: {"samples": [], "recommended": []} for model in MODELS} for job in jobs
    }
    chosen_k: dict[str, dict[str, list[int]]] = {model: {"1": [], "2": []} for model in MODELS}
    allreduce: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    facts: dict[str, Any] = {}
    for round_ in range(rounds):
        for side, workers in interleaved_order(jobs, round_):
            results = run_job(side, workers, budget, allreduce=workers == 2)
            for model in MODELS:
                throughput[(side, workers)][model]["samples"].append(_throughput(results, model))
                if side == "tfstrategy":
                    throughput[(side, workers)][model]["recommended"].append(_throughput(results, model, "recommended"))
                    chosen_k[model][str(workers)].append(results[0]["models"][model]["recommended"]["steps_per_execution"])
            if workers == 2:
                allreduce[side].append(results[0]["allreduce_seconds"])  # worker 0's medians
            facts[f"{side}, {workers} worker(s)"] = {
                "strategy": results[0]["strategy"], "replicas_in_sync": results[0]["replicas_in_sync"],
                "cores": [worker["core"] for worker in results],
            }
    details = {
        "per_worker_batch": {"mlp": budget.mw_batch, "cnn": 128}, "steps_per_window": budget.mw_steps,
        "windows": budget.mw_windows, "rounds": rounds, "jobs": facts,
        "throughput": {f"{side}, {workers} worker(s)": values for (side, workers), values in throughput.items()},
        "recommended_steps_per_execution": chosen_k,
        "weak_scaling": "measured" if scaling else "skipped: mw_rounds=0 runs only the 2-worker jobs",
    }
    results = []
    if scaling:
        rows = []
        curves: dict[str, list[float]] = {}
        for model in MODELS:
            # One baseline for every side: plain TensorFlow's 1-worker job, the same round.
            baseline = _series(throughput, model, "plain", 1)

            def efficiency(kind: str, baseline=baseline, model=model) -> tuple[float, ...]:
                return tuple(two / (2 * one) for one, two in zip(baseline, _series(throughput, model, kind, 2)))

            title = MODEL_TITLES[model]
            rows += [
                Comparison(name=f"{title}: weak-scaling efficiency, custom loop", unit="efficiency", better="higher",
                           baseline_label="plain", candidate_label="tfstrategy",
                           baseline=efficiency("plain"), candidate=efficiency("samples")),
                Comparison(name=f"{title}: weak-scaling efficiency, recommended (fit, K auto)", unit="efficiency",
                           better="higher", baseline_label="plain loop", candidate_label="recommended",
                           baseline=efficiency("plain"), candidate=efficiency("recommended")),
                Comparison(name=f"{title}: 2 workers, examples/s (sum)", unit="examples/s", better="higher",
                           baseline_label="plain loop", candidate_label="recommended",
                           baseline=_series(throughput, model, "plain", 2),
                           candidate=_series(throughput, model, "recommended", 2)),
            ]
            for kind, label in (("plain", "plain loop"), ("samples", "tfstrategy loop"), ("recommended", "recommended")):
                one, two = _series(throughput, model, kind, 1), _series(throughput, model, kind, 2)
                curves[f"{model}, {label}"] = [statistics.median(one), statistics.median(two)]
        results.append(SuiteResult(
            name="multi_worker_scaling",
            title="4a. Multi-worker weak scaling on loopback, 2 workers x 1 core vs 1 worker (higher is better)",
            rows=tuple(rows),
            notes=(
                "Every efficiency divides by the SAME baseline: plain TensorFlow's 1-worker job of that round "
                "(examples/s of the 2-worker job / (2 x plain 1-worker examples/s)), so the sides differ only in their "
                "2-worker jobs.",
                f"Same per-worker batch (MLP {budget.mw_batch}, CNN 128); each worker pinned to its own core "
                "(`os.sched_setaffinity` by worker index, before TensorFlow starts). MLP: 4-64-64-1, ~1 ms of compute "
                "per step; CNN: conv16-pool-conv32-pool-dense64-10 on 28x28x1, ~230 KB of gradients.",
                "Plain: `MultiWorkerMirroredStrategy()` with `TF_CONFIG` written by hand, the tutorial's custom loop. "
                "tfstrategy loop: `tfstrategy.launch`, `select()`, `build_in_scope`, `prepare_dataset(per_replica_batch"
                "=...)`, `make_train_step`. Recommended: the same job, Keras `fit` on `build_in_scope(..., "
                "steps_per_execution=\"auto\")` (K chosen per job in the JSON; capped by the epoch of "
                f"{budget.mw_steps} steps).",
            ),
            details={**details, "curve": {"x": [1, 2], "xlabel": "workers (1 core each)", "series": curves,
                                          "unit": "examples/s"}},
        ))
    sizes = list(budget.allreduce_bytes)
    medians = {side: [statistics.median(run[str(size)] for run in allreduce[side]) * 1000 for size in sizes] for side in SIDES}
    results.append(SuiteResult(
        name="multi_worker_allreduce",
        title="4b. All-reduce (SUM) time against tensor bytes, 2 workers x 1 core on loopback (lower is better)",
        rows=tuple(
            Comparison(name=f"all-reduce {_size(size)}", unit="ms", better="lower", baseline_label="plain",
                       candidate_label="tfstrategy", baseline=tuple(run[str(size)] * 1000 for run in allreduce["plain"]),
                       candidate=tuple(run[str(size)] * 1000 for run in allreduce["tfstrategy"]))
            for size in sizes
        ),
        notes=(
            f"`strategy.reduce(SUM, per_replica, axis=None)` in a `tf.function` on float32 tensors; worker 0's median of "
            f"{budget.allreduce_repeats} timed calls after one warm-up, per job; pairs are rounds. The same job as 4a's "
            "2-worker run (tfstrategy's strategy carries its collective timeout, plain's none). Where the time goes: "
            "benchmarks/README.md.",
            *(() if scaling else ("mw_rounds=0: only this part ran; 4a needs the 1-worker jobs too.",)),
        ),
        details={**details, "loglog": {"bytes": sizes, "series": medians, "unit": "ms"}},
    ))
    return results
