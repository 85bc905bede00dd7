"""Coordinated backups with real workers and real kills: every worker resumes from one committed step.

Each fault runs `tfstrategy launch -n 2` on tests/workers/fit_worker.py (8 steps an epoch, 5 epochs,
a backup at each epoch's end: steps 8, 16, ..., 40). A worker is SIGKILLed at a named point of its
save, the backup is damaged between two runs, or the job gets SIGTERM. The kills run in chains: one job with
``--max-restarts K`` kills a worker in a save on each of its first K starts (``fit_worker.py --faults``,
the test-only fault of ``TFSTRATEGY_TEST_BACKUP_FAULT`` armed on every start), so K kills cost K + 1
starts, not 2K; each start records the step every worker resumed from. Each test asserts the step
EVERY worker resumed from after its kill and the final weights against an uninterrupted run (within
1e-6), or the one-line error naming the file. The policy itself is tested without processes in
tests/multiworker/test_commit.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, free_ports, node_port_range
from tfstrategy.multiworker.coordinated import FAULT_ENV

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.extended]

FIT_WORKER = str(ROOT / "tests" / "workers" / "fit_worker.py")
LOOP_WORKER = str(ROOT / "tests" / "workers" / "loop_worker.py")
TOLERANCE = 1e-6
#: fit_worker.py's run in this module: 5 epochs of 8 steps, a backup at each epoch's end. A chain of three kills
#: after the agreement may end with a resume from step 32: a fifth epoch is left to train.
EPOCHS, STEPS_PER_EPOCH = 5, 8
FINAL_STEP = EPOCHS * STEPS_PER_EPOCH


class Launch:
    """One `tfstrategy launch` in its own process group, bounded in time, everything it started killed after."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
        self.process = subprocess.Popen([sys.executable, "-m", "tfstrategy", "launch", *args], cwd=ROOT, env=env,
                                        text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        try:
            out, err = self.process.communicate(timeout=timeout)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.communicate()
        return self.process.returncode, out, err


def launch(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str, str]:
    return Launch(*args, env=env).finish(timeout)


def fit(out: Path, backup: Path, *extra: str, restarts: int = 1, env: dict[str, str] | None = None):
    out.mkdir(parents=True, exist_ok=True)
    return launch("-n", "2", "--timeout", "120", "--max-restarts", str(restarts), "--backup-dir", str(backup), "--",
                  sys.executable, FIT_WORKER, "--out", str(out), "--epochs", str(EPOCHS), *extra, env=env)


def results(out: Path) -> list[dict]:
    return [json.loads((out / f"worker-{i}.json").read_text()) for i in range(2)]


def weight_difference(out: Path, reference: dict) -> float:
    """The largest |difference| of any final weight of any worker to the uninterrupted run."""
    worst = 0.0
    for result in results(out):
        for got, want in zip(result["weights"], reference["weights"]):
            worst = max(worst, float(np.max(np.abs(np.array(got) - np.array(want)))))
    return worst


def resumed_steps(out: Path) -> list[int]:
    return [result["resumed"]["step"] for result in results(out)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("uninterrupted")
    code, _, err = launch("-n", "2", "--timeout", "120", "--", sys.executable, FIT_WORKER, "--out", str(out),
                          "--epochs", str(EPOCHS))
    assert code == 0, err[-3000:]
    first, second = results(out)
    assert first["weights"] == second["weights"] and first["steps"] == FINAL_STEP
    return first


# --- a kill at each point of a save, several kills in one job ----------------------------------


@dataclass
class Chain:
    """One job whose worker is killed in a save on each of its first ``len(faults)`` starts."""

    faults: list[str]
    code: int
    out: str
    err: str
    results: Path
    backup: Path
    pid: int
    during: object = None

    def started(self, start: int) -> str:
        """What the launcher said from the start of ``start`` (0: the first) to the next start."""
        starts = re.split(r"(?m)^(?=tfstrategy launch: starting 2 worker\(s\) on )", self.err)[1:]
        assert len(starts) == len(self.faults) + 1, self.err[-3000:]
        return starts[start]

    def records(self, start: int) -> list[dict]:
        """Each worker's record of ``start``: the point it resumed from and the fault it armed."""
        return [json.loads((self.results / f"attempt-{start}-worker-{i}.json").read_text()) for i in range(2)]


def run_chain(base: Path, faults: list[str], *extra: str, worker: str = FIT_WORKER, env: dict[str, str] | None = None,
              during=None) -> Chain:
    """``launch --max-restarts len(faults)`` with ``--faults``; ``during(job)`` runs while the job runs."""
    (base / "out").mkdir(parents=True)
    job = Launch("-n", "2", "--timeout", "120", "--max-restarts", str(len(faults)), "--backup-dir", str(base / "backup"),
                 "--", sys.executable, worker, "--out", str(base / "out"), "--faults", ",".join(faults), *extra, env=env)
    seen = None
    try:
        seen = during(job, base / "backup") if during else None
    finally:
        code, out, err = job.finish(timeout=600)
    return Chain(faults, code, out, err, base / "out", base / "backup", job.process.pid, seen)


def second_job(first: Launch, backup: Path) -> tuple[int, str]:
    """A second launch on ``backup`` while the first job holds it: its exit status and its output."""
    lock = backup / "launch-node-0.lock"
    while not (lock.exists() and lock.read_text()):  # the first launcher holds the directory
        assert first.process.poll() is None
        time.sleep(0.05)
    code, _, err = launch("-n", "2", "--max-restarts", "1", "--backup-dir", str(backup), "--", sys.executable,
                          FIT_WORKER, "--out", str(backup.parent / "b"), env={"TFSTRATEGY_JOB_ID": "job-b"}, timeout=60)
    return code, err


#: The kills of the one chain: first before the agreement (each start resumes from 8 and is killed in its save of 16
#: again), then after it (the step killed is the one after the step the previous start resumed from).
CUT_SHORT = ["before@1", "weights@1", "renamed@1", "written@1"]
AROUND_THE_RECORD = ["agreed@1", "committed@1", "agreed@0"]


@pytest.fixture(scope="module")
def cut_short(tmp_path_factory) -> Chain:
    """One job, a kill on each of its first 7 starts (8 starts, not the 9 of a job for each group of kills); a second
    job tries the directory meanwhile."""
    return run_chain(tmp_path_factory.mktemp("cut-short"), CUT_SHORT + AROUND_THE_RECORD, "--epochs", str(EPOCHS),
                     env={"TFSTRATEGY_JOB_ID": "job-a"}, during=second_job)


KILLS = [
    # start, point, worker, the steps every worker may resume from: the step whose save was killed
    # ("killed"), the committed one before it ("previous"), or either, the same on both
    pytest.param(0, "before", 1, {"previous"}, id="before-the-weights-file"),
    pytest.param(1, "weights", 1, {"previous"}, id="weights-file-written-not-renamed"),
    pytest.param(2, "renamed", 1, {"previous"}, id="between-weights-and-sidecar"),
    pytest.param(3, "written", 1, {"previous"}, id="part-written-before-agreement"),
    # worker 0 writes its record of the step unless the launcher stops it first: that step or the one before
    pytest.param(4, "agreed", 1, {"previous", "killed"}, id="agreed-before-the-record"),
    pytest.param(5, "committed", 1, {"killed"}, id="after-the-record"),
    pytest.param(6, "agreed", 0, {"previous", "killed"}, id="chief-agreed-before-the-record"),
]


@pytest.mark.over_ceiling(seconds=450, reason="its module fixtures are the uninterrupted run and one job with a kill on "
                                              "each of 7 starts (8 starts of 2 TensorFlow workers, instead of 2 starts "
                                              "a kill)")
@pytest.mark.parametrize(("start", "point", "worker", "allowed"), KILLS)
def test_a_worker_killed_during_its_save_resumes_with_every_worker_from_one_committed_step(
        reference, cut_short, start, point, worker, allowed):
    job = cut_short
    assert job.code == 0, job.err[-3000:]
    armed = [record["fault"] for record in job.records(start)]
    assert armed[0] == armed[1] and armed[0][:2] == [point, worker], armed
    step = armed[0][2]
    if start < len(CUT_SHORT):
        assert step == 16  # every start resumed from 8, and was killed in its save of 16 again
    assert f"[worker {worker}] tfstrategy: test fault: SIGKILL at {point} of the save of step {step}" in job.err + job.out
    assert f"worker {worker} was killed by SIGKILL" in job.started(start)
    assert f"(restart {start + 1} of {len(job.faults)})" in job.started(start + 1).splitlines()[0]
    steps = [record["resumed"]["step"] for record in job.records(start + 1)]
    print(f"\nkill at {point} of the save of step {step} on worker {worker}: every worker resumed from step {steps}")
    named = {"killed": step, "previous": step - STEPS_PER_EPOCH}
    assert len(set(steps)) == 1 and steps[0] in {named[which] for which in allowed}
    difference = weight_difference(job.results, reference)
    print(f"after {len(job.faults)} kills: final-weight difference {difference:.2e}")
    assert all(result["restart"] == len(job.faults) and result["steps"] == FINAL_STEP for result in results(job.results))
    assert difference <= TOLERANCE


def test_a_second_job_on_the_same_backup_dir_is_refused_naming_the_job_holding_it(reference, cut_short):
    """Tried while the first job (the cut_short chain, job 'job-a') holds the directory; that job ends as uninterrupted."""
    code, err = cut_short.during
    backup = cut_short.backup
    assert code == 2
    assert err.count("\n") == 1 and re.match(
        rf"tfstrategy launch: error: Received --backup-dir {backup}: {backup} is in use by job 'job-a' \(tfstrategy "
        rf"launch pid {cut_short.pid} on \S+\); this is job 'job-b'", err), err
    assert cut_short.code == 0, cut_short.err[-3000:]
    assert weight_difference(cut_short.results, reference) <= TOLERANCE


@pytest.fixture(scope="module")
def loop_reference(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("loop-uninterrupted")
    code, _, err = launch("-n", "2", "--timeout", "120", "--", sys.executable, LOOP_WORKER, "--out", str(out))
    assert code == 0, err[-3000:]
    first, second = results(out)
    assert first["weights"] == second["weights"] and first["steps"] == 24
    return first


@pytest.fixture(scope="module")
def loop_chain(tmp_path_factory) -> Chain:
    """make_train_step + TrainStep.backup(save_freq=4): commits at steps 4, 8, 12, ... (epoch 1 batch 4 is step 12)."""
    return run_chain(tmp_path_factory.mktemp("loop"), ["written@1:12", "committed@1:12"], "--save-freq", "4",
                     worker=LOOP_WORKER)


@pytest.mark.over_ceiling(seconds=240, reason="its module fixtures are the uninterrupted loop and one job with a kill "
                                              "on each of 2 starts (3 starts of 2 TensorFlow workers)")
@pytest.mark.parametrize(("start", "point", "resumed"), [
    pytest.param(0, "written", (8, 0, 8), id="part-written-before-agreement"),  # step 8: epoch 0 done
    pytest.param(1, "committed", (12, 1, 4), id="after-the-record"),  # after resuming from 8, the save of 12 again
])
def test_a_custom_loop_worker_killed_during_its_save_resumes_with_every_worker_from_one_committed_step(
        loop_reference, loop_chain, start, point, resumed):
    job = loop_chain
    assert job.code == 0, job.err[-3000:]
    assert f"test fault: SIGKILL at {point} of the save of step 12" in job.err + job.out
    assert "worker 1 was killed by SIGKILL" in job.started(start)
    points = [tuple(record["resumed"][key] for key in ("step", "epoch", "batch")) for record in job.records(start + 1)]
    difference = weight_difference(job.results, loop_reference)
    print(f"\ncustom loop, kill at {point}: every worker resumed from (step, epoch, batch) {points}; "
          f"final-weight difference {difference:.2e}")
    assert points == [resumed, resumed]
    assert difference <= TOLERANCE


# --- a damaged backup between two runs ----------------------------------------------------------


@pytest.fixture(scope="module")
def interrupted_backup(tmp_path_factory) -> Path:
    """A backup with steps 16 and 8 committed on both workers: worker 0 killed before saving step 24, no restart."""
    base = tmp_path_factory.mktemp("interrupted")
    code, _, err = fit(base / "out", base / "backup", restarts=0, env={FAULT_ENV: "before@0:24"})
    assert code != 0 and "test fault: SIGKILL at before of the save of step 24" in err, err[-3000:]
    for worker in (0, 1):
        record = json.loads((base / "backup" / f"worker-{worker}" / "commit.json").read_text())
        assert record["committed"] == [16, 8]
    return base / "backup"


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def unparsable_record(backup: Path, worker: int) -> None:
    (backup / f"worker-{worker}" / "commit.json").write_text("{")


DAMAGE = [
    # what is done to the backup, the step every worker resumes from, what the output says. Two damages that
    # each leave step 16 loadable by every worker share one run: worker 1 truncated (it loads worker 0's part),
    # worker 0's record unparsable (it takes the steps worker 1 committed).
    pytest.param(lambda b: [truncate(b / f"worker-{w}" / "step-16.weights.h5") for w in (0, 1)], 8,
                 [r"worker-1 does not resume from committed step 16: \S+/worker-1/step-16.weights.h5 \(step 16\) has "
                  r"\d+ bytes; its sidecar says \d+: it is truncated"], id="step-16-truncated-on-both"),
    pytest.param(lambda b: (truncate(b / "worker-1" / "step-16.weights.h5"), unparsable_record(b, 0)), 16,
                 [r"worker-1: \S+/worker-1/step-16.weights.h5 \(step 16\) has \d+ bytes; .* Loading the same step from "
                  r"\S+/worker-0/step-16.weights.h5 instead",
                  r"The commit record \S+/worker-0/commit.json cannot be read \(Expecting property name.*\); it is "
                  r"truncated or not written by tfstrategy. It is not loaded. Using the steps the other workers"],
                 id="step-16-truncated-on-one-and-a-record-unparsable"),
    pytest.param(lambda b: shutil.rmtree(b / "worker-1"), 16,
                 [r"worker-1: \S+/worker-1/step-16.json is missing: this worker has no backup of step 16. Loading the "
                  r"same step from \S+/worker-0/step-16.weights.h5"], id="worker-directory-deleted"),
]


@pytest.mark.parametrize(("damage", "step", "said"), DAMAGE)
def test_a_damaged_backup_is_never_loaded_and_every_worker_resumes_from_one_step(
        reference, interrupted_backup, tmp_path, damage, step, said):
    backup = tmp_path / "backup"
    shutil.copytree(interrupted_backup, backup)
    damage(backup)
    code, out, err = fit(tmp_path / "out", backup, restarts=0)
    assert code == 0, err[-3000:]
    for line in said:
        assert re.search(line, out + err), (line, (out + err)[-3000:])
    steps = resumed_steps(tmp_path / "out")
    difference = weight_difference(tmp_path / "out", reference)
    print(f"\ndamage: every worker resumed from step {steps}; final-weight difference {difference:.2e}")
    assert steps == [step, step]
    assert difference <= TOLERANCE


def test_a_backup_no_worker_can_load_stops_every_worker_with_one_line_naming_the_file(interrupted_backup, tmp_path):
    backup = tmp_path / "backup"
    shutil.copytree(interrupted_backup, backup)
    shutil.rmtree(backup / "worker-1")
    for step in (8, 16):
        truncate(backup / "worker-0" / f"step-{step}.weights.h5")
    code, out, err = fit(tmp_path / "out", backup, restarts=0)
    assert code == 1
    # the launcher's headline is the worker's one error, naming its file
    error = next(line for line in err.splitlines() if line.startswith("tfstrategy launch: worker "))
    assert re.match(r"tfstrategy launch: worker \d raised tfstrategy\.errors\.BackupError: ", error), error
    assert "BackupError: Steps 16, 8 were committed, but no step can be loaded by every worker" in error
    assert re.search(r"step 16: \S+/worker-\d/step-16\.(weights\.h5 \(step 16\) has \d+ bytes|json is missing)", error)
    assert not (tmp_path / "out" / "worker-0.json").exists()  # nothing trained


# --- another user's backup, SIGTERM without --backup-dir ---------------------------------------


@pytest.mark.parametrize("kind", ["foreign-owned", "world-writable"])
def test_a_backup_dir_of_another_user_or_writable_by_others_is_refused_in_one_line(tmp_path, kind):
    backup = tmp_path / "backup"
    (backup / "worker-0").mkdir(parents=True, mode=0o700)
    (backup / "worker-0" / "commit.json").write_text('{"format": 1, "job_id": "x", "workers": 2, "committed": [100]}')
    if kind == "foreign-owned":
        import pwd

        if os.geteuid() != 0:
            pytest.fail("this test chowns to another user and needs root (CI runs as root)")
        os.chown(backup / "worker-0", pwd.getpwnam("nobody").pw_uid, -1)
    else:
        os.chmod(backup, 0o777)
    code, _, err = launch("-n", "2", "--max-restarts", "1", "--backup-dir", str(backup), "--", sys.executable,
                          FIT_WORKER, "--out", str(tmp_path), timeout=60)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"tfstrategy launch: error: Received --backup-dir {backup}: Refusing backup {backup}")
    assert ("owned by uid" if kind == "foreign-owned" else "mode 0777 lets other users write it") in err


def test_sigterm_without_backup_dir_keeps_the_backup_and_its_resume_command_ends_like_an_uninterrupted_run(
        reference, tmp_path):
    """fit_worker.py with preemption_callbacks(): SIGTERM while every worker waits at the beginning of epoch 2 for it.

    Each worker goes on once it got the signal; all stop after epoch 2's first batch, keeping epoch 1's backup (step 8).
    """
    for name in ("preempted", "resumed"):
        (tmp_path / name).mkdir()
    run = Launch("-n", "2", "--timeout", "120", "--max-restarts", "1", "--grace", "60", "--", sys.executable, FIT_WORKER,
                 "--out", str(tmp_path / "preempted"), "--epochs", str(EPOCHS), "--preemption", "--hold-for-sigterm", "1")
    while True:
        line = run.process.stdout.readline()
        assert line, "the job ended before epoch 2"
        if line.startswith("[worker 0] holding for SIGTERM at epoch 1"):
            break
    run.process.send_signal(signal.SIGTERM)
    code, _, err = run.finish(timeout=120)
    assert code == 75, err[-3000:]
    kept = re.search(r"tfstrategy launch: the job's backup is kept in (\S+) \(exit status 75\); resume from it with: "
                     r"(tfstrategy launch .*)", err)
    assert kept, err[-3000:]
    backup, command = Path(kept[1]), kept[2].split()
    assert backup.is_dir() and oct(backup.stat().st_mode & 0o777) == "0o700"
    assert command[command.index("--backup-dir") + 1] == str(backup)
    assert "every worker exited with status 75 (preempted, saved); so does the launcher" in err

    command[command.index("--out") + 1] = str(tmp_path / "resumed")
    code, out, err = launch(*command[2:])
    assert code == 0, err[-3000:]
    steps = re.findall(r"\[worker (\d)\] tfstrategy: worker-\d resumes from committed step (\d+)", out + err)
    assert sorted(worker for worker, _ in steps) == ["0", "1"] and len({step for _, step in steps}) == 1
    difference = weight_difference(tmp_path / "resumed", reference)
    print(f"\nSIGTERM without --backup-dir: every worker resumed from step {steps[0][1]}; difference {difference:.2e}")
    assert all(result["steps"] == FINAL_STEP for result in results(tmp_path / "resumed"))
    assert difference <= TOLERANCE
    shutil.rmtree(backup)


def test_every_worker_of_two_loopback_nodes_resumes_from_one_committed_step(reference, tmp_path):
    """--nnodes 2 on 127.0.0.2/3, one worker each: worker 1 (node 1) killed after the agreement of step 16."""
    master = f"127.0.0.2:{free_ports(1, '127.0.0.2')[0]}"
    (tmp_path / "out").mkdir()
    env = {"TFSTRATEGY_LAUNCH_SECRET": "tfstrategy-test-secret-" + uuid.uuid4().hex, FAULT_ENV: "agreed@1:16"}
    nodes = [Launch("--nnodes", "2", "--node-rank", str(rank), "--master", master, "--node-address", f"127.0.0.{rank + 2}",
                    *node_port_range(rank),
                    "-n", "1", "--timeout", "300", "--max-restarts", "1", "--backup-dir", str(tmp_path / "backup"),
                    "--", sys.executable, FIT_WORKER, "--out", str(tmp_path / "out"), "--epochs", str(EPOCHS), env=env)
             for rank in (0, 1)]
    ends = [node.finish(timeout=600) for node in nodes]
    assert [code for code, _, _ in ends] == [0, 0], ends[0][2][-2000:] + ends[1][2][-2000:]
    steps = resumed_steps(tmp_path / "out")
    difference = weight_difference(tmp_path / "out", reference)
    print(f"\n--nnodes 2, kill after agreement: every worker resumed from step {steps}; difference {difference:.2e}")
    assert len(set(steps)) == 1 and steps[0] in (8, 16)
    assert difference <= TOLERANCE
