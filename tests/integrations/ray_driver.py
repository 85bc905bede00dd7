"""Start a loopback-only local Ray cluster, run TensorflowTrainer jobs on it, stop it; for tests/integrations.

``python netns_run.py ray_driver.py OUT JOBS_JSON [two-nodes]``: JOBS_JSON is a list of ``{"name",
"workers", "loop", "fail", "max_failures"}``; ``two-nodes`` starts two raylets with ``ray start``
(127.0.0.2 and 127.0.0.3, token auth) instead of ``ray.init``. Run by the tests inside a private
network namespace (``unshare --net``) when the system allows one, so even a server bound to 0.0.0.0 is reachable on loopback only; Ray itself is
kept on 127.0.0.1 by ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (set by the caller, read when Ray is
imported) and ``_node_ip_address``. Writes ``OUT/summary.json``: per job its result and timings, the
cluster's start-up time and the peak memory (PSS) of every process of the run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
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


def _ray_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    ray = str(Path(sys.executable).with_name("ray"))
    return subprocess.run([ray, *args], capture_output=True, text=True, timeout=timeout, env=env)


def start_two_nodes(summary: dict, temp_dir: str) -> str:
    """``ray start`` a head raylet on 127.0.0.2 and a second one on 127.0.0.3 (token auth); the address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.2:{port}"
    common = ["--num-cpus=1", "--object-store-memory=150000000", "--disable-usage-stats"]
    head = _ray_cli("start", "--head", "--node-ip-address=127.0.0.2", f"--port={port}", "--include-dashboard=false",
                    f"--temp-dir={temp_dir}", *common)
    if head.returncode != 0:
        raise RuntimeError(f"ray start --head failed: {head.stdout[-2000:]} {head.stderr[-2000:]}")
    # A raylet with another token must not join.
    wrong = {**os.environ, "RAY_AUTH_TOKEN": "0" * 64}
    began = time.time()
    try:
        refused = _ray_cli("start", f"--address={address}", "--node-ip-address=127.0.0.3", *common, env=wrong, timeout=240)
        summary["wrong_token"] = {"returncode": refused.returncode, "seconds": time.time() - began,
                                  "output": (refused.stdout + refused.stderr)[-1500:]}
    except subprocess.TimeoutExpired:
        summary["wrong_token"] = {"returncode": None, "seconds": time.time() - began, "output": "timed out"}
    joined = _ray_cli("start", f"--address={address}", "--node-ip-address=127.0.0.3", *common)
    if joined.returncode != 0:
        raise RuntimeError(f"ray start --address failed: {joined.stdout[-2000:]} {joined.stderr[-2000:]}")
    return address


def main() -> int:
    out, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
    two_nodes = len(sys.argv) > 3 and sys.argv[3] == "two-nodes"
    sampler = MemorySampler(os.environ[MARKER])
    sampler.start()
    began = time.time()
    summary: dict = {"jobs": {}, "interfaces": [name for _, name in socket.if_nameindex()]}
    try:
        import ray
        import ray_jobs
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer

        if two_nodes:
            address = start_two_nodes(summary, os.environ["RAY_TMPDIR"])
            ray.init(address=address, _node_ip_address="127.0.0.2", configure_logging=False)
            summary["nodes"] = sorted(node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"])
        else:
            ray.init(
                num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=os.environ["RAY_TMPDIR"],
                object_store_memory=200 * 1024**2, log_to_driver=True, configure_logging=False,
            )
        summary.update(init_seconds=time.time() - began, node_ip=ray.util.get_node_ip_address())
        for job in jobs:
            job_out = out / job["name"]
            job_out.mkdir(parents=True, exist_ok=True)
            trainer = TensorflowTrainer(
                ray_jobs.train_fn,
                train_loop_config={
                    "out": str(job_out), "storage": str(out / "storage" / job["name"]), "loop": job.get("loop", False),
                    "fail": job.get("fail", ""), "collective_timeout": job.get("collective_timeout"),
                },
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
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()
        if two_nodes:  # `ray stop` would stop every Ray process of the machine; stop this run's, by pid
            stop_run_processes(os.environ[MARKER])
        sampler.stopped.set()
        sampler.join()
        summary["peak_pss_mib"] = sampler.peak_kib / 1024
        summary["peak_processes"] = sampler.peak_processes
        (out / "summary.json").write_text(json.dumps(summary, default=str))
    return 0


def stop_run_processes(marker: str, grace: float = 30.0) -> None:
    """SIGTERM every other process of this run, then SIGKILL what is left after ``grace`` seconds."""
    others = [pid for pid in run_processes(marker) if pid != os.getpid()]
    for pid in others:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and [pid for pid in run_processes(marker) if pid != os.getpid()]:
        time.sleep(0.2)
    for pid in run_processes(marker):
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
