"""The scope audit, on the mistakes users make with step 2, on 1 and 4 logical-CPU replicas.

Each mistake is built for real; the audit must name the offending variables and
the line of this file that created them, and the guards must stop ``fit``.
"""

from __future__ import annotations

import gc
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from tfstrategy import audit_scope, require_scope, scope_guard
from tfstrategy.errors import BuildError, ScopeError
from tfstrategy.patches import keras_compile_scope
from tfstrategy.scope.audit import AuditReport, guard_model
from tfstrategy.scope.creation_sites import recording, site_of

THIS_FILE = Path(__file__).read_text().splitlines()


@pytest.fixture(autouse=True)
def collect_the_fits_this_test_stopped():
    """Collect each test's garbage at its end, while no function is being traced.

    The guards stop ``fit`` after Keras made its distributed iterator. Left to Python's own
    collection, that iterator's destructor ran inside a later test's trace of ``fit`` on 4
    replicas and waited 80-240 s there (py-spy: ``~MultiDeviceIterator`` waiting for its
    thread under ``extract_stack``); collected here it takes under a second.
    """
    yield
    gc.collect()
X = np.ones((16, 4), "float32")
Y = np.ones((16, 1), "float32")
REPLICAS = [pytest.param(1, id="1-replica"), pytest.param(4, id="4-replicas")]
REPLICAS_TEXT = {1: "1 replica", 4: "4 replicas"}


def line_of(marker: str) -> str:
    """``test_audit.py:N`` of the line tagged ``# site: marker``."""
    numbers = [i for i, line in enumerate(THIS_FILE, 1) if line.rstrip().endswith(f"# site: {marker}")]
    assert len(numbers) == 1, marker
    return f"test_audit.py:{numbers[0]}"


def selection_for(replicas: int) -> tfstrategy.Selection:
    return tfstrategy.select(devices=[f"/cpu:{i}" for i in range(replicas)], env={})


def tiny_model() -> keras.Model:
    inputs = keras.Input(shape=(4,))
    outputs = keras.layers.Dense(1)(inputs)  # site: model
    return keras.Model(inputs, outputs)


# Each mistake returns the model and which (owner, marker) pairs the audit must name.
def adam_outside(strategy, tmp_path):
    optimizer = keras.optimizers.Adam()  # site: adam
    with strategy.scope():
        model = tiny_model()
        model.compile(optimizer, "mse")
    return model, {("optimizer", "adam")}


def sgd_momentum_outside(strategy, tmp_path):
    optimizer = keras.optimizers.SGD(momentum=0.9)  # site: sgd-momentum
    with strategy.scope():
        model = tiny_model()
        model.compile(optimizer, "mse")
    return model, {("optimizer", "sgd-momentum")}


def sgd_outside(strategy, tmp_path):
    optimizer = keras.optimizers.SGD()  # site: sgd
    with strategy.scope():
        model = tiny_model()
        model.compile(optimizer, "mse")
    return model, {("optimizer", "sgd")}


def model_outside_compiled_inside(strategy, tmp_path):
    model = tiny_model()
    with strategy.scope():
        model.compile("adam", "mse")
    return model, {("model", "model")}


def model_and_optimizer_outside(strategy, tmp_path):
    model = tiny_model()
    optimizer = keras.optimizers.Adam()  # site: both-adam
    with strategy.scope():
        model.compile(optimizer, "mse")
    return model, {("model", "model"), ("optimizer", "both-adam")}


def metric_outside(strategy, tmp_path):
    metric = keras.metrics.MeanAbsoluteError()  # site: metric
    with strategy.scope():
        model = tiny_model()
        model.compile("adam", "mse", metrics=[metric])
    return model, {("metric", "metric")}


def keras_file_loaded_outside(strategy, tmp_path):
    with strategy.scope():
        saved = tiny_model()
        saved.compile("adam", "mse")
    saved.save(tmp_path / "model.keras")
    model = keras.models.load_model(tmp_path / "model.keras")  # site: load-keras
    return model, {("model", "load-keras"), ("optimizer", "load-keras"), ("metric", "load-keras")}


# keras_callback_reaches: False where Keras fails inside fit() before any
# callback runs (it builds the compiled optimizer first).
MISTAKES = [
    pytest.param(adam_outside, False, id="adam-outside"),
    pytest.param(sgd_momentum_outside, False, id="sgd-momentum-outside"),
    pytest.param(sgd_outside, True, id="plain-sgd-outside"),
    pytest.param(model_outside_compiled_inside, True, id="model-outside-compiled-inside"),
    pytest.param(model_and_optimizer_outside, True, id="model-and-optimizer-outside"),
    pytest.param(metric_outside, True, id="metric-outside"),
    pytest.param(keras_file_loaded_outside, True, id="keras-file-loaded-outside"),
]


def assert_names_offenders(message: str, report: AuditReport, expected: set[tuple[str, str]]) -> None:
    named = {(record.owner, record.site.rsplit("/", 1)[-1]) for record in report.offenders if record.site}
    assert named == {(owner, line_of(marker)) for owner, marker in expected}
    assert all(record.site for record in report.offenders), report.lines()
    groups: dict[tuple[str, str], list[str]] = {}
    for record in report.offenders:
        groups.setdefault((record.owner, record.site), []).append(record.path)
    for paths in groups.values():  # the message shows up to 4 names per site
        assert all(path in message for path in paths[:4])
        assert len(paths) <= 4 or f"and {len(paths) - 4} more" in message
    for owner, marker in expected:
        assert f"{owner} variables created at " in message and line_of(marker) in message


@pytest.mark.parametrize("replicas", REPLICAS)
@pytest.mark.parametrize(("mistake", "keras_callback_reaches"), MISTAKES)
def test_audit_names_each_offender_and_the_guards_stop_fit(mistake, keras_callback_reaches, replicas, tmp_path):
    selection = selection_for(replicas)
    model, expected = mistake(selection.strategy, tmp_path)

    report = audit_scope(model, selection)
    assert not report.passed
    with pytest.raises(ScopeError) as raised:
        require_scope(model, selection)
    message = str(raised.value)
    assert f"MirroredStrategy ({REPLICAS_TEXT[replicas]})" in message
    assert_names_offenders(message, report, expected)

    callback = scope_guard(selection)
    if keras_callback_reaches:
        with pytest.raises(ScopeError) as stopped:
            model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])
        # Same offenders and fix; only the total grows as fit() builds the optimizer and metrics.
        assert str(stopped.value).splitlines()[1:] == message.splitlines()[1:]
    else:
        # Measured: Keras builds the optimizer in fit() before callbacks run and fails with this.
        with pytest.raises(RuntimeError, match="Mixing different tf.distribute.Strategy objects"):
            model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[callback])

    guarded = guard_model(mistake(selection.strategy, tmp_path)[0], selection)
    with pytest.raises(ScopeError) as stopped:
        guarded.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    assert "were not created in the scope of MirroredStrategy" in str(stopped.value)
    assert guarded.optimizer.iterations.numpy() == 0  # not one step ran


@pytest.mark.parametrize("replicas", [REPLICAS[0], pytest.param(4, id="4-replicas", marks=pytest.mark.slow)])  # 4: 10 s
def test_correct_build_passes_before_and_after_fit(replicas):
    selection = selection_for(replicas)
    with selection.scope():
        model = tiny_model()
        model.compile("adam", "mse", metrics=["mae"])
    before = require_scope(model, selection)
    assert before.counts() == {"model": 2, "optimizer": 2, "metric": 2}
    guard_model(model, selection)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[scope_guard(selection)])
    after = require_scope(model, selection)
    assert after.passed and after.optimizer_built
    assert after.counts() == {"model": 2, "optimizer": 6, "metric": 4}
    assert int(model.optimizer.iterations.numpy()) == 2


@pytest.mark.parametrize("replicas", REPLICAS)
def test_unbuilt_optimizer_is_flagged_for_custom_loops(replicas):
    selection = selection_for(replicas)
    with selection.scope():
        model = tiny_model()
        optimizer = keras.optimizers.Adam()
    assert audit_scope(model, selection, optimizer=optimizer).passed
    with pytest.raises(ScopeError, match=r"optimizer Adam has no slot variables yet.*optimizer\.build"):
        require_scope(model, selection, optimizer=optimizer, require_built_optimizer=True)
    with selection.scope():
        optimizer.build(model.trainable_variables)
    assert require_scope(model, selection, optimizer=optimizer, require_built_optimizer=True).optimizer_built


def test_guard_audits_again_when_the_optimizer_is_replaced():
    selection = selection_for(4)
    with selection.scope():
        model = tiny_model()
        model.compile("adam", "mse")
    guard_model(model, selection)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    # Keras' own compile(): with keras_compile_scope installed the stray optimizer would be re-created in scope.
    keras_compile_scope.PATCH.remove()
    try:
        model.compile(keras.optimizers.Adam(), "mse")  # site: recompiled
        with pytest.raises(ScopeError, match=line_of("recompiled")):
            model.train_on_batch(X, Y)
    finally:
        keras_compile_scope.PATCH.apply()


def test_audit_lists_every_variable_with_owner_scope_and_site():
    selection = selection_for(4)
    metric = keras.metrics.Mean()  # site: extra-metric
    with selection.scope():
        model = tiny_model()
        model.compile("sgd", "mse")  # site: sgd-compile
    report = audit_scope(model, selection, metrics=[metric])
    rows = {(r.owner, r.path, r.in_scope, r.site.rsplit("/", 1)[-1]) for r in report.variables}
    assert rows == {
        ("model", model.weights[0].path, True, line_of("model")),
        ("model", model.weights[1].path, True, line_of("model")),
        ("optimizer", model.optimizer.iterations.path, True, line_of("sgd-compile")),
        ("optimizer", model.optimizer.variables[1].path, True, line_of("sgd-compile")),
        ("metric", "loss/total", True, line_of("sgd-compile")),
        ("metric", "loss/count", True, line_of("sgd-compile")),
        ("metric", metric.variables[0].path, False, line_of("extra-metric")),
        ("metric", metric.variables[1].path, False, line_of("extra-metric")),
    }
    assert report.lines()[0] == "8 variables, 2 outside MirroredStrategy (4 replicas)"


def test_sites_are_recorded_inside_and_outside_a_mirrored_scope():
    strategy = selection_for(4).strategy
    with recording():
        plain = tf.Variable(1.0)  # site: plain
        with strategy.scope():
            mirrored = tf.Variable(2.0)  # site: mirrored
    assert site_of(plain).endswith(line_of("plain"))
    assert site_of(mirrored).endswith(line_of("mirrored"))
    assert all(site_of(component).endswith(line_of("mirrored")) for component in mirrored.values)


def test_bad_strategy_argument_is_a_build_error():
    with pytest.raises(BuildError, match="expected a tf.distribute.Strategy or a tfstrategy.Selection"):
        audit_scope(tiny_model(), "mirrored")


def _export_model(strategy: tf.distribute.Strategy) -> tuple[keras.Model, keras.Model]:
    """Keras' text classification tutorial: a scope-built model, wrapped after training outside any scope."""
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    export = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4), model, keras.layers.Activation("sigmoid")])
    export.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model, export


@pytest.mark.parametrize("replicas", REPLICAS)
def test_export_model_wrapping_a_scope_built_model_used_without_a_strategy_is_not_a_finding(replicas):
    # Regression: "3 of 7 variables were not created in the scope of _DefaultDistributionStrategy".
    strategy = selection_for(replicas).strategy
    model, export = _export_model(strategy)
    report = audit_scope(export, tf.distribute.get_strategy())
    assert report.passed, report.message()
    assert len(report.variables) > len(model.weights)  # the wrapped model's variables were checked, not skipped
    loss, _ = export.evaluate(X, np.ones((16, 1), "float32"), verbose=0)  # and plain TensorFlow agrees: it runs
    assert np.isfinite(loss)


def test_a_nested_model_of_another_strategy_is_still_a_finding_under_a_real_strategy():
    first, second = selection_for(2).strategy, selection_for(4).strategy
    with first.scope():
        inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with second.scope():
        outer = keras.Sequential([keras.Input((4,)), inner])
    report = audit_scope(outer, second)
    assert not report.passed
    assert {record.path for record in report.offenders} == {v.path for v in inner.weights}
