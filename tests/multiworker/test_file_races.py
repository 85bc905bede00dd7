"""A script's own file code racing on a shared path: one line that says so, from the real errors."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tfstrategy.multiworker.file_races import PREFIX, install_excepthook, race_of, shared_path_message
from tfstrategy.state.registry import RUNTIME


def _raised(function, *args):
    try:
        function(*args)
    except BaseException as error:  # noqa: BLE001 - the test inspects whatever was raised
        return error
    raise AssertionError(f"{function.__name__} raised nothing")


def _makedirs_twice(path):
    os.makedirs(path)
    os.makedirs(path)  # the second worker


def _read_rewritten_zip(filepath):
    with zipfile.ZipFile(filepath, "w") as archive:
        archive.writestr("config.json", json.dumps({"layers": list(range(100))}))
    data = bytearray(open(filepath, "rb").read())
    start = data.index(b"[0, 1")
    data[start + 3] ^= 0xFF  # another worker rewrote the bytes under the reader
    open(filepath, "wb").write(bytes(data))
    with zipfile.ZipFile(filepath) as archive:
        archive.read("config.json")


def _h5py_locked(filepath):
    # h5py's message when another process holds the file: it does not name the file; the frame does.
    raise BlockingIOError(errno.EAGAIN, "Unable to synchronously create file (unable to lock file, errno = 11, "
                                        "error message = 'Resource temporarily unavailable')")


def _load_then_wrap(filepath):
    try:
        _read_rewritten_zip(filepath)
    except zipfile.BadZipFile as error:
        raise ValueError("Keras could not load the checkpoint") from error


def test_makedirs_on_every_worker(tmp_path):
    error = _raised(_makedirs_twice, str(tmp_path / "ckpt"))
    path, what = race_of(error)
    assert path == str(tmp_path / "ckpt") and "another worker probably created it" in what


def test_a_zip_read_while_rewritten_names_the_archive_not_its_member(tmp_path):
    error = _raised(_read_rewritten_zip, str(tmp_path / "ckpt-2.keras"))
    assert isinstance(error, zipfile.BadZipFile) and "CRC" in str(error)
    assert race_of(error)[0] == str(tmp_path / "ckpt-2.keras")


def test_h5py_lock(tmp_path):
    error = _raised(_h5py_locked, str(tmp_path / "w.weights.h5"))
    assert race_of(error) == (str(tmp_path / "w.weights.h5"), "another worker held or was writing the file")


def test_a_race_behind_another_error_is_found(tmp_path):
    error = _raised(_load_then_wrap, str(tmp_path / "m.keras"))
    assert race_of(error)[0] == str(tmp_path / "m.keras")


def test_rmtree_of_a_directory_another_worker_removed(tmp_path):
    def rmtree_removed_meanwhile(path):
        os.makedirs(path)
        shutil.rmtree(path)  # the other worker
        shutil.rmtree(path)

    error = _raised(rmtree_removed_meanwhile, str(tmp_path / "backup"))
    assert race_of(error) == (str(tmp_path / "backup"), "another worker removed it at the same time")


@pytest.mark.parametrize(
    "function",
    [
        pytest.param(lambda: open("/nonexistent/data.csv"), id="missing-input-file"),
        pytest.param(lambda: int("x"), id="value-error"),
        pytest.param(lambda: zipfile.ZipFile(io.BytesIO(b"not a zip")), id="not-a-path"),
    ],
)
def test_other_errors_are_not_races(function):
    error = _raised(function)
    if isinstance(error, zipfile.BadZipFile):
        assert race_of(error) == ("?", "it was read while another worker rewrote it")  # no path to name
    else:
        assert race_of(error) is None and shared_path_message(error) is None


def test_the_message_says_what_happened_and_both_fixes(tmp_path):
    message = shared_path_message(_raised(_makedirs_twice, str(tmp_path / "ckpt")), task="worker-1")
    assert message.startswith(f"{PREFIX} (worker-1): {tmp_path / 'ckpt'}: it already existed")
    assert "FileExistsError: [Errno 17] File exists" in message
    assert "tfstrategy.is_chief()" in message and "its own path" in message
    assert "\n" not in message


def test_the_excepthook_adds_the_line_after_the_traceback_in_a_multi_worker_job(tmp_path, monkeypatch, capsys):
    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda *args: printed.append("traceback"))
    install_excepthook()
    error = _raised(_makedirs_twice, str(tmp_path / "out"))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                                "task": {"type": "worker", "index": 1}}))
    sys.excepthook(type(error), error, error.__traceback__)
    assert printed == ["traceback"]  # the user's own traceback first, unchanged
    assert capsys.readouterr().err.startswith(f"{PREFIX} (worker-1): {tmp_path / 'out'}")
    monkeypatch.delenv("TF_CONFIG")
    sys.excepthook(type(error), error, error.__traceback__)
    assert capsys.readouterr().err == ""  # one process: nobody else wrote it
    RUNTIME.replacement("shared_path_line").remove()
    assert sys.excepthook(type(error), error, error.__traceback__) is None and printed == ["traceback"] * 3


def test_a_worker_prints_the_line_last(tmp_path):
    """End to end in a real interpreter: the script's own os.makedirs races (the second call is the peer)."""
    script = tmp_path / "train.py"
    script.write_text("import os\nos.makedirs('out')\nos.makedirs('out')\n")
    env = {**os.environ, "TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                                                  "task": {"type": "worker", "index": 1}})}
    code = "from tfstrategy.multiworker.file_races import install_excepthook; install_excepthook(); " \
           f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1
    assert "FileExistsError" in lines[-2]
    assert lines[-1].startswith(f"{PREFIX} (worker-1): out: it already existed")


def test_the_launcher_headline_carries_the_line():
    from tfstrategy.launch.diagnosis import failure_reason

    lines = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>',
             "FileExistsError: [Errno 17] File exists: 'out'",
             f"{PREFIX} (worker-1): out: it already existed (another worker probably created it) (...). Let one ..."]
    reason = failure_reason(1, lines, None, joined=True)
    assert reason.startswith("exited with status 1: FileExistsError: [Errno 17] File exists: 'out'; "
                             "two workers wrote one path (worker-1): out: it already existed")

