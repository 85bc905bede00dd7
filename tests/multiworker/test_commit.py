"""The commit rule of coordinated backups without processes: records, parts, the step to resume, identity, lock, trust.

Faults with real workers and real kills are in tests/multiworker/test_coordinated_faults.py.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tfstrategy.errors import BackupError, BackupLockedError, LaunchError, SaveError, UntrustedBackupError
from tfstrategy.launch.backup_dir import JobBackup, checked_backup_dir, resume_command, run_with_backup
from tfstrategy.launch.options import LaunchOptions
from tfstrategy.launch.states import Outcome, RunResult
from tfstrategy.multiworker import commit

JOB = "job-a"


def write_part(directory: Path, step: int, payload: bytes = b"weights", *, job: str = JOB, epoch: int = 1) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    weights = directory / commit.part_name(step)
    weights.write_bytes(payload)
    size, digest = commit.file_digest(weights)
    part = commit.Part(job_id=job, step=step, epoch=epoch, batch=0, size=size, sha256=digest)
    commit.atomic_write_text(directory / commit.sidecar_name(step), json.dumps(part.to_json()))
    return weights


# --- records and parts --------------------------------------------------------------------


def test_a_record_round_trips(tmp_path):
    commit.write_record(tmp_path, commit.CommitRecord(job_id=JOB, workers=2, steps=(16, 8)))
    assert commit.read_record(tmp_path / "commit.json") == commit.CommitRecord(job_id=JOB, workers=2, steps=(16, 8))
    assert [p.name for p in tmp_path.iterdir()] == ["commit.json"]  # no temporary file left


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("{", "cannot be read (Expecting property name", id="truncated"),
        pytest.param("", "cannot be read (Expecting value", id="empty"),
        pytest.param("[1]", "holds list", id="not-an-object"),
        pytest.param('{"format": 9, "job_id": "a", "workers": 2, "committed": [1]}', "has format 9", id="other-format"),
        pytest.param('{"format": 1, "job_id": "", "workers": 2, "committed": [1]}', "job_id=''", id="no-job"),
        pytest.param('{"format": 1, "job_id": "a", "workers": 2, "committed": [8, 16]}', "newest first", id="order"),
        pytest.param('{"format": 1, "job_id": "a", "workers": 2, "committed": [100, 8, 4]}', "one or two", id="three"),
        pytest.param('{"format": 1, "job_id": "a", "workers": -1, "committed": [1]}', "workers=-1", id="workers"),
    ],
)
def test_a_bad_record_is_refused_naming_the_file(tmp_path, text, message):
    path = tmp_path / "commit.json"
    path.write_text(text)
    with pytest.raises(BackupError) as error:
        commit.read_record(path)
    assert str(path) in str(error.value) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_whole_part_of_this_job_is_accepted(tmp_path):
    write_part(tmp_path, 16)
    assert commit.check_part(tmp_path, 16, JOB).step == 16


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(lambda d: (d / "step-16.weights.h5").write_bytes(b"weig"), "has 4 bytes; its sidecar says 7: it is "
                     "truncated", id="truncated"),
        pytest.param(lambda d: (d / "step-16.weights.h5").write_bytes(b"WEIGHTS"), "does not match the sha256",
                     id="altered"),
        pytest.param(lambda d: (d / "step-16.weights.h5").unlink(), "cannot be read (No such file", id="weights-missing"),
        pytest.param(lambda d: (d / "step-16.json").unlink(), "step-16.json is missing: this worker has no backup of "
                     "step 16", id="sidecar-missing"),
        pytest.param(lambda d: (d / "step-16.json").write_text('{"format": 1'), "cannot be read", id="sidecar-torn"),
    ],
)
def test_a_damaged_part_is_never_loaded_and_the_error_names_file_and_step(tmp_path, damage, message):
    write_part(tmp_path, 16)
    damage(tmp_path)
    with pytest.raises(BackupError) as error:
        commit.check_part(tmp_path, 16, JOB)
    assert message in str(error.value) and "step 16" in str(error.value) and str(tmp_path) in str(error.value)


def test_a_part_of_another_job_is_refused(tmp_path):
    write_part(tmp_path, 16, job="job-b")
    with pytest.raises(BackupError, match="belongs to job 'job-b', not this job 'job-a'; step 16 is not loaded"):
        commit.check_part(tmp_path, 16, JOB)


# --- which step ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("committed", "loadable", "step"),
    [
        pytest.param([[], []], [[], []], None, id="nothing-committed"),
        pytest.param([[16, 8], [16, 8]], [[True, True], [True, True]], 16, id="both-have-the-newest"),
        # worker 1 died before writing its record of 16: 16 was committed (worker 0 says so) and both have it
        pytest.param([[16, 8], [8]], [[True, True], [True, True]], 16, id="one-record-behind"),
        # worker 1's part of 16 is truncated: every worker falls back to 8 together
        pytest.param([[16, 8], [16, 8]], [[True, True], [False, True]], 8, id="newest-damaged-on-one"),
        pytest.param([[16, 8], []], [[True, True], [True, True]], 16, id="record-lost-on-one"),
        # elastic: worker 2 comes back with the backup of an older group (steps 8 and 4); it loads 16 from a peer's
        # directory on the shared file system, and its older steps never win
        pytest.param([[16, 12], [16, 12], [8, 4]], [[True] * 4, [True] * 4, [True, True, True, True]], 16,
                     id="elastic-a-node-back-with-a-stale-backup"),
        # elastic: a group of 3 resumes what a group of 2 committed (the new worker 2 has no record, loads a peer's)
        pytest.param([[16, 8], [16, 8], []], [[True, True], [True, True], [True, True]], 16, id="elastic-grown-by-one"),
    ],
)
def test_every_worker_resumes_from_the_newest_step_all_can_load(committed, loadable, step):
    assert commit.choose_resume(committed, loadable, [None] * len(committed)).step == step


def test_committed_steps_no_worker_can_all_load_stop_every_worker():
    with pytest.raises(BackupError, match=r"Steps 16, 8 were committed, but no step can be loaded by every worker "
                                          r"\(workers without a whole part of step 16: 1\)"):
        commit.choose_resume([[16, 8], [16, 8]], [[True, True], [False, False]], [None, None])


def test_a_refused_worker_stops_every_worker_naming_it():
    with pytest.raises(BackupError, match="worker 1: another job's"):
        commit.choose_resume([[16], [16]], [[True], [True]], [None, "another job's"])


# --- identity and lock --------------------------------------------------------------------


def test_job_identity_prefers_the_variable_then_slurm_then_the_directory(tmp_path):
    assert commit.job_identity({"TFSTRATEGY_JOB_ID": "x", "SLURM_JOB_ID": "7"}, tmp_path) == ("x", "TFSTRATEGY_JOB_ID")
    assert commit.job_identity({"SLURM_JOB_ID": "7"}, tmp_path) == ("slurm-7", "SLURM_JOB_ID")
    first = commit.job_identity({}, tmp_path)
    assert first == commit.job_identity({}, tmp_path)  # a restart on the same directory is the same job
    assert first[0].startswith("dir-") and oct((tmp_path / "job.json").stat().st_mode & 0o777) == "0o600"


LOCK_HOLDER = """
import sys, time
from pathlib import Path
from tfstrategy.multiworker.commit import DirectoryLock
DirectoryLock(Path(sys.argv[1]), "job-a").acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_job_is_refused_naming_the_job_and_pid_holding_the_directory(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(BackupLockedError) as error:
            commit.DirectoryLock(tmp_path, "job-b").acquire()
        assert f"is in use by job 'job-a' (worker pid {holder.pid} on " in str(error.value)
        assert "this is job 'job-b'" in str(error.value)
    finally:
        holder.kill()
        holder.wait()
    lock = commit.DirectoryLock(tmp_path, "job-b")
    lock.acquire()  # the kernel released the dead holder's lock
    lock.release()


# --- trust --------------------------------------------------------------------------------

NOBODY = pwd.getpwnam("nobody").pw_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (CI runs as root)")
def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    foreign = tmp_path / "backup"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, NOBODY, -1)
    with pytest.raises(UntrustedBackupError, match=rf"Refusing backup {foreign}: it is owned by uid {NOBODY} \(nobody\)"):
        commit.check_trusted(foreign)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_directory_or_file_others_can_write_is_refused(tmp_path, mode):
    for path in (tmp_path / "dir", tmp_path / "file"):
        path.mkdir() if path.name == "dir" else path.write_text("x")
        os.chmod(path, mode)
        with pytest.raises(UntrustedBackupError, match=f"mode {mode:04o} lets other users write it. Run chmod go-w"):
            commit.check_trusted(path)


def test_a_symlink_is_refused_and_new_directories_are_private(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UntrustedBackupError, match="symbolic link"):
        commit.check_trusted(tmp_path / "link")
    commit.make_private_dir(tmp_path / "a" / "b" / "worker-0")
    for path in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "worker-0"):
        assert path.stat().st_mode & 0o777 == 0o700


def test_backup_callbacks_refuse_a_world_writable_directory_and_unknown_options(tmp_path):
    from tfstrategy import backup_callbacks

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UntrustedBackupError, match=f"Refusing backup {shared}: mode 0777"):
        backup_callbacks(shared)
    with pytest.raises(SaveError, match="Received backup option.s. save_every; expected save_freq"):
        backup_callbacks(tmp_path / "ok", save_every=3)


# --- the launcher's side ----------------------------------------------------------------------


def _launch_options(*argv):
    from tfstrategy.cli import build_parser
    from tfstrategy.cli.launch import options_from_args

    return options_from_args(build_parser().parse_args(["launch", *argv]))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root (CI runs as root)")
def test_launch_refuses_a_foreign_or_world_writable_backup_dir_in_one_line(tmp_path):
    foreign, shared = tmp_path / "foreign", tmp_path / "shared"
    foreign.mkdir()
    os.chown(foreign, NOBODY, -1)
    shared.mkdir()
    (shared / "worker-0").mkdir()
    os.chmod(shared / "worker-0", 0o777)
    for directory, message in ((foreign, "it is owned by uid"), (shared / "worker-0", "mode 0777 lets other users")):
        with pytest.raises(LaunchError) as error:
            _launch_options("-n", "2", "--backup-dir", str(directory.parent if directory.name == "worker-0" else directory),
                            "--", "true")
        assert "Received --backup-dir" in str(error.value) and message in str(error.value)
        assert "\n" not in str(error.value)


def test_launch_creates_the_backup_dir_private_and_its_help_names_no_world_writable_path(tmp_path):
    from tfstrategy.cli.launch import EPILOG

    options = _launch_options("-n", "2", "--backup-dir", str(tmp_path / "new" / "run"), "--", "true")
    assert options.backup_dir == tmp_path / "new" / "run"
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    assert "/tmp" not in EPILOG and "/var/tmp" not in EPILOG


def test_a_generated_backup_dir_is_removed_after_success_and_kept_with_its_resume_command_otherwise(tmp_path):
    for code in (0, 75):
        backup = JobBackup(None, max_restarts=1, env={})
        with backup:
            assert backup.path.stat().st_mode & 0o777 == 0o700
        line = resume_command(num_workers=2, max_restarts=1, timeout=300, backup_dir=backup.path,
                              command=("python", "train.py"))
        said = backup.finish(code, line)
        if code == 0:
            assert said is None and not backup.path.exists()
        else:
            assert said == (f"the job's backup is kept in {backup.path} (exit status 75); resume from it with: "
                            f"tfstrategy launch -n 2 --max-restarts 1 --timeout 300 --backup-dir {backup.path} -- "
                            "python train.py")
            assert backup.path.is_dir()
    assert JobBackup(None, max_restarts=0).path is None


def _stopped_job(tmp_path: Path, *, wrote_a_part: bool) -> tuple[list[str], Path]:
    """``launch -n 2 --max-restarts 2`` whose worker stopped the job (exit 2): what the launcher says, the directory."""
    said: list[str] = []
    made: list[Path] = []

    def run(options: LaunchOptions) -> RunResult:
        made.append(options.backup_dir)
        if wrote_a_part:
            write_part(options.backup_dir / "worker-0", 1)
        return RunResult().end(Outcome.STOPPED)

    options = LaunchOptions(command=("python", "onedev.py"), num_workers=2, max_restarts=2)
    result = run_with_backup(options, run, say=said.append, env={"TFSTRATEGY_JOB_ID": "stopped"}, timeout=300)
    assert result.returncode == 2
    return said, made[0]


def test_a_stopped_job_is_not_told_to_resume_the_same_command(tmp_path):
    # A worker stopped the job on a user error (MirroredStrategy(devices=['/gpu:0']) on a CPU host): the same
    # command stops again, so its backup is kept only if a worker wrote one, and the line asks for the fix first.
    said, directory = _stopped_job(tmp_path, wrote_a_part=False)
    assert said == [] and not directory.exists()
    said, directory = _stopped_job(tmp_path, wrote_a_part=True)
    assert directory.is_dir()
    assert said == [f"the job's backup is kept in {directory} (exit status 2); the same command would stop again: "
                    "fix what the line above says, then resume from it with: tfstrategy launch -n 2 --max-restarts 2 "
                    f"--timeout 300 --backup-dir {directory} -- python onedev.py"]


LAUNCH_HOLDER = """
import sys, time
from pathlib import Path
from tfstrategy.launch.backup_dir import JobBackup
with JobBackup(Path(sys.argv[1]), max_restarts=1, env={"TFSTRATEGY_JOB_ID": "first"}):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_launch_on_one_backup_dir_is_refused_naming_the_job(tmp_path):
    checked_backup_dir(tmp_path / "b")
    holder = subprocess.Popen([sys.executable, "-c", LAUNCH_HOLDER, str(tmp_path / "b")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(LaunchError, match=rf"is in use by job 'first' \(tfstrategy launch pid {holder.pid} on "
                                              r".*\); this is job 'second'"):
            with JobBackup(tmp_path / "b", max_restarts=1, env={"TFSTRATEGY_JOB_ID": "second"}):
                pass
    finally:
        holder.kill()
        holder.wait()
