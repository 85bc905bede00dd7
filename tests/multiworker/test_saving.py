"""save_model: the chief writes the real path, other workers a temporary one that disappears.

The rule itself (chief_files.chief_write) is tested in test_chief_files.py.

With real workers under MultiWorkerMirroredStrategy: see test_launch.py.
"""

from __future__ import annotations

import json
import tempfile

import keras
import numpy as np
import pytest

from tfstrategy import save_model
from tfstrategy.errors import SaveError

CLUSTER = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


def _env(index):
    return {"TF_CONFIG": json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": index}})}


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.parametrize("name", ["model.keras", "w.weights.h5"])
def test_chief_writes_the_path(tmp_path, name):
    model = _model()
    path = tmp_path / "out" / name
    assert save_model(model, path, env=_env(0)) == path
    if name.endswith(".keras"):
        restored = keras.saving.load_model(path)
    else:
        restored = _model()
        restored.load_weights(path)
    for a, b in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_other_workers_write_a_temporary_copy_that_is_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    (tmp_path / "tmp").mkdir()
    assert save_model(_model(), tmp_path / "model.keras", env=_env(1)) is None
    assert not (tmp_path / "model.keras").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


def test_unsupported_path_says_what_works(tmp_path):
    with pytest.raises(SaveError, match=r"expected a file ending in .keras or .weights.h5"):
        save_model(_model(), tmp_path / "model.h5", env={})
