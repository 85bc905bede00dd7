"""The private Slurm cluster of tests/slurm_cluster.py runs real jobs.

Needs Slurm (``.ci/install-slurm``) and root; without Slurm these tests fail.
"""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import slurm_cluster
from slurm_cluster import SlurmCluster, SlurmNotInstalledError

pytestmark = pytest.mark.multiprocess

PRINT_STEP = (
    "import os; print(os.environ['SLURM_PROCID'], os.environ['SLURM_STEP_ID'], os.environ['SLURM_JOB_NODELIST'], "
    "os.environ['SLURM_STEP_NODELIST'], os.environ['SLURM_NTASKS'], os.environ.get('SLURM_STEP_TASKS_PER_NODE'), "
    "os.environ.get('SLURM_TASKS_PER_NODE'))"
)


@pytest.fixture(scope="module")
def cluster():
    cluster = SlurmCluster()
    cluster.start(timeout=60)
    print(f"Slurm cluster up in {cluster.startup_seconds:.2f} s at {cluster.dir}")
    yield cluster
    conf = str(cluster.conf)
    cluster.stop()
    assert slurm_cluster._processes_with_env("SLURM_CONF", conf) == []


def write_script(cluster: SlurmCluster, name: str, body: str) -> Path:
    path = cluster.dir / name
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    return path


def step_lines(stdout: str) -> list[list[str]]:
    return sorted(line.split() for line in stdout.splitlines() if line.strip())


def test_srun_two_tasks_get_procid_0_and_1(cluster):
    result = cluster.srun(["-n", "2", "--oversubscribe", sys.executable, "-c", PRINT_STEP], timeout=60)

    assert result.returncode == 0, result.stderr
    lines = step_lines(result.stdout)
    assert [line[0] for line in lines] == ["0", "1"]
    for _, step_id, job_nodes, step_nodes, ntasks, step_tasks_per_node, tasks_per_node in lines:
        assert step_id == "0"
        assert job_nodes == step_nodes == cluster.node
        assert ntasks == "2"
        assert step_tasks_per_node == tasks_per_node == "2"


def test_two_sruns_run_at_once(cluster):
    results = []
    body = f"import time; time.sleep(3); {PRINT_STEP}"

    def run():
        results.append(cluster.srun(["-n", "2", "--oversubscribe", sys.executable, "-c", body], timeout=60))

    began = time.monotonic()
    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began

    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert [[line[0] for line in step_lines(r.stdout)] for r in results] == [["0", "1"], ["0", "1"]]
    assert elapsed < 5.5, f"the two 3 s steps took {elapsed:.1f} s: they ran one after the other"


def test_srun_four_tasks_on_two_cpus_with_overcommit(cluster):
    result = cluster.srun(["-n", "4", "--overcommit", sys.executable, "-c", PRINT_STEP], timeout=60)

    assert result.returncode == 0, result.stderr
    assert [line[0] for line in step_lines(result.stdout)] == ["0", "1", "2", "3"]


def test_concurrent_steps_get_disjoint_reserved_ports(cluster):
    results = []
    body = "import os, time; time.sleep(2); print(os.environ['SLURM_STEP_RESV_PORTS'])"

    def run():
        results.append(cluster.srun(["-n", "2", sys.executable, "-c", body], timeout=60))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    ranges = []
    for result in results:
        assert result.returncode == 0, result.stderr
        (ports,) = set(result.stdout.split())  # both tasks of a step see the same range
        low, _, high = ports.partition("-")
        ranges.append(set(range(int(low), int(high or low) + 1)))
    assert len(ranges[0]) == len(ranges[1]) == 3  # tasks on the node + 1
    assert not ranges[0] & ranges[1]


def test_sbatch_job_completes_and_failure_is_recorded(cluster):
    ok = write_script(cluster, "ok.sh", f"""\
        #SBATCH -n 2
        srun {sys.executable} -c "{PRINT_STEP}"
        """)
    failing = write_script(cluster, "fail.sh", "exit 3\n")

    ok_id = cluster.sbatch(ok, "-o", str(cluster.dir / "ok-%j.out"))
    fail_id = cluster.sbatch(failing)
    ok_record = cluster.wait_job(ok_id, timeout=60)
    fail_record = cluster.wait_job(fail_id, timeout=60)

    assert (ok_record.state, ok_record.exit_code) == ("COMPLETED", 0)
    assert [line[0] for line in step_lines((cluster.dir / f"ok-{ok_id}.out").read_text())] == ["0", "1"]
    assert (fail_record.state, fail_record.exit_code) == ("FAILED", 3)


def test_requeued_job_runs_again_with_restart_count_1(cluster):
    script = write_script(cluster, "requeue.sh", """\
        echo "restart=${SLURM_RESTART_COUNT:-0}"
        if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then sleep 300; fi
        """)
    out = cluster.dir / "requeue.out"
    job_id = cluster.sbatch(script, "--requeue", "--open-mode=append", "-o", str(out))
    cluster.wait_state(job_id, ["RUNNING"], timeout=30, restarts=0)
    deadline = time.monotonic() + 10
    while "restart=0" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)

    cluster.requeue(job_id)
    record = cluster.wait_job(job_id, timeout=60)

    assert (record.state, record.exit_code) == ("COMPLETED", 0)
    assert [r.state for r in cluster.job_records(job_id)] == ["PENDING", "COMPLETED"]
    lines = [line for line in out.read_text().splitlines() if line.startswith("restart=")]
    assert lines == ["restart=0", "restart=1"]
    assert "DUE TO JOB REQUEUE" in out.read_text()


def test_scancel_signal_reaches_the_batch_shell(cluster):
    script = write_script(cluster, "trap.sh", """\
        trap 'echo "got TERM"; exit 0' TERM
        echo started
        sleep 300 & wait
        """)
    out = cluster.dir / "trap.out"
    job_id = cluster.sbatch(script, "-o", str(out))
    cluster.wait_state(job_id, ["RUNNING"], timeout=30)
    deadline = time.monotonic() + 10
    while "started" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.1)

    cluster.cancel(job_id, signal_name="TERM", batch=True)
    record = cluster.wait_job(job_id, timeout=30)

    assert "got TERM" in out.read_text()
    assert (record.state, record.exit_code) == ("COMPLETED", 0)


def test_sbatch_signal_before_time_limit_reaches_the_batch_shell(cluster):
    # --signal=B:TERM@50 with a 1 minute limit: due after 10 s; slurmctld checks
    # time limits every 30 s, so it arrives 10-40 s after the start.
    script = write_script(cluster, "warn.sh", """\
        trap 'echo "got TERM restart=${SLURM_RESTART_COUNT:-0}"; exit 0' TERM
        sleep 300 & wait
        """)
    out = cluster.dir / "warn.out"
    job_id = cluster.sbatch(script, "--requeue", "--time=1", "--signal=B:TERM@50", "-o", str(out))

    record = cluster.wait_job(job_id, timeout=90)

    # slurmstepd also writes "*** JOB <id> ON <node> CANCELLED AT ..." for a TERM
    # (the job goes on and ends COMPLETED), and at times "failed signal 18" (the
    # SIGCONT it sends with TERM, when the shell has exited already).
    lines = out.read_text().splitlines()
    assert "got TERM restart=0" in lines
    assert all(line.startswith("slurmstepd-") for line in lines if line != "got TERM restart=0"), lines
    assert (record.state, record.exit_code) == ("COMPLETED", 0)


def test_start_fails_clearly_without_slurm(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(slurm_cluster, "_SBIN_DIRS", ("/nonexistent",))

    with pytest.raises(SlurmNotInstalledError, match="install-slurm"):
        SlurmCluster().start()
