"""What a Ray Train worker does to a process, reproduced without Ray (fast tier).

Ray Train imports TensorFlow (and uses ``tf.keras``) in each worker, then sets
``TF_USE_LEGACY_KERAS=1`` and runs the training function in a thread that ends
with the run. tfstrategy must read the Keras flavour from what ``tf.keras`` is
and leave nothing in that thread to clean up; ``tests/integrations/test_ray.py``
runs the same on a real Ray cluster.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading

import pytest
import tensorflow as tf

from helpers import ROOT, mirrored
from tfstrategy import _compat, _versions
from tfstrategy.errors import ClusterConfigError, MissingDependencyError, PlatformError
from tfstrategy.integrations import ray as tfs_ray
from tfstrategy.scope.creation_sites import site_of, start_recording

LEGACY = _versions.legacy_keras_requested()

RAY_LIKE_WORKER = r"""
import json, os, sys, threading
import tensorflow as tf
import tfstrategy
from tfstrategy import _compat, _versions
from tfstrategy.scope.creation_sites import site_of
original = os.environ.get("TF_USE_LEGACY_KERAS")
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras not used yet: TensorFlow will read the variable
result = {"unresolved": [str(_compat.resolved_tf_keras()), _versions.keras_package()]}
if original is None:
    del os.environ["TF_USE_LEGACY_KERAS"]
else:
    os.environ["TF_USE_LEGACY_KERAS"] = original
tf.keras.layers  # Ray's worker set-up uses tf.keras, so TensorFlow resolves it now
os.environ["TF_USE_LEGACY_KERAS"] = "0" if sys.argv[1] == "tf_keras" else "1"  # the opposite, set afterwards

def training_thread():
    selection = tfstrategy.select(strategy="mirrored", cpu_replicas=2)  # TensorFlow imported, no op run yet
    with selection.scope():
        variable = tf.Variable(1.0)
    result.update(replicas=selection.num_replicas, steps=[name for name, _ in selection.steps],
                  site=site_of(variable), package=tfstrategy._versions.keras_package())

thread = threading.Thread(target=training_thread, name="TrainingThread")
thread.start()
thread.join()
del thread
import gc; gc.collect()
print(json.dumps(result), flush=True)
"""


def test_flavour_then_select_in_a_thread_after_the_variable_flips_and_the_thread_ends_cleanly():
    flavour = "tf_keras" if LEGACY else "keras"
    env_code = "import os; os.environ.pop('TFSTRATEGY_STRATEGY', None)"
    result = subprocess.run(
        [sys.executable, "-c", f"{env_code}\n{RAY_LIKE_WORKER}", flavour],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["unresolved"] == ["None", "tf_keras"]  # before tf.keras is used, the variable decides
    assert report["package"] == flavour  # after, what it resolved to, not what the variable set later says
    assert report["replicas"] == 2 and report["steps"][:2] == ["split_cpu", "record_creation_sites"]
    assert report["site"] is not None and report["site"].startswith("<string>:")
    # Before: "Exception ignored in: <generator object recording> ... '_thread._local' object has no
    # attribute '_variable_creator_stack'" when the thread's recording context was collected.
    assert "Exception ignored" not in result.stderr and "_variable_creator_stack" not in result.stderr, result.stderr


def test_flavour_is_what_tf_keras_resolved_to_whatever_the_variable_says_now(monkeypatch):
    assert tf.keras.layers is not None  # resolves tf.keras (conftest and other tests use it anyway)
    resolved = "tf_keras" if LEGACY else "keras"
    assert _compat.resolved_tf_keras() == resolved
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0" if LEGACY else "1")
    assert _versions.keras_package() == resolved
    assert _versions.detect().keras_package == resolved
    _versions.require_supported()  # Ray's TF_USE_LEGACY_KERAS=1 with Keras 3 loaded: no false refusal
    assert _compat.keras_for().__name__ == resolved
    # A preview of another process's environment still follows only its variable.
    assert _versions.detect({"TF_USE_LEGACY_KERAS": "1"}).keras_package == "tf_keras"


def test_recording_started_in_a_thread_that_ends_leaves_nothing_to_clean_up():
    unraisable = []
    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append
    sites = []

    def training_thread():
        assert start_recording()
        variable = tf.Variable(2.0)
        sites.append(site_of(variable))

    try:
        thread = threading.Thread(target=training_thread)
        thread.start()
        thread.join()
        del thread
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert sites and sites[0].startswith("tests/integrations/test_ray_worker_conditions.py:")
    assert [str(u.exc_value) for u in unraisable] == []


def test_importing_the_integration_imports_neither_ray_nor_tensorflow():
    code = "import sys, tfstrategy, tfstrategy.integrations.ray; print('ray' in sys.modules, 'tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_prepare_outside_a_ray_worker_is_refused_clearly():
    """In .venv Ray is not installed (make test); tests/integrations/test_ray.py has the case with it."""
    try:
        import ray.train  # noqa: F401
    except ImportError:
        expected, message = MissingDependencyError, r"needs Ray Train.*pip install 'tfstrategy\[ray\]'"
    else:
        expected, message = ClusterConfigError, r"prepare\(\) outside a Ray Train worker.*TensorflowTrainer"
    with pytest.raises(expected, match=message):
        tfs_ray.prepare(lambda: None)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, r"without a readable tfstrategy\.json", id="missing"),
        pytest.param("{not json", r"without a readable tfstrategy\.json", id="corrupt"),
        pytest.param('{"epoch": "2", "step": 16, "prefix": "ckpt-1"}', r'expected \{"epoch": <int>, "step": <int>', id="wrong-types"),
        pytest.param('{"epoch": 2, "step": 16, "prefix": "../ckpt-1"}', r'"prefix": <file name>\}', id="prefix-outside"),
    ],
)
def test_a_ray_checkpoint_not_written_by_tfstrategy_is_refused(tmp_path, content, message):
    from tfstrategy.errors import CheckpointError

    if content is not None:
        (tmp_path / tfs_ray.STATE_FILE).write_text(content)
    with pytest.raises(CheckpointError, match=message):
        tfs_ray._read_state(str(tmp_path), str(tmp_path))


def test_preemption_callbacks_refuse_a_thread_that_cannot_handle_sigterm(tmp_path):
    import tfstrategy

    errors = []

    def training_thread():
        try:
            with mirrored(1).scope():
                tfstrategy.preemption_callbacks(tmp_path / "backups")
        except PlatformError as error:
            errors.append(str(error))

    thread = threading.Thread(target=training_thread, name="TrainingThread(train_fn)")
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert "thread 'TrainingThread(train_fn)'" in errors[0] and "tfstrategy.integrations.ray" in errors[0]
