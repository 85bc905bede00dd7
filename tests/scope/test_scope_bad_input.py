"""build_in_scope, restore and creation sites on bad input (issue 13)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import keras
import pytest
import tensorflow as tf

import tfstrategy
from helpers import ROOT
from tfstrategy import build_in_scope, restore_checkpoint
from tfstrategy.errors import BuildError, CheckpointError, ScopeError
from tfstrategy.scope.creation_sites import recording, site_of


def _selection(replicas: int = 2) -> tfstrategy.Selection:
    return tfstrategy.select(devices=[f"/cpu:{i}" for i in range(replicas)], env={})


def _model() -> keras.Model:
    inputs = keras.Input(shape=(4,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


def test_scope_error_from_build_in_scope_does_not_advise_build_in_scope():
    optimizer = keras.optimizers.Adam()  # outside the scope
    with pytest.raises(ScopeError) as caught:
        build_in_scope(_selection(), _model, optimizer=optimizer, loss="mse")
    assert "build_in_scope()" not in str(caught.value)
    assert str(caught.value).splitlines()[-1].startswith("Expected the model, optimizer and metrics to be created inside")


@pytest.mark.parametrize("checkpoint", [pytest.param(123, id="int"), pytest.param(["ckpt"], id="list")])
def test_checkpoint_of_the_wrong_type_is_refused_before_building(checkpoint):
    with pytest.raises(BuildError, match=rf"Received checkpoint={re.escape(repr(checkpoint))} \({type(checkpoint).__name__}\); expected a path"):
        build_in_scope(_selection(), _model, optimizer="sgd", loss="mse", checkpoint=checkpoint)
    with pytest.raises(CheckpointError, match="expected a path"):
        restore_checkpoint(_model(), checkpoint)


@pytest.mark.parametrize("name", ["x.weights.h5", "x.keras"])
def test_a_directory_with_a_file_ending_is_called_a_directory(tmp_path, name):
    (tmp_path / name).mkdir()
    with pytest.raises(CheckpointError, match=f"Received checkpoint='.*{name}', a directory; expected a"):
        build_in_scope(_selection(), _model, optimizer="sgd", loss="mse", checkpoint=tmp_path / name)


_UNREADABLE = """
import sys
from tfstrategy.errors import CheckpointError
from tfstrategy.scope.restore import restore_checkpoint
try:
    restore_checkpoint(None, sys.argv[1])
except CheckpointError as error:
    print(error)
"""


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_an_unreadable_checkpoint_directory_says_permission_denied():
    """It was reported as a directory with no checkpoint in it."""
    base = Path(tempfile.mkdtemp(prefix="tfstrategy-unreadable-", dir="/tmp"))
    try:
        base.chmod(0o755)
        directory = base / "ckpts"
        directory.mkdir(mode=0o700)
        (directory / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n')
        command = [sys.executable, "-c", _UNREADABLE, str(directory)]
        if os.geteuid() == 0:  # root reads everything: ask as nobody
            if shutil.which("setpriv") is None:
                pytest.skip("running as root without setpriv")
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        else:
            directory.chmod(0o000)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd="/tmp")
        assert "a directory this process may not read (permission denied)" in result.stdout, result.stderr[-2000:]
    finally:
        (base / "ckpts").chmod(0o700)
        shutil.rmtree(base)


_LAYER = keras.layers.Dense(1)


@tf.function
def _first_eval_step(x):
    return _LAYER(x)  # the layer's variables are created here, on the first trace


def test_a_variable_first_created_in_a_tf_function_is_placed_at_the_user_line():
    """It was reported at autograph's __autograph_generated_file....py."""
    with recording():
        _first_eval_step(tf.ones((2, 3)))
    line = Path(__file__).read_text().splitlines().index("    return _LAYER(x)  # the layer's variables are created here, on the first trace") + 1
    assert site_of(_LAYER.kernel) == f"{os.path.relpath(__file__)}:{line}"
