"""Issue 36's fit-path bugs in one unchanged script under ``tfstrategy launch -n 2``, against one process.

``tests/workers/issue36_script.py``: compile() after the scope (keras_compile_scope), a legacy Adam
(keras_legacy_optimizers) and an uneven last batch (keras_uneven_batches), on 2 workers of a
MultiWorkerMirroredStrategy. Each worker must end with the one-process weights and report the job's loss.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import ROOT
from tfstrategy import _versions
from tfstrategy.patches import apply_patches

SCRIPT = ROOT / "tests" / "workers" / "issue36_script.py"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.skipif(_versions.legacy_keras_requested(), reason="the bugs are Keras 3's")
def test_two_workers_run_the_unchanged_script_like_one_process(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-m", "tfstrategy", "launch", "-n", "2", "--timeout", "120", "--",
                           sys.executable, str(SCRIPT), "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tf.keras.optimizers.legacy.Adam does not exist in Keras 3" in done.stdout + done.stderr
    apply_patches()
    spec = importlib.util.spec_from_file_location("issue36_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model, history, evaluation = script.train(tf.distribute.OneDeviceStrategy("/cpu:0"))
    for index in range(2):
        result = json.loads((tmp_path / f"worker-{index}.json").read_text())
        for got, want in zip(result["weights"], model.get_weights()):
            np.testing.assert_allclose(np.array(got), want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(result["history"]["loss"], history["loss"], atol=1e-5, rtol=0)
        np.testing.assert_allclose(result["evaluation"], evaluation, atol=1e-5, rtol=0)
