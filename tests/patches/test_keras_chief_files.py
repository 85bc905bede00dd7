"""Keras 3's file writers on every worker of a multi-worker job: still broken upstream, fixed by the patch.

Fast tests run Keras' writers in this process as worker 1 or worker 0 of a 2-worker
``TF_CONFIG`` (the patch decides from ``TF_CONFIG``; no peer is needed to write).
The multiprocess tests run ``tests/workers/chief_files_worker.py``, a plain Keras
script, on two real workers: in plain Keras (the upstream canary), with each
worker in its own directory (separate filesystems), and under ``tfstrategy
launch -n 2`` in one shared directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, free_ports
from tfstrategy import _versions
from tfstrategy.patches import keras_chief_files as chief_files_patch

pytestmark = pytest.mark.skipif(
    _versions.legacy_keras_requested() or chief_files_patch.PATCH.target_module() is None,
    reason="tf.keras is tf_keras, which writes files on the chief only by itself: nothing to patch",
)

WORKER = Path(__file__).resolve().parent.parent / "workers" / "chief_files_worker.py"
CLUSTER = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


def _tf_config(index: int, cluster=CLUSTER) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def test_upstream_keras_still_writes_every_file_on_every_worker():
    """Fails once Keras writes only on the chief: then drop that part of keras_chief_files."""
    import keras

    found = chief_files_patch.ChiefFilesPatch().probe()
    assert found is not None, "the probe failed"
    still = {target for target, broken in found.items() if broken}
    assert still == set(chief_files_patch.PATCH.present_targets()), (
        f"Keras {keras.__version__} no longer writes these on a non-chief worker: "
        f"{sorted(set(found) - still)}; remove them from keras_chief_files"
    )


def test_apply_installs_every_writer_and_remove_restores_keras():
    from keras.src.callbacks.csv_logger import CSVLogger
    from keras.src.saving import saving_lib

    patch = chief_files_patch.PATCH
    patch.remove()
    save, begin = saving_lib.save_model, CSVLogger.on_train_begin
    try:
        status = patch.apply()
        assert status.needed is True and status.installed == chief_files_patch.PATCH.present_targets()
        assert saving_lib.save_model is not save and CSVLogger.on_train_begin is not begin
        assert patch.original(chief_files_patch.SAVE_MODEL) is save  # the probe keeps testing Keras' own
    finally:
        patch.remove()
    assert (saving_lib.save_model, CSVLogger.on_train_begin) == (save, begin)
    patch.apply()  # as select() in earlier tests left it


@pytest.mark.slow  # 12 s alone
def test_the_probe_neither_starts_the_runtime_nor_takes_a_model_name():
    """The hook applies patches when keras is imported: before a CPU split, before the script's models."""
    code = (
        "import keras, json\n"
        "from tfstrategy import _compat\n"
        "from tfstrategy.patches import keras_chief_files as k\n"
        "status = k.PATCH.apply()\n"
        "print(json.dumps([len(status.installed), _compat.runtime_started(), keras.Sequential().name]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    installed, started, name = json.loads(result.stdout.strip().splitlines()[-1])
    assert (installed, started, name) == (len(chief_files_patch.PATCH.present_targets()), False, "sequential")


@pytest.fixture
def as_worker(tmp_path, monkeypatch):
    """Run as task ``index`` of a 2-worker TF_CONFIG, private copies in this test's own TMPDIR."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    chief_files_patch.PATCH.apply()

    def become(index: int) -> Path:
        monkeypatch.setenv("TF_CONFIG", _tf_config(index))
        return scratch

    return become


def _fit_with_every_writer(out: Path) -> object:
    import keras

    keras.utils.set_random_seed(0)
    x = np.linspace(-1, 1, 64, dtype="float32").reshape(32, 2)
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    callbacks = [
        keras.callbacks.ModelCheckpoint(str(out / "ckpt" / "ckpt-{epoch}.keras")),
        keras.callbacks.ModelCheckpoint(str(out / "best.weights.h5"), monitor="loss", save_best_only=True,
                                        save_weights_only=True),
        keras.callbacks.ModelCheckpoint(str(out / "batches" / "b-{batch}.weights.h5"), save_freq=2,
                                        save_weights_only=True),
        keras.callbacks.ModelCheckpoint(str(out / "legacy.h5")),
        keras.callbacks.CSVLogger(str(out / "log.csv")),
        keras.callbacks.TensorBoard(log_dir=str(out / "tb")),
        keras.callbacks.BackupAndRestore(backup_dir=str(out / "backup"), delete_checkpoint=False),
    ]
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
    model.save(str(out / "final.keras"))
    model.save_weights(str(out / "final.weights.h5"))
    keras.saving.save_model(model, str(out / "api.keras"))
    model.export(str(out / "export"), verbose=False)
    return model


def _private_copies(scratch: Path) -> list[str]:
    """What tfstrategy left in a TMPDIR (TensorFlow's autograph files may be there too)."""
    return sorted(path.name for path in scratch.iterdir() if path.name.startswith("tfstrategy-"))


def _files(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}


def test_a_worker_that_is_not_the_chief_writes_no_file_and_leaves_no_copy(tmp_path, as_worker):
    scratch = as_worker(1)
    _fit_with_every_writer(tmp_path / "out")
    # ModelCheckpoint makes its directories before saving, as in Keras; they stay empty.
    assert _files(tmp_path / "out") == set()
    assert _private_copies(scratch) == []


def test_the_chief_writes_every_file(tmp_path, as_worker):
    import keras

    scratch = as_worker(0)
    model = _fit_with_every_writer(tmp_path / "out")
    files = _files(tmp_path / "out")
    expected = {"ckpt/ckpt-1.keras", "ckpt/ckpt-2.keras", "best.weights.h5", "legacy.h5", "log.csv", "final.keras",
                "final.weights.h5", "api.keras", "backup/latest.weights.h5", "backup/training_metadata.json",
                "export/saved_model.pb"}
    assert expected <= files
    assert {name for name in files if name.startswith("batches/")} == {"batches/b-2.weights.h5",
                                                                       "batches/b-4.weights.h5"}
    assert len([name for name in files if name.startswith("tb/train/events.")]) == 1
    assert (tmp_path / "out" / "log.csv").read_text().count("\n") == 3  # header + 2 epochs
    reloaded = keras.models.load_model(tmp_path / "out" / "ckpt" / "ckpt-2.keras")
    for a, b in zip(reloaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert _private_copies(scratch) == []


def test_backup_callbacks_keep_their_directory_per_worker(tmp_path, as_worker):
    """tfstrategy.backup_callbacks()' parts are each worker's own files: every worker writes its part."""
    import keras
    import tensorflow as tf

    from tfstrategy.multiworker import commit
    from tfstrategy.multiworker.coordinated import CoordinatedBackup

    as_worker(1)
    backup = CoordinatedBackup(tmp_path / "backups", tf.distribute.get_strategy())
    backup.open()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    backup._write_part(model, 0, 0, 0)  # what every worker does before the agreement of a save
    backup.close()
    assert commit.check_part(tmp_path / "backups" / "worker-1", 0, backup.job_id).step == 0


def test_a_download_appears_whole_or_not_at_all(tmp_path, as_worker):
    """keras.utils.get_file on every worker into one cache: never a half-written file at the target."""
    import keras
    from keras.src.utils import file_utils

    as_worker(1)
    source = tmp_path / "mnist.npz"
    np.savez(source, x=np.arange(100_000))
    target = tmp_path / "cache" / "seen.npz"
    target.parent.mkdir()
    seen = []
    file_utils.urlretrieve(source.as_uri(), str(target), lambda *_: seen.append(target.exists()))
    assert seen and not any(seen) and target.read_bytes() == source.read_bytes()
    path = keras.utils.get_file("mnist.npz", origin=source.as_uri(), cache_dir=str(tmp_path / "cache"))
    assert np.load(path)["x"].sum() == np.arange(100_000).sum()
    assert sorted(p.name for p in (tmp_path / "cache" / "datasets").iterdir()) == ["mnist.npz"]


def test_one_process_runs_keras_own_code(tmp_path, as_worker, monkeypatch):
    as_worker(1)
    monkeypatch.delenv("TF_CONFIG")
    _fit_with_every_writer(tmp_path / "out")
    assert "final.keras" in _files(tmp_path / "out")


# --- real workers -----------------------------------------------------------------------------


def _local_workers(mode: str, cwds: list[Path], *, hooked: bool, extra_env=None, timeout: float = 300) -> list:
    """Two workers with TF_CONFIG on free loopback ports, each in its own directory (its own "machine")."""
    from tfstrategy.runtime.worker_hook import hook_environment

    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(len(cwds))]}
    processes = []
    for index, cwd in enumerate(cwds):
        (cwd / "tmp").mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TF_CONFIG": _tf_config(index, cluster), "TF_CPP_MIN_LOG_LEVEL": "2",
               "TMPDIR": str(cwd / "tmp"), **(extra_env or {})}
        if hooked:
            env = hook_environment(env=env)
        processes.append(subprocess.Popen([sys.executable, str(WORKER), mode, "."], cwd=cwd, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=timeout)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-3000:]
    return [json.loads((cwd / f"worker-{index}.json").read_text()) for index, cwd in enumerate(cwds)]


WRITTEN = {"ckpt/ckpt-1.keras", "ckpt/ckpt-2.keras", "ckpt/ckpt-3.keras", "best.weights.h5", "legacy.h5", "log.csv",
           "final.keras", "final.weights.h5", "api.keras", "export/saved_model.pb",
           *(f"batches/b-{epoch}-{batch}.weights.h5" for epoch in (1, 2, 3) for batch in (4, 8))}


@pytest.mark.multiprocess
def test_upstream_plain_keras_writes_the_named_path_on_every_worker(tmp_path):
    """The canary with real workers: without tfstrategy, worker 1 writes every file too (one machine each)."""
    cwds = [tmp_path / "machine-0", tmp_path / "machine-1"]
    _local_workers("writers", cwds, hooked=False, extra_env={"NO_RELOAD": "1", "FIT_FIX_ONLY": "1"})
    for cwd in cwds:
        assert WRITTEN <= _files(cwd / "shared"), f"{cwd.name} did not write every file: Keras changed"


@pytest.mark.multiprocess
def test_on_separate_filesystems_only_the_chief_keeps_files(tmp_path):
    cwds = [tmp_path / "machine-0", tmp_path / "machine-1"]
    results = _local_workers("writers", cwds, hooked=True, extra_env={"NO_RELOAD": "1"})
    assert WRITTEN <= _files(cwds[0] / "shared")
    assert _files(cwds[1] / "shared") == set()  # ModelCheckpoint's (empty) directories only
    assert _private_copies(cwds[1] / "tmp") == [] and results[1]["leftovers"] == []
    assert results[0]["weights"] == results[1]["weights"]


def _launch(mode: str, out: Path, *args: str, env=None, timeout: float = 400) -> list:
    from helpers import run_cli

    (out / "tmp").mkdir(parents=True, exist_ok=True)
    result = run_cli("launch", "-n", "2", "--timeout", "180", *args, "--", sys.executable, str(WORKER), mode,
                     str(out), env={"TMPDIR": str(out / "tmp"), **(env or {})}, timeout=timeout)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return [json.loads((out / f"worker-{index}.json").read_text()) for index in range(2)]


@pytest.fixture(scope="module")
def launched_writers(tmp_path_factory) -> tuple[Path, list]:
    """``writers`` under ``tfstrategy launch -n 2`` in one shared directory: the directory, each worker's result.

    Also the uninterrupted run of ``backup``'s model, data, optimizer and epochs (its reference weights).
    """
    out = tmp_path_factory.mktemp("launched-writers")
    return out, _launch("writers", out)


@pytest.mark.multiprocess
def test_launch_writes_each_file_once_in_a_shared_directory(launched_writers):
    import keras

    tmp_path, (chief, worker) = launched_writers
    shared = tmp_path / "shared"
    files = _files(shared)
    assert WRITTEN <= files
    # One writer per file: one event file per TensorBoard run (named by host and pid), one row per epoch.
    for run in ("train", "validation"):
        events = [name for name in files if name.startswith(f"tb/{run}/events.out.tfevents.")]
        assert len(events) == 1, events
    assert (shared / "log.csv").read_text().count("\n") == 4
    assert chief["weights"] == worker["weights"]
    # Every worker reloaded the newest checkpoint, complete, and it is the trained model.
    assert chief["newest"] == worker["newest"] == "ckpt-3.keras"
    assert chief["reloaded"] == chief["weights"] and worker["reloaded"] == worker["weights"]
    reloaded = keras.models.load_model(shared / "final.keras")
    for a, b in zip(reloaded.get_weights(), chief["weights"]):
        np.testing.assert_array_equal(a, np.array(b, dtype=a.dtype))
    assert chief["leftovers"] == worker["leftovers"] == [] and _private_copies(tmp_path / "tmp") == []


def _burn(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"])


@pytest.mark.multiprocess
def test_the_chief_finishes_each_checkpoint_before_any_worker_reads_it_under_load(tmp_path):
    """Both cores busy while the workers fit: every worker reads the checkpoint it just saved, at once; each read is complete.

    The load starts when worker 0 says its fit begins (not while TensorFlow is imported), and lasts until the job ends.
    """
    (tmp_path / "tmp").mkdir()
    with open(tmp_path / "launch.err", "w") as err:
        job = subprocess.Popen([sys.executable, "-m", "tfstrategy", "launch", "-n", "2", "--timeout", "180", "--",
                                sys.executable, str(WORKER), "reload", str(tmp_path)], stdout=subprocess.PIPE, stderr=err,
                               text=True, cwd=ROOT,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(tmp_path / "tmp")})
    burners = []
    try:
        for line in job.stdout:
            if line.startswith("[worker 0] reload: fitting"):
                burners = [_burn(600) for _ in range(2)]
                break
        assert burners, f"the job ended before its fit: {(tmp_path / 'launch.err').read_text()[-3000:]}"
        out = job.communicate(timeout=400)[0]
    finally:
        for process in [*burners, job]:
            if process.poll() is None:
                process.kill()
            process.wait()
    assert job.returncode == 0, (out[-3000:], (tmp_path / "launch.err").read_text()[-3000:])
    chief, worker = (json.loads((tmp_path / f"worker-{index}.json").read_text()) for index in range(2))
    for result in (chief, worker):
        for read in result["reads"]:
            assert read.get("equal") is True, read
            # The chief's file was last written before this worker began to read it.
            assert read["returned"] >= read["mtime"], read
    margins = [read["returned"] - read["mtime"] for read in worker["reads"]]
    print(f"worker 1 began reading {min(margins) * 1000:.1f} ms (min) / {np.median(margins) * 1000:.1f} ms (median) "
          f"after the chief's last write to the checkpoint, over {len(margins)} checkpoints")


@pytest.mark.multiprocess
def test_backup_and_restore_on_one_directory_resumes_every_worker_from_the_chief(launched_writers, tmp_path):
    _, uninterrupted = launched_writers  # the same model, data, optimizer and epochs, uninterrupted
    out = tmp_path / "killed"
    resumed = _launch("backup", out, "--max-restarts", "1", env={"KILL_AT_EPOCH": "2", "KILL_WORKER": "1"})
    chief_at_2 = json.loads((out / "progress-0-0.json").read_text())["2"]
    for index, result in enumerate(resumed):
        assert result["attempt"] == 1
        assert result["first_epoch"] == 2, f"worker {index} did not resume after epoch 2"
        assert result["restored"] == chief_at_2, f"worker {index} did not restore the chief's state"
        for a, b in zip(result["weights"], uninterrupted[index]["weights"]):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
        assert result["leftovers"] == []
    # Only the chief deleted the backup, at the end; no private copy outlived its backup.
    assert not (out / "shared" / "backup").exists()
    assert _private_copies(out / "tmp") == []
