"""Which file of a committed step a worker loads, without processes: its own part, else a peer's on the same file system.

The rule of ``CoordinatedBackup._loadable``, read from files only (no TensorFlow, no collective). With real
workers and real damage it is tested in tests/multiworker/test_coordinated_faults.py (a truncated part, a
deleted worker directory: the worker loads the peer's part of the same step, or every worker falls back).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfstrategy.multiworker import commit
from tfstrategy.multiworker.coordinated import CoordinatedBackup

JOB = "job-a"
CLUSTER = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


def write_part(directory: Path, step: int, payload: bytes = b"weights of the step", *, job: str = JOB) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    weights = directory / commit.part_name(step)
    weights.write_bytes(payload)
    size, digest = commit.file_digest(weights)
    part = commit.Part(job_id=job, step=step, epoch=step // 8, batch=0, size=size, sha256=digest)
    commit.atomic_write_text(directory / commit.sidecar_name(step), json.dumps(part.to_json()))
    return weights


def worker(base: Path, index: int) -> CoordinatedBackup:
    """Worker ``index`` of a 2-worker TF_CONFIG on ``base``, its directory opened (trust, job id, lock)."""
    env = {"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": index}}),
           "TFSTRATEGY_JOB_ID": JOB}
    backup = CoordinatedBackup(base, None, env=env)
    backup.open()
    return backup


@pytest.fixture
def base(tmp_path) -> Path:
    base = tmp_path / "backup"
    base.mkdir(mode=0o700)
    for index in (0, 1):
        write_part(base / f"worker-{index}", 16)
    return base


def test_a_whole_own_part_is_loaded_and_nothing_is_said(base):
    backup = worker(base, 1)
    try:
        assert backup._loadable(16) == (base / "worker-1" / "step-16.weights.h5", None)
    finally:
        backup.close()


def test_a_truncated_own_part_loads_the_peers_part_of_the_same_step_naming_why(base):
    own = base / "worker-1" / "step-16.weights.h5"
    own.write_bytes(own.read_bytes()[:5])
    backup = worker(base, 1)
    try:
        path, why = backup._loadable(16)
    finally:
        backup.close()
    assert path == base / "worker-0" / "step-16.weights.h5"
    assert f"{own} (step 16) has 5 bytes; its sidecar says 19: it is truncated" in why


def test_a_worker_without_its_directory_loads_the_peers_part_naming_the_missing_sidecar(base):
    for entry in (base / "worker-1").iterdir():
        entry.unlink()
    (base / "worker-1").rmdir()
    backup = worker(base, 1)  # open() makes its directory again, empty
    try:
        path, why = backup._loadable(16)
    finally:
        backup.close()
    assert path == base / "worker-0" / "step-16.weights.h5"
    assert f"{base}/worker-1/step-16.json is missing: this worker has no backup of step 16" in why


def test_no_whole_part_anywhere_is_not_loadable_and_a_peers_damaged_or_foreign_part_is_never_taken(base):
    own = base / "worker-1" / "step-16.weights.h5"
    own.write_bytes(own.read_bytes()[:5])
    peer = base / "worker-0" / "step-16.weights.h5"
    peer.write_bytes(b"WEIGHTS OF THE STEP")  # the same size, another sha256
    write_part(base / "worker-0", 8, job="job-b")  # another job's part of step 8
    write_part(base / "worker-1", 8, b"short", job="job-a")
    (base / "worker-1" / "step-8.weights.h5").unlink()
    backup = worker(base, 1)
    try:
        path, why = backup._loadable(16)
        assert path is None and why.startswith(f"{own} (step 16) has 5 bytes; its sidecar says 19: it is truncated")
        path, why = backup._loadable(8)
    finally:
        backup.close()
    assert path is None and f"{base}/worker-1/step-8.weights.h5" in why
