"""The Keras-3 fit-on-MultiWorkerMirroredStrategy fix: still needed, and inert elsewhere.

The end-to-end proof (2 workers' fit equal to one process) is in tests/launch/test_launch.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute.values import PerReplica

from tfstrategy import _versions
from tfstrategy.errors import StrategyError
from tfstrategy.patches import keras_mwms as mwms

pytestmark = [
    pytest.mark.smoke,
    # These tests build their models through tf.keras; under TF_USE_LEGACY_KERAS=1 that is tf_keras,
    # which never had this bug: nothing to patch, nothing to watch.
    pytest.mark.skipif(
        _versions.legacy_keras_requested() or mwms.PATCH.target_module() is None,
        reason="tf.keras is not Keras 3 on TensorFlow: the bug never existed here",
    ),
]



@pytest.fixture
def fixed():
    status = mwms.PATCH.apply()
    yield status
    mwms.PATCH.remove()


def _probe_now():
    """Probe Keras' own functions afresh (the patch caches its probe)."""
    return mwms.MWMSPatch().probe()


def test_upstream_keras_still_has_both_bugs():
    """Fails once Keras fixes either bug: then drop that part of keras_mwms (and bump verified_up_to)."""
    found = _probe_now()
    version = keras.__version__
    assert found[mwms.BUILD], f"Keras {version} no longer reduces a whole batch nest under MWMS: remove the build part"
    assert found[mwms.REDUCE], f"Keras {version} no longer reduces scalars along axis 0 under MWMS: remove the reduce part"


def test_apply_installs_the_needed_parts_and_remove_restores_keras():
    from keras.src.backend.tensorflow import trainer

    mwms.PATCH.remove()  # select() in earlier tests installed it
    build, reduce = trainer.TensorFlowTrainer._maybe_symbolic_build, trainer.reduce_per_replica
    status = mwms.PATCH.apply()
    try:
        assert status.installed == (mwms.BUILD, mwms.REDUCE)
        assert status.needed is True
        assert trainer.TensorFlowTrainer._maybe_symbolic_build is not build
        assert mwms.PATCH.apply().installed == (mwms.BUILD, mwms.REDUCE)  # idempotent
        assert mwms.PATCH.original(mwms.BUILD) is build  # the probe keeps testing Keras' own code
        assert any(_probe_now().values())
    finally:
        removed = mwms.PATCH.remove()
    assert removed.installed == ()
    assert (trainer.TensorFlowTrainer._maybe_symbolic_build, trainer.reduce_per_replica) == (build, reduce)


def test_fixed_functions_reduce_across_replicas_only(fixed):
    from keras.src.backend.tensorflow import trainer

    calls = []
    strategy = mwms.stand_in_strategy(calls)
    trainer.reduce_per_replica({"loss": PerReplica((np.float32(2.0),))}, strategy, "auto")
    assert [axis for _, axis in calls] == [None]

    built = []

    class Model:
        _distribute_strategy = distribute_strategy = strategy

        def _symbolic_build(self, iterator=None, data_batch=None):
            built.append(data_batch)

    x, y = np.ones((2, 3), "float32"), np.zeros((2, 1), "float32")
    calls.clear()
    # Each Keras release's epoch form: (begin, end, batches) from 3.11, (step, batches) before.
    for form in mwms.epoch_iterator_forms((PerReplica((x,)), PerReplica((y,)))):
        try:
            trainer.TensorFlowTrainer._maybe_symbolic_build(Model(), iterator=form)
            break
        except ValueError as error:
            assert "unpack" in str(error)
    assert calls == []  # no reduce, hence no collective, to build
    assert built[0][0] is x and built[0][1] is y
    assert "reduce" not in vars(strategy)  # the strategy's own reduce is back


class _MultiWorkerModel:
    _distribute_strategy = distribute_strategy = mwms.stand_in_strategy([])
    steps_per_execution = 4
    train_function = test_function = None

    def _symbolic_build(self, iterator=None, data_batch=None):
        pass


def test_several_steps_per_execution_install_the_multi_step_loop(fixed, monkeypatch):
    from keras.src.backend.tensorflow import trainer

    from tfstrategy.patches import keras_steps_per_execution as spe

    monkeypatch.setattr(spe, "fix_needed", lambda model: True)
    was_installed = spe.PATCH.installed("TensorFlowTrainer._make_function")
    model = _MultiWorkerModel()
    model.train_function = lambda iterator: None  # Keras' own loop, built before the patch
    try:
        trainer.TensorFlowTrainer._maybe_symbolic_build(model, data_batch=(np.zeros((2, 4), "float32"),))
        assert spe.PATCH.installed("TensorFlowTrainer._make_function")
        assert model.train_function is None  # rebuilt, through the fixed loop, by make_train_function
    finally:
        if not was_installed:
            spe.PATCH.remove()  # leave the process as it was found


def test_several_steps_per_execution_are_refused_when_the_loop_fix_is_unavailable(fixed, monkeypatch):
    from keras.src.backend.tensorflow import trainer

    from tfstrategy.patches import keras_steps_per_execution as spe

    monkeypatch.setattr(spe, "fix_needed", lambda model: False)
    monkeypatch.setattr(spe.PATCH, "needed", lambda: None)  # as after a failed probe
    with pytest.raises(StrategyError, match=r"steps_per_execution=4\) with MultiWorkerMirroredStrategy.*could not be "
                       r"installed.*steps_per_execution=1"):
        trainer.TensorFlowTrainer._maybe_symbolic_build(_MultiWorkerModel(), iterator=[])


def test_a_probe_that_fails_warns_once_and_leaves_keras_alone(monkeypatch):
    from keras.src.backend.tensorflow import trainer

    patch = mwms.MWMSPatch()
    build = trainer.TensorFlowTrainer._maybe_symbolic_build

    def broken_probe(module):
        raise AttributeError("'TensorFlowTrainer' has no attribute '_maybe_symbolic_build'")

    monkeypatch.setattr(patch, "run_probe", broken_probe)
    with pytest.warns(RuntimeWarning, match="could not probe keras .* leaving it unpatched") as warned:
        status = patch.apply()
        patch.apply()
    assert len(warned) == 1
    assert status.installed == () and status.needed is None
    assert "probe failed (AttributeError" in status.note
    assert trainer.TensorFlowTrainer._maybe_symbolic_build is build


def _fit_on_four_cpus():
    import keras

    keras.utils.set_random_seed(3)
    # Reduce without collective ops: their instance keys restart with every strategy and
    # clash with other tests' strategies in this process ("Shape mismatch in the collective").
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)], cross_device_ops=tf.distribute.ReductionToOneDevice())
    x = np.linspace(-1, 1, 64, dtype="float32").reshape(32, 2)
    y = x.sum(axis=1, keepdims=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return history.history, model.get_weights()


@pytest.mark.slow
def test_other_strategies_run_keras_own_code(fixed):
    with_fix = _fit_on_four_cpus()
    mwms.PATCH.remove()
    without = _fit_on_four_cpus()
    assert with_fix[0] == without[0]
    for a, b in zip(with_fix[1], without[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.multiprocess
def test_two_workers_fit_several_steps_per_execution_like_one(tmp_path):
    """Bug 3 end to end: K=3 under a real 2-worker MWMS equals K=1 (same job, same data)."""
    import json
    import sys

    from helpers import ROOT, run_cli

    worker = ROOT / "tests" / "workers" / "spe_mw_worker.py"
    result = run_cli("launch", "-n", "2", "--timeout", "120", "--", sys.executable, str(worker), str(tmp_path),
                     timeout=300)
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-2000:])
    for index in range(2):
        got = json.loads((tmp_path / f"worker-{index}.json").read_text())
        assert (got["strategy"], got["replicas"]) == ("CollectiveAllReduceStrategy", 2)
        one, several = got["k1"], got["k3"]
        assert several["fixed_loop"] and not one["fixed_loop"]
        assert one["steps"] == several["steps"] == 20
        for key, values in one["history"].items():
            np.testing.assert_allclose(several["history"][key], values, atol=1e-5, rtol=0, err_msg=key)
        for a, b in zip(one["weights"], several["weights"]):
            np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5, rtol=0)
