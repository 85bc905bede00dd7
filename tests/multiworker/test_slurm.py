"""Multi-worker training under a real Slurm: srun without TF_CONFIG, two jobs at once, preemption and requeue.

Needs Slurm (``.ci/install-slurm``) and root; without Slurm these tests fail.
The pure parsing of the step variables is in tests/multiworker/test_slurm_env.py.

One pair of uninterrupted srun jobs, run at once (the ``uninterrupted`` fixture), serves every test that
compares: two jobs on one node at once, two workers against one process, and the reference weights of
the killed and the preempted job (the same example, epochs and global batch).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import slurm_cluster
from helpers import ROOT
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.multiprocess

EXAMPLE = str(ROOT / "examples" / "multi_worker_train.py")
SBATCH = str(ROOT / "examples" / "slurm" / "train.sbatch")
QUIET = "TF_CPP_MIN_LOG_LEVEL=2"
FINAL = re.compile(r"final loss (\S+) steps (\d+)")
#: The example's run in this module: 4 epochs of 32 steps (4096 examples, global batch 128).
EPOCHS, STEPS_PER_EPOCH = 4, 32


@pytest.fixture(scope="module")
def cluster():
    cluster = SlurmCluster()
    cluster.start(timeout=60)
    yield cluster
    conf = str(cluster.conf)
    cluster.stop()
    assert slurm_cluster._processes_with_env("SLURM_CONF", conf) == []


def finals(text: str) -> list[tuple[float, int]]:
    return [(float(loss), int(steps)) for loss, steps in FINAL.findall(text)]


def srun_example(cluster: SlurmCluster, out: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return cluster.srun(
        ["-n", "2", "--label", f"--export=ALL,{QUIET}", sys.executable, EXAMPLE, "--out", str(out), *args],
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """Two srun jobs of the example at once, without a backup: the directory of ``model-<job>.keras``, each job's end."""
    out = tmp_path_factory.mktemp("uninterrupted")
    results: dict[int, subprocess.CompletedProcess] = {}

    def run(job: int) -> None:
        results[job] = srun_example(cluster, out / f"model-{job}.keras", "--epochs", str(EPOCHS))

    threads = [threading.Thread(target=run, args=(job,)) for job in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out, [results[job] for job in range(2)]


def test_two_jobs_on_one_node_at_once_both_succeed(uninterrupted):
    _, results = uninterrupted
    for result in results:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    losses = [finals(r.stdout) for r in results]
    assert losses[0] == losses[1] and len(losses[0]) == 2 and losses[0][0] == losses[0][1]


def test_srun_two_workers_without_tf_config_agree_and_equal_one_process(uninterrupted, tmp_path):
    out, (result, _) = uninterrupted
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TF_CONFIG", "TFSTRATEGY_"))}
    single = subprocess.run(
        [sys.executable, EXAMPLE, "--epochs", str(EPOCHS), "--out", str(tmp_path / "single.keras")],
        capture_output=True, text=True, timeout=240, env={**environment, "TF_CPP_MIN_LOG_LEVEL": "2"}, cwd=ROOT,
    )

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert single.returncode == 0, single.stderr[-3000:]
    for task in ("0", "1"):
        explain = next(line for line in result.stdout.splitlines() if line.startswith(f"{task}: auto:"))
        assert "auto: the Slurm job step has 2 tasks, so MultiWorkerMirroredStrategy" in explain
        assert "set TF_CONFIG from Slurm job" in explain and f"worker {task} of 2" in explain
    (loss0, steps0), (loss1, steps1) = finals(result.stdout)
    ((loss_single, steps_single),) = finals(single.stdout)
    assert loss0 == loss1
    assert steps0 == steps1 == steps_single == EPOCHS * STEPS_PER_EPOCH
    assert loss0 == pytest.approx(loss_single, abs=1e-5)
    assert (out / "model-0.keras").exists()


def test_a_layout_tfstrategy_cannot_serve_is_refused_in_one_line(cluster):
    # Two tasks on the node but one reserved port: the second worker would have no port of its own.
    result = cluster.srun(["-n", "2", "--resv-ports=1", f"--export=ALL,{QUIET}", sys.executable, "-m", "tfstrategy",
                           "check"], timeout=120)

    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("tfstrategy check: error:")]
    assert len(errors) == 2, result.stderr[-3000:]
    assert all(re.search(r"Received SLURM_STEP_RESV_PORTS=\d+ \(1 port\(s\)\) for a step with 2 tasks on a node; "
                         r"expected one reserved port per task on a node\. .*--resv-ports=2", line) for line in errors)


def test_env_inside_a_step_reports_job_step_task_and_nodes(cluster):
    result = cluster.srun(["-n", "2", "--label", f"--export=ALL,{QUIET}", sys.executable, "-m", "tfstrategy", "env"],
                          timeout=120)

    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if "- Slurm job step:" in line]
    assert len(lines) == 2
    ports = set()
    for line in lines:
        task = line.split(":", 1)[0]
        match = re.search(rf"job (\d+) step 0, task {task} of 2 on {cluster.node} \(local {task}\), nodes {cluster.node}; "
                          rf"select\(\) sets TF_CONFIG: worker {task} of 2 at {cluster.node}:(\d+), workers (\S+) "
                          r"\(ports SLURM_STEP_RESV_PORTS=", line)
        assert match, line
        ports.add(match[3])
    assert len(ports) == 1  # both tasks build the same cluster
    assert "auto: the Slurm job step has 2 tasks, so MultiWorkerMirroredStrategy" in result.stdout


def wait_for(path: Path, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(pattern, path.read_text() if path.exists() else "")
        if match:
            return match
        time.sleep(0.1)
    raise AssertionError(f"{pattern!r} not in {path} after {timeout} s:\n{path.read_text() if path.exists() else ''}")


def wait_for_count(path: Path, text: str, count: int, timeout: float) -> None:
    """Wait until ``text`` occurs ``count`` times in the file at ``path``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count(text) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not {count} times in {path} after {timeout} s:\n"
                         f"{path.read_text() if path.exists() else ''}")


def submit(cluster: SlurmCluster, tmp_path: Path, name: str, epochs: int) -> tuple[int, Path]:
    out = tmp_path / f"{name}.out"
    result = cluster.run([
        "sbatch", "--parsable", "-N", "1", "-n", "2", "--ntasks-per-node=2", f"--output={out}", f"--chdir={ROOT}",
        f"--export=ALL,{QUIET},PYTHON={sys.executable},TFSTRATEGY_BACKUP_DIR={tmp_path / name / 'backup'}",
        SBATCH, "--epochs", str(epochs), "--out", str(tmp_path / name / "model.keras"),
    ], timeout=30)
    return int(result.stdout.strip().split(";")[0]), out


def test_preempted_sbatch_job_is_requeued_and_ends_with_the_uninterrupted_weights(cluster, uninterrupted, tmp_path):
    """TERM once epoch 2 of 4 begins (3 epochs left to stop in): the requeued job ends as the uninterrupted srun job."""
    import keras

    job, out = submit(cluster, tmp_path, "preempted", EPOCHS)
    wait_for(out, rf"Epoch 2/{EPOCHS}", timeout=120)

    signalled = time.time()
    # What --signal=B:TERM@60 does before the time limit: TERM to the batch script.
    cluster.cancel(job, signal_name="TERM", batch=True)
    stopped = wait_for(out, r"stopped for preemption \(status 75\) at ([\d.]+)", timeout=60)
    resumed = wait_for(out, r"restart 1: training resumes from the backup at ([\d.]+)", timeout=120)
    record = cluster.wait_job(job, timeout=180)
    reference_dir, (reference, _) = uninterrupted

    text, reference_text = out.read_text(), reference.stdout
    print(f"\nsignal -> workers stopped: {float(stopped[1]) - signalled:.1f} s; "
          f"signal -> training resumed: {float(resumed[1]) - signalled:.1f} s")
    print("\n".join(line for line in text.splitlines() if "tfstrategy" in line or "final loss" in line))
    assert (record.state, record.exit_code) == ("COMPLETED", 0), text[-3000:]
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-3000:]
    assert [r.state for r in cluster.job_records(job)] == ["PENDING", "COMPLETED"]
    assert text.count("every worker stops at") == 2  # both workers, at the same step
    steps = _resumed(text)
    assert set(steps) == {"worker-0", "worker-1"} and len(set(steps.values())) == 1  # every worker, one committed step
    print(f"requeued: every worker resumed from {steps}")
    assert len(set(re.findall(r"every worker stops at ([^;]+);", text))) == 1
    assert finals(text) == finals(reference_text) and len(finals(text)) == 2  # same final loss and step count
    losses = re.findall(r"loss: (\S+)", text)
    assert set(losses) <= set(re.findall(r"loss: (\S+)", reference_text))  # every epoch's loss as uninterrupted
    weights = [keras.saving.load_model(path).get_weights()
               for path in (reference_dir / "model-0.keras", tmp_path / "preempted" / "model.keras")]
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def _requeued_with_tasks(cluster: SlurmCluster, job: int, out: Path, restarts: int, tasks: int) -> None:
    """Preempt the running job (TERM to its batch script, as ``--signal=B:TERM@60`` does), and while Slurm holds
    the requeued job back (``cred_expire``, 5 s here) give it ``tasks`` tasks on as many CPUs, as an operator, or a
    scheduler giving a job of ``--nodes=MIN-MAX`` what is free, does: the next run's allocation has that size
    (``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_CPUS_PER_NODE``), while the batch script keeps the submission's
    ``SLURM_NTASKS=2`` and ``SLURM_NTASKS_PER_NODE=2``."""
    cluster.cancel(job, signal_name="TERM", batch=True)
    wait_for_count(out, "the workers stopped for preemption (status 75)", restarts, timeout=90)
    cluster.wait_state(job, ["PENDING"], timeout=60, restarts=restarts)
    cluster.scontrol("hold", str(job))
    assert cluster.job_state(job) == "PENDING"  # held before it ran again: the new size is the next run's
    # A job of --ntasks-per-node keeps its tasks per node on NumTasks alone, and its CPUs without MinCPUsNode.
    cluster.scontrol("update", f"JobId={job}", f"NumTasks={tasks}", f"TasksPerNode={tasks}", f"MinCPUsNode={tasks}",
                     f"NumCPUs={tasks}")
    cluster.scontrol("release", str(job))


@pytest.mark.over_ceiling(seconds=240, reason="one sbatch job run three times (2, 1, then 2 tasks), each requeue held "
                                              "through Slurm's 5 s cred_expire: 50-86 s alone, 125 s once on a busy machine")
def test_a_requeued_job_goes_on_with_the_size_of_its_new_allocation_2_1_2(cluster, uninterrupted, tmp_path):
    """Issue 47 under Slurm: requeued on 1 task, then on 2 again, the job resumes each time from the newest step
    every worker of the run before committed, and ends with the uninterrupted job's model (one global batch: only
    the summation order differs, so within float32 rounding, not bit for bit)."""
    import keras

    job, out = submit(cluster, tmp_path, "resized", EPOCHS)
    wait_for(out, rf"Epoch 2/{EPOCHS}", timeout=120)
    _requeued_with_tasks(cluster, job, out, restarts=1, tasks=1)
    wait_for_count(out, "worker-0 resumes from committed step", 1, timeout=120)
    wait_for_count(out, f"Epoch 3/{EPOCHS}", 1, timeout=120)  # run 0 stopped in epoch 2
    _requeued_with_tasks(cluster, job, out, restarts=2, tasks=2)
    record = cluster.wait_job(job, timeout=240)
    text = out.read_text()
    reference_dir, (reference, _) = uninterrupted

    assert (record.state, record.exit_code) == ("COMPLETED", 0), text[-3000:]
    # Each run's srun started the tasks of its own allocation, not the submission's SLURM_NTASKS=2.
    assert re.findall(r"tfstrategy-sbatch: job \d+ run \d+ starts at \S+ with (\d+) task", text) == ["2", "1", "2"]
    runs = re.split(r"tfstrategy-sbatch: job \d+ run \d+ starts", text)[1:]
    assert len(runs) == 3, text[-3000:]
    (one,) = _resumed(runs[1]).values()  # one worker, from the step both workers committed
    two = _resumed(runs[2])
    assert set(two) == {"worker-0", "worker-1"} and set(two.values()) == {max(two.values())} and two["worker-0"] > one
    print(f"2 workers -> 1 from committed step {one} -> 2 from committed step {two['worker-0']}")
    (loss, steps), (reference_loss, reference_steps) = finals(runs[2])[0], finals(reference.stdout)[0]
    assert steps == reference_steps == EPOCHS * STEPS_PER_EPOCH
    assert loss == pytest.approx(reference_loss, abs=1e-5)
    weights = [keras.saving.load_model(path).get_weights()
               for path in (reference_dir / "model-0.keras", tmp_path / "resized" / "model.keras")]
    for a, b in zip(*weights, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _resumed(text: str) -> dict[str, int]:
    """The committed step each worker (``worker-<i>``) resumed from, from its one line."""
    return {worker: int(step) for worker, step in re.findall(r"tfstrategy: (worker-\d) resumes from committed step (\d+)",
                                                              text)}


def test_srun_worker_killed_at_its_save_another_job_is_refused_and_the_same_job_resumes_every_worker(
        cluster, uninterrupted, tmp_path):
    """No launcher: the workers agree among themselves. Worker 1 dies after writing its part of step 64 (epoch 2)."""
    import keras

    from tfstrategy.multiworker.coordinated import FAULT_ENV

    reference_dir, (reference, _) = uninterrupted
    assert reference.returncode == 0, reference.stderr[-3000:]
    backup = tmp_path / "backup"

    def srun(out: str, *exports: str) -> subprocess.CompletedProcess:
        return cluster.srun(["-n", "2", "--label", "--kill-on-bad-exit=1",
                             f"--export=ALL,{QUIET},TFSTRATEGY_BACKUP_DIR={backup}," + ",".join(exports),
                             sys.executable, EXAMPLE, "--out", str(tmp_path / out), "--epochs", str(EPOCHS)], timeout=300)

    killed = srun("killed.keras", "TFSTRATEGY_JOB_ID=train-1", f"{FAULT_ENV}=written@1:64")
    assert killed.returncode != 0 and "SIGKILL at written of the save of step 64" in killed.stdout + killed.stderr
    assert [json.loads((backup / f"worker-{w}" / "commit.json").read_text())["committed"] for w in (0, 1)] == [[32]] * 2

    other = srun("other.keras", "TFSTRATEGY_JOB_ID=")  # a new job: its id is slurm-<its job id>
    text = other.stdout + other.stderr
    assert other.returncode != 0
    assert re.search(r"BackupError: The backup cannot be used: worker 0: \S+/worker-0/commit.json belongs to job "
                     r"'train-1', not this job 'slurm-\d+'", text), text[-3000:]
    assert not (tmp_path / "other.keras").exists()

    resumed = srun("resumed.keras", "TFSTRATEGY_JOB_ID=train-1")
    text = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, text[-3000:]
    steps = _resumed(text)
    weights = [keras.saving.load_model(path).get_weights()
               for path in (reference_dir / "model-0.keras", tmp_path / "resumed.keras")]
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(*weights))
    print(f"\nsrun, worker 1 killed after writing step 64: every worker resumed from {steps}; difference {difference:.2e}")
    assert steps == {"worker-0": 32, "worker-1": 32}
    assert difference <= 1e-6
