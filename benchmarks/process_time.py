"""Suite 1: whole-process wall time of ``tfstrategy check`` vs the seed's ``strategy-demo.py``.

Both are what a user runs to check a strategy, so the figure that matters is the
wall time of the whole process, start to exit. ``python -c "import tensorflow"``
is the floor neither can go below; it is measured in the same rounds.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from stats import Comparison, SuiteResult, interleaved_order

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "import": [sys.executable, "-c", "import tensorflow"],
    "demo": [sys.executable, str(ROOT / "examples" / "strategy-demo.py")],
    "check": [sys.executable, "-m", "tfstrategy", "check"],
}


def clean_env() -> dict[str, str]:
    """The same quiet environment for every side, free of settings that would change them."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TFSTRATEGY_", "TF_CONFIG"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


@dataclass(frozen=True)
class ProcessTime:
    """One run of a command: wall seconds, and CPU seconds (user + system) of the process."""

    wall: float
    cpu: float


def time_process(command: list[str], timeout: float = 300.0) -> ProcessTime:
    """Run ``command`` to exit and time it; a failing command stops the benchmark.

    CPU time comes from ``os.wait4`` for this child alone: on a shared machine
    it moves far less than wall time when other jobs compete for the cores.
    """
    start = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=clean_env(), cwd=ROOT)
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                process.kill()
                os.wait4(process.pid, 0)
                raise RuntimeError(f"{' '.join(command)} did not finish within {timeout} s")
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
        if process.returncode != 0:
            stderr.seek(0)
            tail = stderr.read().decode(errors="replace").strip()[-800:]
            raise RuntimeError(f"{' '.join(command)} exited {process.returncode}: {tail}")
    return ProcessTime(wall=elapsed, cpu=usage.ru_utime + usage.ru_stime)


def run_process_suite(repeats: int) -> SuiteResult:
    """Time the three commands ``repeats`` times each, interleaved."""
    samples: dict[str, list[ProcessTime]] = {name: [] for name in COMMANDS}
    for repeat in range(repeats):
        for name in interleaved_order(list(COMMANDS), repeat):
            samples[name].append(time_process(COMMANDS[name]))
    floor, demo, check = samples["import"], samples["demo"], samples["check"]

    def series(runs: list[ProcessTime], kind: str) -> tuple[float, ...]:
        return tuple(getattr(run, kind) for run in runs)

    def above(runs: list[ProcessTime]) -> float:
        return statistics.median(run.cpu for run in runs) - statistics.median(run.cpu for run in floor)

    rows = (
        Comparison(
            name="`tfstrategy check` vs `strategy-demo.py`: wall time",
            unit="s", better="lower", baseline_label="strategy-demo.py", candidate_label="tfstrategy check",
            baseline=series(demo, "wall"), candidate=series(check, "wall"),
        ),
        Comparison(
            name="the same: CPU time (user + system)",
            unit="s", better="lower", baseline_label="strategy-demo.py", candidate_label="tfstrategy check",
            baseline=series(demo, "cpu"), candidate=series(check, "cpu"),
        ),
        Comparison(
            name="CPU time above the `import tensorflow` floor (same round)",
            unit="s", better="lower", baseline_label="strategy-demo.py", candidate_label="tfstrategy check",
            baseline=tuple(run.cpu - low.cpu for run, low in zip(demo, floor)),
            candidate=tuple(run.cpu - low.cpu for run, low in zip(check, floor)),
        ),
        Comparison(
            name="floor: `python -c \"import tensorflow\"` vs `strategy-demo.py`: wall time",
            unit="s", better="lower", baseline_label="strategy-demo.py", candidate_label="import tensorflow",
            baseline=series(demo, "wall"), candidate=series(floor, "wall"),
        ),
        Comparison(
            name="floor: the same, CPU time",
            unit="s", better="lower", baseline_label="strategy-demo.py", candidate_label="import tensorflow",
            baseline=series(demo, "cpu"), candidate=series(floor, "cpu"),
        ),
    )
    return SuiteResult(
        name="process",
        title="1. Checking a strategy: whole-process time (lower is better)",
        rows=rows,
        notes=(
            f"Median CPU time above the `import tensorflow` floor: strategy-demo.py {above(demo):.2f} s, "
            f"tfstrategy check {above(check):.2f} s; the row above gives it per round (a difference of two noisy "
            "times: its ratio swings more than the whole-process rows).",
            "`tfstrategy check` does more than the demo: it also verifies every variable is in the scope, "
            "all-reduces across replicas and splits a global batch.",
            "The floor rows' ratios are the share of the demo's time spent importing TensorFlow; "
            "CPU-time rows are steadier than wall time when other jobs share the machine.",
        ),
        details={"commands": {name: " ".join(command) for name, command in COMMANDS.items()}, "repeats": repeats},
    )
