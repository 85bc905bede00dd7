"""tfstrategy inside Ray Train's TensorflowTrainer, on a real local Ray cluster (multiprocess tier).

One cluster (``ray_driver.py``) runs every job of this module in turn: two raylets started with
``ray start`` on 127.0.0.2 and 127.0.0.3 (one CPU each, so a 2-worker job puts one worker on each),
token authentication on (Ray 2.60's default) with a fresh token, and a third raylet with a wrong
token that must be refused. Its jobs: a 2-worker Keras ``fit``, compared with one process on the same
global batch (computed here, on one replica); then three failures, each once Ray registered epoch 1's
checkpoint: a 2-worker ``fit`` job (``FailureConfig(max_failures=2)``) whose rank 1 is SIGKILLed after
training epoch 2 but before reporting it (the chief's epoch-2 checkpoint must not count), then, in the
attempt that resumed, sent SIGTERM in the middle of epoch 2 (which a training Ray worker does not act
on: the chief's collective times out); and a 2-worker custom loop (``tfstrategy.make_train_step``,
``max_failures=1``) whose rank 1 is SIGKILLed in the middle of epoch 2. After each, every worker must
resume from the last committed epoch, and the job must end where the uninterrupted job ends: the Ray
``fit`` job for the ``fit`` failures, one process for the custom loop (its epoch 1, restored, ran on
the 2 Ray workers, so ending on one process's weights proves the whole loop; a clean Ray loop job
would only start 2 more workers). The two ``fit`` failures share one job: each job costs a Ray
controller and a worker group, each importing TensorFlow. Last, the script of docs/guides/ray.md,
unchanged, joins the cluster through ``RAY_ADDRESS`` and trains.

Only loopback: the cluster runs in a private network namespace (so even TensorFlow's 0.0.0.0 server
and the raylets, which listen on every interface, are loopback only), and the test checks every
``TF_CONFIG`` address and every listening socket. Where the system allows no namespace, the jobs run
on one ``ray.init`` node kept on 127.0.0.1 instead and the two-node test fails. Every process of the
run is found by a marker variable afterwards and must have exited.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import ray_driver
import ray_jobs
import tensorflow as tf

import tfstrategy
from helpers import ROOT, mirrored
from tfstrategy import _versions
from tfstrategy.errors import ClusterConfigError
from tfstrategy.integrations import ray as tfs_ray

#: Seconds granted to each test of the module; its first carries ``ray_run`` (265-300 s measured on 2 busy cores).
GRANT = 700
pytestmark = [
    pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended, pytest.mark.extras,
    pytest.mark.over_ceiling(seconds=GRANT, reason="one two-node Ray cluster for the whole module: its start, 3 "
                             "TensorflowTrainer jobs (restarted 3 times after faults) and the guide's script"),
]

HERE = Path(__file__).resolve().parent
GUIDE = ROOT / "docs" / "guides" / "ray.md"
JOBS = [
    {"name": "fit", "workers": 2},
    # Attempt 0 is SIGKILLed before its epoch-2 report, attempt 1 (resumed) sent SIGTERM mid-epoch 2, attempt 2 ends.
    # SIGTERM does not stop a Ray worker that trains: the chief's collective times out. A healthy collective of
    # these jobs never waits long for its peer: every phase (start, restore, steps, checkpoints) of fit, custom
    # loop and resumed jobs ran clean with a 3 s and a 5 s timeout on this 2-core machine at load average 12-15;
    # 10 s keeps a 3x margin over the shortest seen to hold.
    {"name": "fit-killed-then-sigterm", "workers": 2, "fail": "kill-before-report,term", "max_failures": 2,
     "collective_timeout": 10},
    {"name": "loop-killed-mid-epoch", "workers": 2, "loop": True, "fail": "kill", "max_failures": 1},
]
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


def isolation_available() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "--map-root-user", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ray_environment(marker: str, temp_dir: str, isolated: bool, two_nodes: bool = False) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TFSTRATEGY_", "TF_CONFIG"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=secrets.token_hex(32),  # else Ray writes one to ~/.ray/auth_token
        RAY_TMPDIR=temp_dir,
        # Ray Train's controller polls its workers this often (2 s by default): it notices a dead worker, registers
        # a reported checkpoint (which each fault waits for) and sees a job end at its next poll.
        RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.5",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONUNBUFFERED="1",
        **{ray_driver.MARKER: marker},
    )
    if not two_nodes:
        # Ray replaces 127.0.0.1 by the host's first non-loopback address unless clusters are "disabled"
        # (read when Ray is imported, in the driver and every process it starts). That also refuses a
        # second node, so the two raylets get explicit addresses (127.0.0.2, 127.0.0.3) instead.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if isolated:
        env["TFSTRATEGY_TEST_NETNS"] = "1"
    return env


def stop_leftovers(marker: str, temp_dir: str, grace: float = 120.0) -> list[int]:
    """Wait for the run's processes to exit; SIGKILL (by pid) and return any still alive after ``grace``."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        alive = ray_driver.run_processes(marker, temp_dir)
        if not alive:
            return []
        time.sleep(0.5)
    alive = ray_driver.run_processes(marker, temp_dir)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return alive


@dataclass
class RayRun:
    out: Path
    summary: dict
    log: str
    leftovers: list[int]
    isolated: bool

    def records(self, job: str, kind: str = "attempt") -> dict[tuple[int, int], dict]:
        """``(attempt, rank) -> what that worker wrote`` at the end (a failed worker wrote nothing), or with
        ``kind="start"`` once prepared (where it resumed from)."""
        found = {}
        for path in (self.out / job).glob(f"{kind}-*-rank-*.json"):
            attempt, rank = (int(v) for v in re.findall(r"\d+", path.name))
            found[(attempt, rank)] = json.loads(path.read_text())
        return found


def run_driver(out: Path, args: list[str], isolated: bool, timeout: float) -> tuple[subprocess.Popen, str, list[int]]:
    marker = uuid.uuid4().hex
    temp_dir = tempfile.mkdtemp(prefix="tfsray-", dir="/tmp")  # Ray's socket paths must stay short
    prefix = ["unshare", "--net", "--map-root-user"] if isolated else []
    env = ray_environment(marker, temp_dir, isolated, two_nodes="two-nodes" in args)
    log_path = out / "driver.log"
    try:
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [*prefix, sys.executable, str(HERE / "netns_run.py"), *args], env=env, cwd=out,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    finally:
        leftovers = stop_leftovers(marker, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
    return process, log_path.read_text(errors="replace"), leftovers


def guide_script() -> str:
    """The Python block of docs/guides/ray.md, as the page shows it."""
    found = re.search(r"<!-- docs-test: skip starts a Ray cluster.*?-->\n```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert found, f"{GUIDE}: no python block after its '<!-- docs-test: skip starts a Ray cluster' comment"
    return found.group(1)


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory) -> RayRun:
    out = tmp_path_factory.mktemp("ray")
    (out / "guide").mkdir()
    (out / "guide" / "train_ray.py").write_text(guide_script())
    jobs = [*JOBS, {"name": "guide", "script": str(out / "guide" / "train_ray.py")}]
    isolated = isolation_available()
    args = [str(HERE / "ray_driver.py"), str(out), json.dumps(jobs), *(["two-nodes"] if isolated else [])]
    # Ended, and its leftovers stopped (at most 2 min), before the test's own grant runs out.
    process, log, leftovers = run_driver(out, args, isolated, timeout=GRANT - 150)
    assert process.returncode == 0, log[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    for name, job in summary["jobs"].items():  # from trainer.fit() to the training function's first line
        starts = [float(p.read_text()) for p in (out / name).glob("started-rank-*-0")]
        job["worker_start_seconds"] = min(starts) - job["fit_called"] if starts else None
    wrong = summary.get("wrong_token", {})
    raylets = f" (head {summary['head_seconds']:.0f}s, second raylet {summary['join_seconds']:.0f}s)" if "nodes" in summary else ""
    print(f"\nray: {summary.get('nodes') or [summary['node_ip']]} started in {summary['init_seconds']:.1f}s{raylets}, whole run "
          f"{summary['seconds']:.0f}s ({summary['cpu_seconds']['all']:.0f} CPU-s), peak PSS {summary['peak_pss_mib']:.0f} MiB "
          f"over {summary['peak_processes']} processes, jobs " +
          ", ".join(f"{name} {job['seconds']:.0f}s" + (f" (workers started after {job['worker_start_seconds']:.0f}s)"
                                                       if job["worker_start_seconds"] is not None else "")
                    for name, job in summary["jobs"].items()) +
          (f"; wrong token: status {wrong.get('returncode')} after {wrong.get('seconds') or 0:.0f}s: "
           f"{(wrong.get('output') or '').strip().splitlines()[-1:][0][:110] if wrong.get('output') else ''}" if wrong else ""))
    return RayRun(out=out, summary=summary, log=log, leftovers=leftovers, isolated=isolated)


def one_process(loop: bool) -> tuple[list[float], list[np.ndarray]]:
    """The same training in this process on one replica: the reference every Ray job must match."""
    strategy = mirrored(1)
    with strategy.scope():
        model = ray_jobs.build_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="mse")
        model.optimizer.build(model.trainable_variables)
    x, y = ray_jobs._data()
    batches = tfstrategy.prepare_dataset(tf.data.Dataset.from_tensor_slices((x, y)), strategy, global_batch=ray_jobs.GLOBAL_BATCH)
    if not loop:
        history = model.fit(batches, epochs=ray_jobs.EPOCHS, shuffle=False, verbose=0)
        return [float(v) for v in history.history["loss"]], model.get_weights()
    step = tfstrategy.make_train_step(model, strategy=strategy, global_batch=ray_jobs.GLOBAL_BATCH, loss="mse")
    losses = []
    for _ in range(ray_jobs.EPOCHS):
        values = [float(step(batch)["loss"]) for batch in strategy.experimental_distribute_dataset(batches)]
        losses.append(sum(values) / len(values))
    return losses, model.get_weights()


@pytest.fixture(scope="module")
def reference():
    result = {"fit": one_process(loop=False), "loop": one_process(loop=True)}
    print(f"\none process: fit losses {result['fit'][0]}, custom loop losses {result['loop'][0]}")
    return result


def assert_weights_close(actual, expected):
    assert len(actual) == len(expected)
    for a, b in zip(actual, expected):
        np.testing.assert_allclose(np.asarray(a), b, **TOLERANCE)


def test_every_job_succeeded(ray_run):
    for job in JOBS:
        result = ray_run.summary["jobs"][job["name"]]
        assert result["error"] is None, result["error"]
        assert result["metrics"]["epoch"] == ray_jobs.EPOCHS and result["checkpoint"], result


def test_two_ray_workers_equal_one_process(ray_run, reference):
    job = "fit"
    records = ray_run.records(job)
    assert set(records) == {(0, 0), (0, 1)}
    ref_losses, ref_weights = reference[job]
    for record in records.values():
        # The worker Ray made: TensorFlow imported, TF_USE_LEGACY_KERAS=1 set, a training thread.
        assert record["tf_use_legacy_keras"] == "1" and record["thread"].startswith("TrainingThread")
        assert record["tensorflow_imported"] and not record["runtime_started_before_prepare"]  # cpu_replicas could split
        assert record["strategy"] == "CollectiveAllReduceStrategy" and record["replicas"] == 2
        assert "record_creation_sites" in record["explain"]
        if not _versions.keras_package() == "tf_keras":
            assert "keras_mwms" in record["patches"]  # without it Keras 3 fit fails under MWMS
        assert record["initial_epoch"] == 0 and record["resumed_from"] is None
        assert record["steps"] == ray_jobs.EPOCHS * ray_jobs.EXAMPLES // ray_jobs.GLOBAL_BATCH
        np.testing.assert_allclose(record["losses"], ref_losses, **TOLERANCE)
        assert_weights_close(record["weights"], ref_weights)
    assert records[(0, 0)]["losses"] == records[(0, 1)]["losses"]  # bit-identical on both workers
    assert records[(0, 0)]["weights"] == records[(0, 1)]["weights"]
    assert ray_run.summary["jobs"][job]["metrics"]["loss"] == pytest.approx(ref_losses[-1], rel=1e-5)


def uninterrupted(ray_run: RayRun, reference: dict, kind: str) -> tuple[int, list[float], list[np.ndarray]]:
    """Steps, losses and weights of the uninterrupted run: the Ray ``fit`` job; one process for the custom loop."""
    if kind == "fit":
        clean = ray_run.records("fit")[(0, 0)]
        return clean["steps"], clean["losses"], [np.asarray(w) for w in clean["weights"]]
    losses, weights = reference["loop"]
    return ray_jobs.EPOCHS * ray_jobs.EXAMPLES // ray_jobs.GLOBAL_BATCH, losses, weights


@pytest.mark.parametrize(
    ("job", "kind", "fault"),
    [
        pytest.param("fit-killed-then-sigterm", "fit", "kill-before-report", id="sigkill-after-epoch-2-before-its-report"),
        pytest.param("loop-killed-mid-epoch", "loop", "kill", id="sigkill-mid-epoch-2-custom-loop"),
        pytest.param("fit-killed-then-sigterm", "fit", "term", id="sigterm-mid-epoch-2"),
    ],
)
def test_a_failed_worker_resumes_every_worker_from_the_last_committed_epoch(ray_run, reference, job, kind, fault):
    records, starts = ray_run.records(job), ray_run.records(job, "start")
    spec = next(spec for spec in JOBS if spec["name"] == job)
    faults = spec["fail"].split(",")
    failed, last = faults.index(fault), len(faults)  # the attempt this fault ended; the one that trained to the end
    fired = (ray_run.out / job / f"fault-fired-{fault}").read_text()
    assert "epoch 2" in fired and "committed before: [1]" in fired, fired
    timeout = spec.get("collective_timeout")
    if timeout is not None:  # the fault failed the attempt, not the peers' wait for epoch 1's commit
        assert float(re.search(r"waited ([\d.]+) s", fired).group(1)) < timeout, fired
    # The attempt the fault ended: rank 1 died before writing its record; Ray restarted the whole group, once per fault.
    assert (failed, 1) not in records and set(records) >= {(last, 0), (last, 1)}, sorted(records)
    assert not {attempt for attempt, _ in records} & set(range(last)), sorted(records)  # every faulted attempt failed
    # The attempt that followed the fault resumed every worker from epoch 1, the same checkpoint, the same state.
    after = [starts[(failed + 1, 0)], starts[(failed + 1, 1)]]
    assert [start["initial_epoch"] for start in after] == [1, 1], after[0]["resumed_from"]
    assert after[0]["resumed_from"] == after[1]["resumed_from"] is not None
    assert after[0]["start_weights"] == after[1]["start_weights"]
    steps, losses, weights = uninterrupted(ray_run, reference, kind)
    resumed = [records[(last, 0)], records[(last, 1)]]
    assert resumed[0]["resumed_from"] == after[0]["resumed_from"]  # nothing committed in between
    for record in resumed:
        assert record["strategy"] == "CollectiveAllReduceStrategy" and record["replicas"] == 2
        # Epoch 2 was never reported by every worker, so its checkpoint (even the chief's) does not count.
        assert record["initial_epoch"] == 1, record["resumed_from"]
        assert record["resumed_from"] == resumed[0]["resumed_from"] is not None
        assert record["steps"] == steps
        np.testing.assert_allclose(record["losses"], losses[1:], **TOLERANCE)
        assert_weights_close(record["weights"], weights)
    assert resumed[0]["start_weights"] == resumed[1]["start_weights"]  # the same restored state everywhere
    assert resumed[0]["losses"] == resumed[1]["losses"] and resumed[0]["weights"] == resumed[1]["weights"]


def test_only_loopback_addresses(ray_run):
    if ray_run.isolated:
        assert ray_run.summary["nodes"] == ["127.0.0.2", "127.0.0.3"] and ray_run.summary["interfaces"] == ["lo"]
    else:
        assert ray_run.summary["node_ip"] == "127.0.0.1"
    seen = 0
    for job in JOBS:
        for record in ray_run.records(job["name"]).values():
            addresses = record["tf_config"]["cluster"]["worker"]
            assert addresses and all(a.startswith("127.") for a in addresses), addresses
            tf_ports = {a.rsplit(":", 1)[1] for a in addresses}
            for listener in record["listeners"]:
                host, port = listener.rsplit(":", 1)
                # TensorFlow's gRPC server binds 0.0.0.0 whatever TF_CONFIG says. Ray's own servers (GCS, raylets,
                # object managers, workers) bind their node's address only on a one-node cluster with clusters
                # "disabled"; on the two-node cluster they bind every interface too. In the namespace both are
                # reachable on lo only (interfaces == ["lo"], asserted above).
                assert host.startswith("127.") or (port in tf_ports and host in ("0.0.0.0", "::")) or (
                    ray_run.isolated and host in ("0.0.0.0", "::")), listener
                seen += 1
    assert seen > 0


def test_every_ray_process_stopped(ray_run):
    assert ray_run.leftovers == [], f"processes left running after ray.shutdown (killed now): {ray_run.leftovers}"
    assert "_variable_creator_stack" not in ray_run.log and "UnsupportedVersionError" not in ray_run.log


def test_the_guide_script_runs(ray_run):
    # The page's script, unchanged, as a driver of its own: RAY_ADDRESS makes its ray.init() join the cluster.
    result = ray_run.summary["jobs"]["guide"]
    log = (ray_run.out / "guide" / "output.log").read_text(errors="replace")
    assert result["returncode"] == 0, log[-6000:]
    final = [line for line in log.splitlines() if line.startswith("final loss ")]
    assert final and final[-1].endswith("after epoch 3"), log[-3000:]
    assert float(final[-1].split()[2]) < 10.0  # trained (the target is a sum of 8 normals: variance 8)
    assert (ray_run.out / "guide" / "ray_results" / "tfstrategy-ray").is_dir()  # its storage_path, next to it
    assert ray_run.leftovers == []  # its driver and workers are the run's too (they carry its marker)


def test_two_raylets_on_two_loopback_addresses_with_token_auth(ray_run, reference):
    # Raylets on 127.0.0.2/.3 listen on every interface: only a private network namespace keeps them on loopback.
    assert ray_run.isolated, "needs unshare --net (a private network namespace) to keep two raylets off the network"
    summary = ray_run.summary
    assert summary["nodes"] == ["127.0.0.2", "127.0.0.3"] and summary["interfaces"] == ["lo"]
    wrong = summary["wrong_token"]
    assert wrong["returncode"] != 0 and re.search(r"(?i)auth|token", wrong["output"]), wrong  # refused for its token
    assert summary["jobs"]["fit"]["error"] is None, summary["jobs"]["fit"]["error"]
    for job in JOBS:  # every job: one worker on each node
        for record in ray_run.records(job["name"]).values():
            hosts = sorted(address.rsplit(":", 1)[0] for address in record["tf_config"]["cluster"]["worker"])
            assert hosts == ["127.0.0.2", "127.0.0.3"], (job["name"], hosts)
    for record in ray_run.records("fit").values():
        np.testing.assert_allclose(record["losses"], reference["fit"][0], **TOLERANCE)
    assert ray_run.leftovers == []


def test_prepare_outside_a_ray_worker_is_refused_clearly():
    """With Ray Train installed (tests/integrations/test_ray_worker_conditions.py has the case without it)."""
    with pytest.raises(ClusterConfigError, match=r"prepare\(\) outside a Ray Train worker.*TensorflowTrainer"):
        tfs_ray.prepare(lambda: None)
