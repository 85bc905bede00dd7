"""Start a loopback-only local Ray cluster, run TensorflowTrainer jobs on it, stop it; for tests/integrations.

``python netns_run.py ray_driver.py OUT JOBS_JSON [two-nodes]``: JOBS_JSON is a list of ``{"name",
"workers", "loop", "fail", "max_failures", "collective_timeout"}`` (a ``TensorflowTrainer`` job of
``ray_jobs.train_fn``) or ``{"name", "script"}`` (a driver script of its own, run in its directory with
``RAY_ADDRESS`` naming this cluster, so its ``ray.init()`` joins it; its output goes to
``OUT/<name>/output.log``). ``two-nodes`` starts two raylets with ``ray start`` (127.0.0.2 and
127.0.0.3, one CPU each, token auth; a third with a wrong token, started alongside, must be refused)
instead of ``ray.init``. Run by the tests inside a private network namespace (``unshare --net``), so
even a server bound to 0.0.0.0 is reachable on loopback only; without one (one node only) Ray is kept
on 127.0.0.1 by ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (set by the caller, read when Ray is imported)
and ``_node_ip_address``. Writes ``OUT/summary.json``: per job its result and timings, the cluster's
start-up time, and the peak memory (PSS) and CPU seconds of every process of the run.
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


def run_processes(marker: str, temp_dir: str | None = None) -> list[int]:
    """PIDs of every live process of this run: its environment carries ``MARKER=marker``, or it holds a file
    open under the run's own ``temp_dir`` (``RAY_TMPDIR``: Ray's agents, whose environment ``setproctitle``
    overwrites, still write their logs there)."""
    needle = f"{MARKER}={marker}".encode()
    inside = None if temp_dir is None else os.path.join(os.path.realpath(temp_dir), "")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry))
                    continue
            if inside is not None and _holds_file_under(entry, inside):
                found.append(int(entry))
        except OSError:
            continue
    return found


def _holds_file_under(pid: str, directory: str) -> bool:
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{descriptor}").startswith(directory):
                return True
        except OSError:
            continue
    return False


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _cpu_ticks(pid: int) -> tuple[str, int]:
    """The name (``comm``) of ``pid`` and its user + system CPU time so far, in clock ticks (0 once it is gone)."""
    try:
        name, rest = Path(f"/proc/{pid}/stat").read_text().split(" (", 1)[1].rsplit(")", 1)
        fields = rest.split()
        return name, int(fields[11]) + int(fields[12])  # utime and stime: fields 14 and 15 of proc(5)
    except (OSError, ValueError, IndexError):
        return "", 0


class MemorySampler(threading.Thread):
    """The peak, over the run, of the summed PSS of the run's processes, and the CPU seconds they used (each
    process's last sample: what it used in its last second is missed; sampled every second)."""

    def __init__(self, marker: str, temp_dir: str) -> None:
        super().__init__(daemon=True)
        self.marker, self.temp_dir, self.peak_kib, self.peak_processes = marker, temp_dir, 0, 0
        self.ticks: dict[int, tuple[str, int]] = {}
        self.stopped = threading.Event()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds by process name, most first (``"all"``: their sum)."""
        by_name: dict[str, float] = {}
        for name, ticks in self.ticks.values():
            by_name[name] = by_name.get(name, 0.0) + ticks / os.sysconf("SC_CLK_TCK")
        return {"all": sum(by_name.values()), **dict(sorted(by_name.items(), key=lambda item: -item[1]))}

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            pids = run_processes(self.marker, self.temp_dir)
            total = sum(_pss_kib(pid) for pid in pids)
            if total > self.peak_kib:
                self.peak_kib, self.peak_processes = total, len(pids)
            for pid in pids:
                name, ticks = _cpu_ticks(pid)
                if ticks >= self.ticks.get(pid, ("", 0))[1]:
                    self.ticks[pid] = (name, ticks)


#: Ray's smallest object store (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES): the jobs put next to nothing in it.
OBJECT_STORE_BYTES = 75 * 1024 * 1024


class WrongToken(threading.Thread):
    """``ray start`` of a raylet on 127.0.0.3 with another token, which must be refused; ``result`` once it ended.

    Ray's client retries for about 20 s before it gives up, so it runs alongside the jobs.
    """

    def __init__(self, address: str, common: list[str]) -> None:
        super().__init__(daemon=True)
        self.args = [str(Path(sys.executable).with_name("ray")), "start", f"--address={address}",
                     "--node-ip-address=127.0.0.3", *common]
        self.result: dict = {"returncode": None, "seconds": None, "output": "not ended"}

    def run(self) -> None:
        began = time.time()
        try:
            ended = subprocess.run(self.args, env={**os.environ, "RAY_AUTH_TOKEN": "0" * 64}, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=240)
            self.result = {"returncode": ended.returncode, "seconds": time.time() - began, "output": ended.stdout[-1500:]}
        except subprocess.TimeoutExpired:
            self.result = {"returncode": None, "seconds": time.time() - began, "output": "timed out"}


def _ray_start(*args: str) -> subprocess.Popen:
    ray = str(Path(sys.executable).with_name("ray"))
    return subprocess.Popen([ray, "start", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _started(process: subprocess.Popen, what: str, timeout: float = 300) -> None:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{what} failed (status {process.returncode}): {output[-4000:]}")


class TwoNodes:
    """A head raylet on 127.0.0.2 and a second one on 127.0.0.3, each ``ray start``ed (one CPU, token auth).

    Each step starts what it can and returns, so that the driver's own imports and ``ray.init`` overlap the
    raylets' start; alongside the second raylet a third, with a wrong token, must be refused (:class:`WrongToken`).
    """

    def __init__(self, temp_dir: str, summary: dict) -> None:
        from tfstrategy.launch.processes import free_ports

        port, client_port = free_ports(2, "127.0.0.2")
        self.address, self.summary, self.began = f"127.0.0.2:{port}", summary, time.time()
        # Not Ray's default ports for its workers (10002-19999) and client server (10001): pytest workers take
        # 10000-13999 (tests/conftest.py), and TensorFlow's servers listen on every address.
        self.common = ["--num-cpus=1", f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats",
                       "--min-worker-port=20000", "--max-worker-port=20999"]
        self.head = _ray_start("--head", "--node-ip-address=127.0.0.2", f"--port={port}", "--include-dashboard=false",
                               f"--ray-client-server-port={client_port}", f"--temp-dir={temp_dir}", *self.common)
        self.wrong: WrongToken | None = None
        self.joining: subprocess.Popen | None = None

    def join(self) -> None:
        """Once the head is up: start the second raylet, and the one with the wrong token."""
        _started(self.head, "ray start --head")
        self.summary["head_seconds"] = time.time() - self.began
        self.wrong = WrongToken(self.address, self.common)
        self.wrong.start()
        self.joining = _ray_start(f"--address={self.address}", "--node-ip-address=127.0.0.3", *self.common)

    def joined(self) -> None:
        assert self.joining is not None
        _started(self.joining, "ray start --address")
        self.summary["join_seconds"] = time.time() - self.began - self.summary["head_seconds"]


def run_script(job: dict, job_out: Path, address: str) -> dict:
    """Run a driver script of its own (the guide's) with ``RAY_ADDRESS``: its ``ray.init()`` joins this cluster."""
    script = Path(job["script"])
    started = time.time()
    with open(job_out / "output.log", "w") as log:
        process = subprocess.run([sys.executable, str(script)], cwd=script.parent, env={**os.environ, "RAY_ADDRESS": address},
                                 stdout=log, stderr=subprocess.STDOUT, timeout=job.get("timeout", 600))
    return {"seconds": time.time() - started, "fit_called": started, "returncode": process.returncode,
            "error": None if process.returncode == 0 else f"exit status {process.returncode}"}


def main() -> int:
    out, jobs = Path(sys.argv[1]), json.loads(sys.argv[2])
    two_nodes = len(sys.argv) > 3 and sys.argv[3] == "two-nodes"
    marker, temp_dir = os.environ[MARKER], os.environ["RAY_TMPDIR"]
    sampler = MemorySampler(marker, temp_dir)
    sampler.start()
    began = time.time()
    summary: dict = {"jobs": {}, "interfaces": [name for _, name in socket.if_nameindex()]}
    nodes = None
    try:
        if two_nodes:
            nodes = TwoNodes(temp_dir, summary)
        import ray
        import ray_jobs
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.tensorflow import TensorflowTrainer

        if nodes is not None:
            nodes.join()
            address = nodes.address
            ray.init(address=address, _node_ip_address="127.0.0.2", configure_logging=False)
            nodes.joined()
            summary["nodes"] = sorted(node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"])
        else:
            ray.init(
                num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=temp_dir,
                object_store_memory=OBJECT_STORE_BYTES, log_to_driver=True, configure_logging=False,
            )
            address = ray.get_runtime_context().gcs_address
        summary.update(init_seconds=time.time() - began, node_ip=ray.util.get_node_ip_address())
        for job in jobs:
            job_out = out / job["name"]
            job_out.mkdir(parents=True, exist_ok=True)
            if "script" in job:
                summary["jobs"][job["name"]] = run_script(job, job_out, address)
                print(f"job {job['name']} done in {summary['jobs'][job['name']]['seconds']:.1f}s", flush=True)
                continue
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
        ending = time.time()
        if nodes is not None and nodes.wrong is not None:
            nodes.wrong.join(timeout=300)
            summary["wrong_token"] = nodes.wrong.result
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()
        if two_nodes:  # `ray stop` would stop every Ray process of the machine; stop this run's, by pid
            stop_run_processes(marker, temp_dir)
        sampler.stopped.set()
        sampler.join()
        summary["peak_pss_mib"] = sampler.peak_kib / 1024
        summary["peak_processes"] = sampler.peak_processes
        summary["cpu_seconds"] = sampler.cpu_seconds()
        summary["seconds"] = time.time() - began
        summary["shutdown_seconds"] = time.time() - ending
        (out / "summary.json").write_text(json.dumps(summary, default=str))
    return 0


def stop_run_processes(marker: str, temp_dir: str, grace: float = 30.0) -> None:
    """Stop every other process of this run in ``ray stop``'s order: the raylets, then the rest, then the GCS
    (all at once, the GCS and the autoscaler's monitor were seen to outlive a 30 s grace). Each group gets
    SIGTERM, then SIGKILL for what is left of it after ``grace`` seconds."""

    def bucket(pid: int) -> int:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return 1
        return 0 if b"/raylet/raylet" in command else 2 if b"/gcs/gcs_server" in command else 1

    for order in range(3):
        targets = [pid for pid in run_processes(marker, temp_dir) if pid != os.getpid() and bucket(pid) == order]
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and set(targets) & set(run_processes(marker, temp_dir)):
            time.sleep(0.2)
        for pid in set(targets) & set(run_processes(marker, temp_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for pid in run_processes(marker, temp_dir):  # anything started meanwhile
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
