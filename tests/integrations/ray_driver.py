"""Start a loopback-only local Ray cluster, run TensorflowTrainer jobs on it, stop it; for tests/integrations.

``python ray_driver.py OUT JOBS_JSON``: JOBS_JSON is a list of ``{"name", "workers", "loop", "fail",
"max_failures"}``. Run by the tests inside a private network namespace (``unshare --net``) when the
system allows one, so even a server bound to 0.0.0.0 is reachable on loopback only; Ray itself is
kept on 127.0.0.1 by ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (set by the caller, read when Ray is
imported) and ``_node_ip_address``. Writes ``OUT/summary.json``: per job its result and timings, the
cluster's start-up time and the peak memory (PSS) of every process of the run.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

MARKER = "TFSTRATEGY_RAY_TEST_RUN"


def run_processes(marker: str) -> list[int]:
    """PIDs of every live process whose environment carries ``MARKER=marker`` (all of this run's)."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class MemorySampler(threading.Thread):
    """The peak, over the run, of the summed PSS of the run's processes (sampled every second)."""

    def __init__(self, marker: str) -> None:
        super().__init__(daemon=True)
        self.marker, self.peak_kib, self.peak_processes = marker, 0, 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            pids = run_processes(self.marker)
            total = sum(_pss_kib(pid) for pid in pids)
            if total > self.peak_kib:
                self.peak_kib, self.peak_processes = total, len(pids)


def main() -> int:
    out, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
    if os.environ.get("TFSTRATEGY_TEST_NETNS") == "1":  # in a new network namespace: only lo, down
        from tfstrategy.launch.network_isolation import bring_up_loopback

        bring_up_loopback()
    sampler = MemorySampler(os.environ[MARKER])
    sampler.start()
    began = time.time()
    import ray
    import ray_jobs
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    ray.init(
        num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=os.environ["RAY_TMPDIR"],
        object_store_memory=200 * 1024**2, log_to_driver=True, configure_logging=False,
    )
    summary: dict = {
        "init_seconds": time.time() - began, "node_ip": ray.util.get_node_ip_address(), "jobs": {},
        "interfaces": [name for _, name in socket.if_nameindex()],
    }
    try:
        for job in jobs:
            job_out = out / job["name"]
            job_out.mkdir(parents=True, exist_ok=True)
            trainer = TensorflowTrainer(
                ray_jobs.train_fn,
                train_loop_config={"out": str(job_out), "loop": job.get("loop", False), "fail": job.get("fail", "")},
                scaling_config=ScalingConfig(num_workers=job["workers"], resources_per_worker={"CPU": 1}),
                run_config=RunConfig(
                    storage_path=str(out / "storage"), name=job["name"],
                    failure_config=FailureConfig(max_failures=job.get("max_failures", 0)),
                ),
            )
            started = time.time()
            result = trainer.fit()
            summary["jobs"][job["name"]] = {
                "seconds": time.time() - started,
                "fit_called": started,
                "error": None if result.error is None else f"{type(result.error).__name__}: {result.error}"[:2000],
                "metrics": result.metrics,
                "checkpoint": None if result.checkpoint is None else result.checkpoint.path,
            }
            print(f"job {job['name']} done in {time.time() - started:.1f}s", flush=True)
    finally:
        ray.shutdown()
        sampler.stopped.set()
        sampler.join()
        summary["peak_pss_mib"] = sampler.peak_kib / 1024
        summary["peak_processes"] = sampler.peak_processes
        (out / "summary.json").write_text(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
