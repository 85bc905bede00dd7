"""save_model and backup_callbacks turn filesystem errors into tfstrategy errors (issue 13)."""

from __future__ import annotations

import keras
import pytest

import tfstrategy
from tfstrategy.errors import SaveError


def _model() -> keras.Model:
    inputs = keras.Input(shape=(2,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        pytest.param(lambda tmp: tmp / "file" / "model.keras", r"cannot be written: .*file is a file, not a directory", id="parent-is-a-file"),
        pytest.param(lambda tmp: tmp / "file" / "sub" / "model.weights.h5", r"cannot be written: .*file is a file, not a directory", id="ancestor-is-a-file"),
        pytest.param(lambda tmp: tmp / "dir.keras", r"cannot be written: it is a directory \(.*dir.keras\)", id="target-is-a-directory"),
        pytest.param(lambda tmp: 123, r"Received path=123 \(int\); expected a file path", id="path-an-int"),
    ],
)
def test_save_model_filesystem_errors_are_save_errors(tmp_path, make_path, message):
    (tmp_path / "file").write_text("not a directory")
    (tmp_path / "dir.keras").mkdir()
    with pytest.raises(SaveError, match=message):
        tfstrategy.save_model(_model(), make_path(tmp_path), env={})


def test_backup_callbacks_with_an_unusable_directory_is_a_save_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(SaveError, match=r"Received backup_dir='.*file/backups'; the backup directory .* cannot be created"):
        tfstrategy.backup_callbacks(tmp_path / "file" / "backups")


def test_backup_callbacks_names_the_variable_when_the_directory_came_from_it(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("TFSTRATEGY_BACKUP_DIR", str(tmp_path / "file"))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(SaveError, match=r"Received TFSTRATEGY_BACKUP_DIR='.*file'; .*tfstrategy launch --backup-dir"):
        tfstrategy.backup_callbacks()


def test_save_model_of_something_else_than_a_model_is_a_save_error(tmp_path):
    with pytest.raises(SaveError, match=r"Received model of type NoneType; expected a Keras model"):
        tfstrategy.save_model(None, tmp_path / "model.keras", env={})
