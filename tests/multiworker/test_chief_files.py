"""chief_write, the one rule of files in a multi-worker job, and is_chief: without processes.

With real workers (the chief's file complete before any worker reads, BackupAndRestore
on one directory, every Keras writer): tests/patches/test_keras_chief_files.py.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

import tfstrategy
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker import chief_files

WORKERS = ["127.0.0.1:1", "127.0.0.1:2"]


def _env(task_type="worker", index=0, chief=False, workers=WORKERS):
    cluster = {"worker": workers, **({"chief": ["127.0.0.1:3"]} if chief else {})}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


@pytest.mark.parametrize(
    ("env", "chief"),
    [
        pytest.param({}, True, id="no-tf-config"),
        pytest.param(_env(workers=WORKERS[:1]), True, id="one-task"),
        pytest.param(_env(index=0), True, id="worker-0-without-chief"),
        pytest.param(_env(index=1), False, id="worker-1"),
        pytest.param(_env("chief", 0, chief=True), True, id="chief-task"),
        pytest.param(_env(index=0, chief=True), False, id="worker-0-beside-a-chief"),
    ],
)
def test_is_chief(env, chief):
    assert tfstrategy.is_chief(env) is chief


def test_is_chief_refuses_an_invalid_tf_config():
    with pytest.raises(ClusterConfigError):
        tfstrategy.is_chief({"TF_CONFIG": "{not json"})


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Private copies go to a directory of this test's own (TMPDIR), so leftovers can be counted."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return scratch


@pytest.mark.parametrize("env", [{}, _env(workers=WORKERS[:1]), _env(index=0)], ids=["single", "one-task", "chief"])
def test_the_chief_and_a_single_process_write_the_named_path(tmp_path, private_tmp, env):
    path = tmp_path / "out" / "model.keras"
    with chief_files.chief_write(path, env=env) as target:
        assert target == path and isinstance(target, Path)
    with chief_files.chief_write(str(path), env=env) as target:
        assert target == str(path)
    assert list(private_tmp.iterdir()) == []


def test_other_workers_write_a_private_copy_of_the_same_name_that_is_removed(tmp_path, private_tmp):
    path = tmp_path / "ckpt" / "ckpt-3.weights.h5"
    with chief_files.chief_write(str(path), env=_env(index=1)) as target:
        assert isinstance(target, str) and os.path.basename(target) == "ckpt-3.weights.h5"
        assert Path(target).parent.parent == private_tmp
        assert Path(target).parent.name.startswith("tfstrategy-worker-1-")
        Path(target).write_text("the same bytes the chief writes")
    assert list(private_tmp.iterdir()) == []
    assert not path.parent.exists()


def test_the_private_copy_is_removed_when_the_write_fails(tmp_path, private_tmp):
    with pytest.raises(OSError, match="disk full"):
        with chief_files.chief_write(str(tmp_path / "m.keras"), env=_env(index=1)) as target:
            Path(target).write_text("partial")
            raise OSError("disk full")
    assert list(private_tmp.iterdir()) == []


def test_a_nested_write_passes_through(tmp_path, private_tmp):
    """ModelCheckpoint -> Model.save -> saving_lib: only the outermost writer decides."""
    env = _env(index=1)
    with chief_files.chief_write(str(tmp_path / "a.keras"), env=env) as outer:
        with chief_files.chief_write(outer, env=env) as inner:
            assert inner == outer
    with chief_files.passing_through():
        with chief_files.chief_write(str(tmp_path / "b.keras"), env=env) as target:
            assert target == str(tmp_path / "b.keras")


def test_an_open_file_object_passes_through(tmp_path, private_tmp):
    handle = object()  # h5py.File objects are written to as they are
    with chief_files.chief_write(handle, env=_env(index=1)) as target:
        assert target is handle


def test_each_write_of_a_name_is_its_own_key():
    """The n-th write of a name on one worker is matched with the chief's n-th write of that name."""
    first, second = chief_files._next_key("x-unique.keras"), chief_files._next_key("x-unique.keras")
    assert first == chief_files.write_key("x-unique.keras", 1)
    assert second == chief_files.write_key("x-unique.keras", 2)
    assert chief_files._next_key("y-unique.keras") == chief_files.write_key("y-unique.keras", 1)


def test_the_key_names_the_file_not_its_directory():
    # The tutorial's per-worker directory (dir/workertemp_1/model.keras) matches the chief's dir/model.keras.
    assert chief_files._file_name("/a/workertemp_1/model.keras") == chief_files._file_name("/a/model.keras")
    assert chief_files._file_name("logs/tb/") == "tb"


class _Store:
    """The coordination service's key-value store as the waiting policy sees it (the real one: multiprocess tests)."""

    def __init__(self, misses: int) -> None:
        import tensorflow as tf

        self.misses, self.asked, self.set = misses, [], {}
        self._deadline = tf.errors.DeadlineExceededError

    def get_config_key_value(self, key, timeout_in_ms=0):
        self.asked.append((key, timeout_in_ms))
        if len(self.asked) <= self.misses:
            raise self._deadline(None, None, "timed out")
        return "written"

    def set_config_key_value(self, key, value):
        self.set[key] = value


def test_a_worker_waits_for_the_chief_and_says_so_once(tmp_path, private_tmp, monkeypatch, capsys):
    from tfstrategy import _compat

    store = _Store(misses=2)
    monkeypatch.setattr(_compat, "coordination_store", lambda: store)
    monkeypatch.setattr(chief_files, "WAIT_NOTICE", 0.01)
    with chief_files.chief_write(str(tmp_path / "slow-unique.keras"), env=_env(index=1)):
        pass
    assert [key for key, _ in store.asked] == [chief_files.write_key("slow-unique.keras", 1)] * 3
    err = capsys.readouterr().err
    assert err.count("waits for the chief to finish writing") == 1


def test_a_worker_stops_waiting_for_a_name_the_chief_never_writes(tmp_path, private_tmp, monkeypatch, capsys):
    from tfstrategy import _compat

    store = _Store(misses=10**6)
    monkeypatch.setattr(_compat, "coordination_store", lambda: store)
    monkeypatch.setattr(chief_files, "WAIT_NOTICE", 0.01)
    monkeypatch.setattr(chief_files, "WAIT_LIMIT", 0.05)
    with chief_files.chief_write(str(tmp_path / "mine-unique.keras"), env=_env(index=1)):
        pass
    assert "stopped waiting for the chief to write" in capsys.readouterr().err


class _GoneStore(_Store):
    """The store once the chief's process, which hosts the coordination service, has exited."""

    def get_config_key_value(self, key, timeout_in_ms=0):
        import tensorflow as tf

        self.asked.append((key, timeout_in_ms))
        raise tf.errors.UnavailableError(None, None, "the coordination service is gone")


@pytest.mark.parametrize(("found", "chief_wrote"), [("written", True), ("absent", False), ("an-earlier-runs", False)],
                         ids=["chief-wrote-it-then-left", "chief-never-wrote-it", "only-an-earlier-runs-file"])
def test_a_worker_whose_chief_has_left_says_so_only_when_no_file_shows_the_chief_wrote_it(
        tmp_path, private_tmp, monkeypatch, capsys, found, chief_wrote):
    """CI, stop 52: the chief wrote out/model.keras, published it and exited before worker 1 looked; worker 1 said
    "the chief left the job without writing that name", which was not true, and a clean launch's console had a
    line too many. A file of the name newer than the worker's start, in a file system both share, is the chief's."""
    from tfstrategy import _compat

    monkeypatch.setattr(_compat, "coordination_store", lambda: _GoneStore(misses=0))
    target = tmp_path / "gone-unique.keras"
    if found != "absent":
        target.write_bytes(b"a model")
    if found == "an-earlier-runs":  # written before this process loaded tfstrategy: not this job's chief's
        os.utime(target, (chief_files._LOADED - 60, chief_files._LOADED - 60))
    with chief_files.chief_write(str(target), env=_env(index=1)):
        pass
    err = capsys.readouterr().err
    if chief_wrote:
        assert err == ""
    else:
        assert "the chief left the job before this worker saw it write that name" in err and str(target) in err
    assert target.exists() is (found != "absent")  # the worker's own copy went to its private directory, then away


def test_the_chief_publishes_each_write_even_a_failed_one(tmp_path, monkeypatch):
    from tfstrategy import _compat

    store = _Store(misses=0)
    monkeypatch.setattr(_compat, "coordination_store", lambda: store)
    with chief_files.chief_write(str(tmp_path / "pub-unique.keras"), env=_env(index=0)):
        pass
    with pytest.raises(OSError):
        with chief_files.chief_write(str(tmp_path / "pub-unique.keras"), env=_env(index=0)):
            raise OSError("disk full")
    assert store.set == {chief_files.write_key("pub-unique.keras", 1): "written",
                         chief_files.write_key("pub-unique.keras", 2): "failed"}


# --- tf.train.Checkpoint under the hook (runtime/hook_checkpoints.py), real TensorFlow, no peers ---------


@pytest.fixture
def checkpoint_rewrite():
    from tfstrategy.runtime.hook_checkpoints import checkpoint_files
    from tfstrategy.runtime.rewrites import remove_rewrites

    checkpoint_files()
    yield
    remove_rewrites()


def _checkpoint_and_manager(directory: Path) -> tuple[object, object]:
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(weight=tf.Variable([1.0, 2.0]))
    return checkpoint, tf.train.CheckpointManager(checkpoint, str(directory / "managed"), max_to_keep=1)


def _save_both_ways(directory: Path, checkpoint, manager) -> tuple[str, str, str | None]:
    saved = checkpoint.save(str(directory / "ckpt"))
    manager.save()
    managed = manager.save()
    return saved, managed, manager.latest_checkpoint


def _data_files(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(directory)): (path.stat().st_ino, path.stat().st_mtime_ns)
            for path in directory.rglob("*") if path.suffix == ".index" or ".data-" in path.name}


def test_checkpoint_save_and_manager_write_their_files_on_the_chief_only(tmp_path, private_tmp, monkeypatch,
                                                                          checkpoint_rewrite):
    """Both workers wrote ``ckpt-1_temp/`` shards and the first merge deleted the other's (tf_custom_training.py).

    Both workers make their objects first, as they do in one job; the chief saves first (each save of worker 1
    waits for the chief's), then worker 1 makes the same calls.
    """
    chief, worker = _checkpoint_and_manager(tmp_path), _checkpoint_and_manager(tmp_path)
    monkeypatch.setenv("TF_CONFIG", _env(index=0)["TF_CONFIG"])
    on_chief = _save_both_ways(tmp_path, *chief)
    assert on_chief == (str(tmp_path / "ckpt-1"), str(tmp_path / "managed" / "ckpt-3"),
                        str(tmp_path / "managed" / "ckpt-3"))  # the manager numbers by the same save counter
    written = _data_files(tmp_path)
    assert sorted(written) == ["ckpt-1.data-00000-of-00001", "ckpt-1.index", "managed/ckpt-3.data-00000-of-00001",
                               "managed/ckpt-3.index"]  # max_to_keep=1 removed ckpt-2
    monkeypatch.setenv("TF_CONFIG", _env(index=1)["TF_CONFIG"])
    assert _save_both_ways(tmp_path, *worker) == on_chief  # the same paths on every worker: the chief's files
    assert _data_files(tmp_path) == written  # not one file rewritten or added by worker 1
    # Worker 1's bookkeeping ran with the real paths (its record, written atomically, is the chief's).
    assert (tmp_path / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-1"')
    assert (tmp_path / "managed" / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-3"')
    assert list(private_tmp.iterdir()) == []


def test_an_asynchronous_checkpoint_is_written_by_the_chief_only_too(tmp_path, private_tmp, monkeypatch,
                                                                    checkpoint_rewrite):
    """TensorFlow's thread writes it after ``write`` returned, through ``Checkpoint._write`` again."""
    import tensorflow as tf

    options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    for index, expected in ((0, ["async.data-00000-of-00001", "async.index"]), (1, [])):
        monkeypatch.setenv("TF_CONFIG", _env(index=index)["TF_CONFIG"])
        directory = tmp_path / f"worker-{index}"
        checkpoint = tf.train.Checkpoint(weight=tf.Variable([1.0, 2.0]))
        assert checkpoint.write(str(directory / "async"), options=options) == str(directory / "async")
        checkpoint.sync()
        written = sorted(_data_files(directory)) if directory.exists() else []
        assert written == expected
    assert list(private_tmp.iterdir()) == []
