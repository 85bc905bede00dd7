"""`tfstrategy launch -n 2`: mixed precision trains like one process; the sentinel stops a drifting worker."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import ROOT
from tfstrategy.diagnostics.equivalence import TOLERANCES
from tfstrategy.patches import apply_patches

FIT_WORKER = ROOT / "tests" / "workers" / "fit_worker.py"
DIVERGE_WORKER = ROOT / "tests" / "workers" / "diverge_worker.py"


def _launch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, "-m", "tfstrategy", "launch", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _fit_worker():
    spec = importlib.util.spec_from_file_location("fit_worker", FIT_WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_two_workers_under_a_policy_fit_like_one_process(policy, tmp_path):
    done = _launch("-n", "2", "--timeout", "120", "--precision", policy, "--",
                   sys.executable, str(FIT_WORKER), "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    import keras
    import tensorflow as tf


    apply_patches()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model, history = _fit_worker().train(tf.distribute.get_strategy(), epochs=3)
        assert model.layers[0].compute_dtype == policy.removeprefix("mixed_")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    for index in range(2):
        result = json.loads((tmp_path / f"worker-{index}.json").read_text())
        assert result["steps"] == 24
        for got, want in zip(result["weights"], model.get_weights()):
            np.testing.assert_allclose(np.array(got), want, atol=TOLERANCES[policy], rtol=0)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_default_sentinel_stops_a_drifting_worker_naming_it():
    done = _launch("-n", "2", "--timeout", "120", "--", sys.executable, str(DIVERGE_WORKER))
    assert done.returncode != 0
    assert "trained to the end" not in done.stdout
    assert "DivergenceError: Received different weights at step 8: replica 1 (worker 1)" in done.stdout + done.stderr
    off = _launch("-n", "2", "--console-workers", "all", "--timeout", "120", "--sentinel", "off", "--", sys.executable,
                  str(DIVERGE_WORKER))
    assert off.returncode == 0, off.stderr[-3000:]
    assert off.stdout.count("trained to the end") == 2
