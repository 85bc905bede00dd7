"""Data of unknown size on 2 replicas: the optimizer takes the data's steps, every run (fresh processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfstrategy.patches import apply_patches, keras_end_of_data

WORKER = Path(__file__).with_name("steps_worker.py")
#: Fresh runs per mode. Plain Keras' fit took 4, 5 or 6 steps from run to run (never 4 in 8 runs measured), and
#: the fix is chosen by a probe of that race in each process: 5 fresh runs tell them apart. The custom loop steps
#: from Python's ``for`` over the dataset, which ends before a step when the data does (no race): 2 runs.
RUNS = {"fit": 5, "loop": 2}


def _steps(mode: str) -> int:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, str(WORKER), mode], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    line = [text for text in done.stdout.splitlines() if text.startswith("optimizer_steps")][-1]
    return int(line.split()[1])


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["fit", "loop"])
def test_fresh_runs_take_exactly_the_datas_steps(mode):
    # 10 examples, batches of 4 with the remainder dropped: 2 steps an epoch, 4 in 2 epochs.
    # Before the keras_end_of_data patch fit took 4, 5 or 6 from run to run.
    assert [_steps(mode) for _ in range(RUNS[mode])] == [4] * RUNS[mode]


def test_upstream_keras_still_steps_past_the_end():
    """Canary: fails once Keras' spe=1 function stops counting a step on an exhausted iterator."""
    import tensorflow as tf  # noqa: F401 - the probe runs ops

    keras_end_of_data.PATCH._probed = None
    assert keras_end_of_data.PATCH.needed() is True


def test_the_probe_answers_alike_inside_a_multi_replica_scope():
    """Every worker of a job must choose the same train function: the probe's stand-in runs on one device,
    where the bug always shows, whatever strategy scope the first fit calls it in (on 2 replicas it shows
    only by the scheduling's luck, and a worker that missed it built Keras' function: the job hung)."""
    import tensorflow as tf  # noqa: F401 - the probe runs ops

    from helpers import mirrored

    strategy = mirrored(2)
    answers = []
    for _ in range(6):
        keras_end_of_data.PATCH._probed = None
        with strategy.scope():
            answers.append(keras_end_of_data.PATCH.needed())
    assert answers == [True] * 6


def test_every_worker_of_a_job_builds_the_fix_whatever_its_own_probe_found(monkeypatch):
    """The probe's race may miss the bug on one worker; in a multi-worker job no worker's probe decides."""
    from types import SimpleNamespace

    from tfstrategy import _compat
    from tfstrategy.patches.mechanism import ProbeResult

    model = SimpleNamespace(run_eagerly=False, jit_compile=False, steps_per_execution=1, distribute_strategy=object())
    monkeypatch.setattr(keras_end_of_data.PATCH, "_probed", ProbeResult({keras_end_of_data._TARGET: False}))
    monkeypatch.setattr(_compat, "in_multi_worker_mode", lambda strategy: True)
    assert keras_end_of_data.fix_needed(model) is True
    monkeypatch.setattr(_compat, "in_multi_worker_mode", lambda strategy: False)
    assert keras_end_of_data.fix_needed(model) is False  # one process: its probe decides


def test_the_fixed_function_counts_no_step_past_the_end():
    import keras
    import numpy as np
    import tensorflow as tf

    import tfstrategy
    from helpers import mirrored

    apply_patches()
    strategy = mirrored(2)

    def examples():
        for i in range(10):
            yield np.full((2,), i, "float32"), np.float32(i)

    source = tf.data.Dataset.from_generator(
        examples, output_signature=(tf.TensorSpec((2,), tf.float32), tf.TensorSpec((), tf.float32))
    )
    data = tfstrategy.prepare_dataset(source, strategy, global_batch=4)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    for _ in range(3):
        model.fit(data, epochs=2, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 12
    assert keras_end_of_data.PATCH.installed("TensorFlowTrainer.make_train_function")
