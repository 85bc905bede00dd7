"""The performance report on real TensorFlow: it names each workload's bottleneck and leaves training as it was."""

from __future__ import annotations

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from helpers import ROOT, mirrored
from tfstrategy.performance.report import tracker_for

sys.path.insert(0, str(ROOT / "tests" / "workers"))
import profile_script  # noqa: E402

pytestmark = pytest.mark.slow


#: These fits train a second or less: every probe may run, however long it takes against that (by default the
#: probes may take a tenth of the time trained).
ALLOW = 10_000


def _fit(strategy, kind, *, report=None, epochs=1, probe_share=ALLOW):
    with strategy.scope():
        model = profile_script.model(kind)
    data = profile_script.dataset(kind, int(strategy.num_replicas_in_sync))
    callbacks = [tfstrategy.performance_report(data, probe_share=probe_share)] if report else None
    model.fit(data, epochs=epochs, verbose=0, callbacks=callbacks)
    return model


@pytest.mark.parametrize(("kind", "replicas", "bottleneck"), [
    pytest.param("input", 1, "input", id="slow-map-1-replica"),
    pytest.param("compute", 4, "compute", id="cnn-4-replicas"),
])
def test_the_report_names_the_bottleneck(kind, replicas, bottleneck, capsys):
    model = _fit(mirrored(replicas), kind, report=True)
    (report,) = tracker_for(model).reports
    assert report.bottleneck == bottleneck, report.text()
    assert report.measurements.replicas == replicas and report.measurements.steps > 0
    text = capsys.readouterr().err
    assert text.startswith("tfstrategy performance report (one worker") and f"-> {bottleneck}-bound" in text
    (job,) = tracker_for(model).job_reports
    assert job.bottleneck == bottleneck and job.recommendations[0].part == bottleneck
    assert job.examples_per_second == pytest.approx(report.examples_per_second)
    if kind == "input":  # a sequential map: the fix names it
        assert "map(..., num_parallel_calls=tf.data.AUTOTUNE)" in report.recommendations[0].action
    else:  # 4 replicas: the all-reduce was probed
        m = report.measurements
        assert m.allreduce is not None and report.shares["reduction"] < 0.5
        assert m.data_step is not None and m.synthetic is not None


def _dropout_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.3),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def _seeded_run(report: bool):
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).shuffle(512, seed=5).batch(32)
    with mirrored(2).scope():
        model = _dropout_model()
    callbacks = ([tfstrategy.performance_report(data, every_minutes=1e-9, larger_k=True, probe_share=ALLOW)]
                 if report else None)
    first = model.fit(data, epochs=1, verbose=0, callbacks=callbacks).history
    second = model.fit(data, epochs=2, verbose=0, callbacks=callbacks).history  # a report at every epoch's end
    return model, first["loss"] + second["loss"], second["mae"]


def test_probes_in_the_middle_of_fit_leave_weights_data_order_and_metrics_as_they_were():
    reported, losses, mae = _seeded_run(report=True)
    plain, plain_losses, plain_mae = _seeded_run(report=False)
    assert len(tracker_for(reported).reports) == 3  # the first fit's end, then each epoch's end of the second
    np.testing.assert_allclose(losses, plain_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(mae, plain_mae, rtol=0, atol=1e-6)
    for a, b in zip(reported.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert int(reported.optimizer.iterations.numpy()) == int(plain.optimizer.iterations.numpy()) == 48
    assert tracker_for(reported).reports[-1].measurements.larger_k[0] == 4
    assert all(report.measurements.synthetic is not None for report in tracker_for(reported).reports)  # probed


def test_a_custom_loop_times_its_wait_for_input_directly(tmp_path, monkeypatch):
    monkeypatch.setenv("TFSTRATEGY_PROFILE_PROBES", str(ALLOW))
    strategy = mirrored(2)
    with strategy.scope():
        model = profile_script.model("input")
    step = tfstrategy.make_train_step(model, strategy=strategy, global_batch=64, loss=keras.losses.MeanSquaredError(
        reduction="none"), report=True)
    batches = strategy.experimental_distribute_dataset(profile_script.dataset("input"))
    step.run_epoch(batches)
    (report,) = step.report.reports
    assert report.bottleneck == "input", report.text()
    assert report.measurements.waited is not None and report.measurements.synthetic is not None  # on its last batch
    assert report.measurements.allreduce is not None  # 2 replicas: the reduction is probed


def test_at_the_default_share_a_short_fit_is_timed_but_not_probed(capsys):
    model = _fit(mirrored(1), "input", report=True, probe_share=None)
    (report,) = tracker_for(model).reports
    (job,) = tracker_for(model).job_reports
    m = report.measurements
    assert m.synthetic is None and "probes' budget" in m.not_probed["synthetic and input"]
    # No probe ran (the report's own reading of the pipeline's graph is what its cost line counts: a few ms, which
    # on a loaded machine is more than 10% of this 0.3 s fit, so its share is not asserted).
    assert m.data_step is None and m.allreduce is None and m.larger_k is None
    assert job.bottleneck == "unsplit" and job.probe_share == 0.1
    assert "allowed 10%" in capsys.readouterr().err
