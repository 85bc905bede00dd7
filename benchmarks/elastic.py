"""What an elastic re-formation costs, against a full restart of the same job (issue 47).

For each node count N (each node a launcher with one worker, at its own loopback address
127.0.0.<r+2>, the backup directory shared), on tests/workers/elastic_worker.py:

- **elastic** (``--nnodes 1:N``): once step 10 is committed, node N-1's launcher is SIGKILLed
  (a machine lost); measured: the kill -> the first step of the re-formed group of N-1. Once step
  20 is committed, node N-1's launcher starts again; measured: its start -> the first step of the
  group of N that takes it back (its TensorFlow start-up included: what a returning machine costs).
- **full restart** (``--nnodes N --max-restarts 1``, a fixed job): once step 10 is committed,
  node N-1's worker is SIGKILLed (its launcher lives: the whole group restarts on fresh ports, as
  a fixed job recovers); measured: the kill -> the first step of the restarted group of N.

The ratio elastic / full restart is the figure; the workers mark each start's first step in
``starts.jsonl`` (wall clock), the harness the kill. One run per N; a shared 2-core machine is
noisy, so repeat with ``--repeats``.

    PYTHONPATH=src .venv/bin/python benchmarks/elastic.py --nodes 2 3 4 --json benchmarks/elastic.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "workers" / "elastic_worker.py"
GUARD = 600.0


class Job:
    """N node launchers on loopback addresses sharing one backup directory."""

    def __init__(self, nodes: int, nnodes: str, *extra: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tfstrategy-elastic-bench-"))
        self.backup, self.out = self.dir / "backup", self.dir / "out"
        self.backup.mkdir(mode=0o700)
        self.out.mkdir()
        (self.out / "gate").write_text("10")
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.2", 0))
            port = probe.getsockname()[1]
        self.master, self.nnodes, self.extra = f"127.0.0.2:{port}", nnodes, extra
        self.env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TFSTRATEGY_LAUNCH_SECRET": secrets.token_hex(16),
                    "PYTHONPATH": str(ROOT / "src")}
        self.launchers = {rank: self.start(rank) for rank in range(nodes)}

    def start(self, rank: int) -> subprocess.Popen:
        command = [sys.executable, "-m", "tfstrategy", "launch", "--nnodes", self.nnodes, "--node-rank", str(rank),
                   "--master", self.master, "--node-address", f"127.0.0.{rank + 2}", "-n", "1", "--backup-dir",
                   str(self.backup), "--timeout", "300", "--rendezvous-wait", "300", "--grace", "60", *self.extra, "--",
                   sys.executable, str(WORKER), "--out", str(self.out)]
        return subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def committed(self) -> int | None:
        from tfstrategy.launch.elastic import newest_committed_step

        return newest_committed_step(self.backup)

    def starts(self) -> list[dict]:
        path = self.out / "starts.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait(self, done, what: str) -> None:
        deadline = time.monotonic() + GUARD
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"gave up waiting for {what} (in {self.dir})")
            time.sleep(0.05)

    def first_step_after(self, moment: float, workers: int) -> float:
        """Seconds from ``moment`` (wall clock) to the first step of a start of ``workers`` workers after it."""
        def found() -> list[float]:
            return [s["time"] for s in self.starts() if s["time"] > moment and s["workers"] == workers]
        self.wait(found, f"a first step of {workers} workers")
        return min(found()) - moment

    def worker_of(self, rank: int) -> int:
        """The pid of node ``rank``'s worker (its launcher's child)."""
        children = Path(f"/proc/{self.launchers[rank].pid}/task/{self.launchers[rank].pid}/children").read_text().split()
        for pid in children:
            if str(WORKER).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        raise RuntimeError(f"node {rank}'s worker not found among {children}")

    def finish(self) -> None:
        (self.out / "gate").unlink(missing_ok=True)
        for launcher in self.launchers.values():
            try:
                launcher.wait(GUARD)
            finally:
                if launcher.poll() is None:
                    os.killpg(launcher.pid, signal.SIGKILL)


def elastic(nodes: int) -> dict[str, float]:
    job = Job(nodes, f"1:{nodes}")
    try:
        job.wait(lambda: job.committed() == 10, f"step 10 committed by {nodes} workers")
        last = nodes - 1
        killed = time.time()
        os.killpg(job.launchers[last].pid, signal.SIGKILL)  # the machine dies: its launcher and its worker
        lost = job.first_step_after(killed, nodes - 1)
        (job.out / "gate").write_text("20")
        job.wait(lambda: job.committed() == 20, f"step 20 committed by {nodes - 1} workers")
        returned = time.time()
        job.launchers[last] = job.start(last)
        back = job.first_step_after(returned, nodes)
    finally:
        job.finish()
    return {"loss_to_first_step_s": lost, "return_to_first_step_s": back}


def full_restart(nodes: int) -> dict[str, float]:
    job = Job(nodes, str(nodes), "--max-restarts", "1")
    try:
        job.wait(lambda: job.committed() == 10, f"step 10 committed by {nodes} workers")
        killed = time.time()
        os.kill(job.worker_of(nodes - 1), signal.SIGKILL)
        restarted = job.first_step_after(killed, nodes)
    finally:
        job.finish()
    return {"failure_to_first_step_s": restarted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for nodes in args.nodes:
        runs = []
        for _ in range(args.repeats):  # interleaved: each repeat measures both sides
            runs.append({**elastic(nodes), **full_restart(nodes)})
        median = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
        rows.append({"nodes": nodes, "runs": runs, **median,
                     "ratio_loss_vs_restart": median["loss_to_first_step_s"] / median["failure_to_first_step_s"]})
        print(f"{nodes} nodes: node lost -> re-formed group's first step {median['loss_to_first_step_s']:.1f} s; "
              f"node back -> its first step {median['return_to_first_step_s']:.1f} s; full restart -> first step "
              f"{median['failure_to_first_step_s']:.1f} s; lost/restart {rows[-1]['ratio_loss_vs_restart']:.2f}x",
              flush=True)
    if args.json is not None:
        load = os.getloadavg()[0]
        args.json.write_text(json.dumps({"rows": rows, "cpus": os.cpu_count(), "load_at_end": load}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
