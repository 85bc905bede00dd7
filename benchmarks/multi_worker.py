"""Suite 4: multi-worker on loopback. Weak scaling, and all-reduce time against bytes.

Every run starts ``mw_worker.py`` processes, each pinned to one core:

- ``tfstrategy`` side: ``tfstrategy.launch`` (free loopback ports, ``TF_CONFIG``
  and supervision by the library), workers using ``select``/``build_in_scope``/
  ``prepare_dataset``/``make_train_step``.
- ``plain`` side: the same number of processes started here with a ``TF_CONFIG``
  written by hand, workers using ``MultiWorkerMirroredStrategy`` and TensorFlow's
  tutorial custom loop (Keras ``fit`` is not compared: it fails on plain
  TensorFlow's multi-worker strategy without tfstrategy's fix).

(a) Weak scaling: the same per-worker batch on 1 worker and on 2 workers x 1 core;
efficiency = examples/s of 2 workers / (2 x examples/s of 1 worker), per side, per
round, rounds interleaved. (b) All-reduce: inside the 2-worker jobs, the median
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
KB = 1024


def _worker_command(side: str, out: Path, budget: Any, allreduce: bool) -> list[str]:
    command = [sys.executable, str(WORKER), "--side", side, "--out", str(out),
               "--per-replica-batch", str(budget.mw_batch), "--steps", str(budget.mw_steps),
               "--windows", str(budget.mw_windows)]
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


def _throughput(results: list[dict[str, Any]]) -> float:
    """Job examples/s: the sum over workers of each worker's median window."""
    return sum(statistics.median(worker["samples"]) for worker in results)


def _size(size: int) -> str:
    return f"{size // (KB * KB)} MB" if size >= KB * KB else f"{size // KB} KB"


def run_multi_worker_suite(budget: Any) -> list[SuiteResult]:
    """Interleaved rounds of 1- and 2-worker jobs per side (only 2-worker jobs when ``mw_rounds`` is 0)."""
    scaling = budget.mw_rounds > 0
    rounds = max(1, budget.mw_rounds)
    jobs = [(side, workers) for workers in ((1, 2) if scaling else (2,)) for side in SIDES]
    throughput: dict[tuple[str, int], list[float]] = {job: [] for job in jobs}
    allreduce: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    facts: dict[str, Any] = {}
    for round_ in range(rounds):
        for side, workers in interleaved_order(jobs, round_):
            results = run_job(side, workers, budget, allreduce=workers == 2)
            throughput[(side, workers)].append(_throughput(results))
            if workers == 2:
                allreduce[side].append(results[0]["allreduce_seconds"])  # worker 0's medians
            facts[f"{side}, {workers} worker(s)"] = {
                "strategy": results[0]["strategy"], "replicas_in_sync": results[0]["replicas_in_sync"],
                "cores": [worker["core"] for worker in results],
            }
    details = {
        "per_worker_batch": budget.mw_batch, "steps_per_window": budget.mw_steps, "windows": budget.mw_windows,
        "rounds": rounds, "jobs": facts,
        "throughput": {f"{side}, {workers} worker(s)": values for (side, workers), values in throughput.items()},
        "weak_scaling": "measured" if scaling else "skipped: mw_rounds=0 runs only the 2-worker jobs",
    }
    results = []
    if scaling:
        efficiency = {
            side: tuple(two / (2 * one) for one, two in zip(throughput[(side, 1)], throughput[(side, 2)])) for side in SIDES
        }
        rows = (
            Comparison(name="weak scaling efficiency, 2 workers x 1 core vs 1 worker", unit="efficiency", better="higher",
                       baseline_label="plain TF_CONFIG", candidate_label="tfstrategy launch",
                       baseline=efficiency["plain"], candidate=efficiency["tfstrategy"]),
            Comparison(name="1 worker: examples/s", unit="examples/s", better="higher", baseline_label="plain",
                       candidate_label="tfstrategy", baseline=tuple(throughput[("plain", 1)]),
                       candidate=tuple(throughput[("tfstrategy", 1)])),
            Comparison(name="2 workers: examples/s (sum)", unit="examples/s", better="higher", baseline_label="plain",
                       candidate_label="tfstrategy", baseline=tuple(throughput[("plain", 2)]),
                       candidate=tuple(throughput[("tfstrategy", 2)])),
        )
        results.append(SuiteResult(
            name="multi_worker_scaling",
            title="4a. Multi-worker weak scaling on loopback, 2 workers x 1 core vs 1 worker (higher is better)",
            rows=rows,
            notes=(
                f"Same per-worker batch ({budget.mw_batch}), 4-64-64-1 MLP, custom training loop on both sides; each worker "
                "pinned to its own core (`os.sched_setaffinity` by worker index, before TensorFlow starts). "
                "Efficiency = examples/s of the 2-worker job / (2 x the 1-worker job's), per side and round.",
                "Plain: `MultiWorkerMirroredStrategy()` with `TF_CONFIG` written by hand, the tutorial's loop. tfstrategy: "
                "`tfstrategy.launch`, `select()`, `build_in_scope`, `prepare_dataset(per_replica_batch=...)`, "
                "`make_train_step`. Alone, tfstrategy's worker gets MirroredStrategy (1 replica), plain's a 1-worker "
                "MultiWorkerMirroredStrategy.",
            ),
            details=details,
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
            "2-worker run (tfstrategy's strategy carries its collective timeout, plain's none).",
            *(() if scaling else ("mw_rounds=0: only this part ran; 4a needs the 1-worker jobs too.",)),
        ),
        details={**details, "loglog": {"bytes": sizes, "series": medians, "unit": "ms"}},
    ))
    return results
