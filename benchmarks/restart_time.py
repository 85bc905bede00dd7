"""How long a `tfstrategy launch` job takes to recover from a SIGKILLed worker.

Runs examples/multi_worker_train.py on 2 local workers with --max-restarts 1, SIGKILLs worker 1
from outside once it is training (epoch 3), and reads the launcher's own timings:
failure -> group relaunched, failure -> every worker joined again (TensorFlow imported,
MultiWorkerMirroredStrategy formed). Also reports, from the output, failure -> first epoch
finished after the restart (BackupAndRestore resumed). Prints a table, writes JSON.

    .venv/bin/python benchmarks/restart_time.py --repeats 3 --json benchmarks/restart_time.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = re.compile(r"failure to relaunch ([\d.]+) s; failure to all workers joined again ([\d.]+) s")


def _worker_pid(tag: str, index: int) -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                env = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RESTART_BENCH={tag}".encode() in env and f"TFSTRATEGY_WORKER_INDEX={index}".encode() in env:
                if b"TFSTRATEGY_RESTART=0" in env and (entry / "cmdline").read_bytes().startswith(sys.executable.encode()):
                    return int(entry.name)
    return None


def measure_once(workdir: Path, tag: str, show: bool = False) -> dict[str, float]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "RESTART_BENCH": tag}
    command = [sys.executable, "-m", "tfstrategy", "launch", "-n", "2", "--max-restarts", "1", "--timeout", "180", "--",
               sys.executable, str(ROOT / "examples" / "multi_worker_train.py"), "--epochs", "6", "--out", str(workdir / "m.keras")]
    launcher = subprocess.Popen(command, cwd=workdir, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killed_at = None
    resumed_after = None
    assert launcher.stdout is not None
    deadline = time.monotonic() + 600
    for line in launcher.stdout:
        if show:
            print(line, end="", flush=True)
        if killed_at is None and "[worker 1] Epoch 3/6" in line:
            pid = _worker_pid(tag, 1)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed_at = time.monotonic()
        elif killed_at is not None and resumed_after is None and re.search(r"\[worker 0\] \d+/\d+ - ", line):
            resumed_after = time.monotonic() - killed_at
        match = TIMINGS.search(line)
        if match:
            relaunch, rejoin = float(match[1]), float(match[2])
        if time.monotonic() > deadline:
            launcher.kill()
            break
    launcher.wait(timeout=60)
    if launcher.returncode != 0 or killed_at is None:
        raise RuntimeError(f"run failed (status {launcher.returncode}, killed={killed_at is not None})")
    return {"relaunch_s": relaunch, "rejoin_s": rejoin, "first_epoch_after_restart_s": resumed_after}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "restart_time.json")
    parser.add_argument("--show-output", action="store_true", help="echo the job's output")
    args = parser.parse_args()
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as workdir:
            runs.append(measure_once(Path(workdir), f"{os.getpid()}-{repeat}", args.show_output))
        print(f"run {repeat + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[-1].items()), flush=True)
    print(f"\n{'measure (seconds after the SIGKILL)':42} {'min':>6} {'median':>7} {'max':>6}")
    for key in runs[0]:
        values = sorted(run[key] for run in runs)
        print(f"{key:42} {values[0]:6.1f} {values[len(values) // 2]:7.1f} {values[-1]:6.1f}")
    args.json.write_text(json.dumps({"runs": runs, "cpus": os.cpu_count()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
