"""build_in_scope: build, compile, build the optimizer and restore in scope, across replica counts."""

from __future__ import annotations

import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfstrategy
from helpers import ROOT, run_example
from tfstrategy import build_in_scope, restore_checkpoint
from tfstrategy.errors import BuildError, CheckpointError, ScopeError

RNG = np.random.default_rng(0)
X = RNG.random((16, 4), dtype=np.float32)
Y = RNG.random((16, 1), dtype=np.float32)
STEPS = 2  # 16 samples, global batch 8


def selection_for(replicas: int) -> tfstrategy.Selection:
    return tfstrategy.select(devices=[f"/cpu:{i}" for i in range(replicas)], env={})


def two_layer_model(units: int = 1) -> keras.Model:
    inputs = keras.Input(shape=(4,))
    hidden = keras.layers.Dense(3, name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(units, name="head")(hidden))


def values(model: keras.Model) -> list[np.ndarray]:
    return [v.numpy() for v in model.weights + model.optimizer.variables]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[int, tuple[Path, list[np.ndarray]]]:
    """Per writer replica count: a directory with all three formats after 2 Adam steps, and the values."""
    result = {}
    for replicas in (1, 4):
        directory = tmp_path_factory.mktemp(f"written-by-{replicas}")
        model, _ = build_in_scope(selection_for(replicas), two_layer_model, optimizer="adam", loss="mse")
        model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
        model.save_weights(directory / "model.weights.h5")
        model.save(directory / "model.keras")
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(directory / "ckpts" / "ckpt")
        result[replicas] = (directory, values(model))
    return result


FORMATS = [
    pytest.param("ckpts", "tf.train.Checkpoint", id="checkpoint-dir"),
    pytest.param("ckpts/ckpt-1", "tf.train.Checkpoint", id="checkpoint-prefix"),
    pytest.param("model.weights.h5", "weights.h5", id="weights-h5"),
    pytest.param("model.keras", "keras", id="keras"),
]
DIRECTIONS = [pytest.param(1, 4, id="1-to-4-replicas"), pytest.param(4, 1, id="4-to-1-replica")]


@pytest.mark.slow
@pytest.mark.parametrize(("writer", "reader"), DIRECTIONS)
@pytest.mark.parametrize(("name", "kind"), FORMATS)
def test_round_trip_restores_weights_slots_and_step(written, name, kind, writer, reader):
    directory, expected = written[writer]
    model, report = build_in_scope(
        selection_for(reader), two_layer_model, optimizer="adam", loss="mse", checkpoint=directory / name
    )
    assert report.replicas == reader and report.audit.passed
    assert (report.restore.format, report.restore.optimizer_state, report.restore.step) == (kind, True, STEPS)
    assert report.restore.weights == 4
    restored = values(model)
    assert len(restored) == len(expected) == 14  # 4 weights, iterations, learning rate, 8 Adam slots
    for got, want in zip(restored, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    slots = [v for v in model.optimizer.variables if "velocity" in v.path]
    assert slots and all(np.any(v.numpy() != 0) for v in slots)


@pytest.mark.slow
def test_keras_file_as_the_model_continues_training_on_4_replicas(written):
    directory, expected = written[1]
    selection = selection_for(4)
    model, report = build_in_scope(selection, directory / "model.keras")
    assert report.lines()[:5] == [
        "strategy MirroredStrategy",
        "replicas 4",
        "variables_in_scope True",
        "variables model=4, optimizer=10, metric=2",
        "optimizer_built True",
    ]
    assert (report.restore.optimizer_state, report.restore.step) == (True, STEPS)
    for got, want in zip(values(model), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 2 * STEPS
    assert tfstrategy.require_scope(model, selection).passed  # still correct after fit


@pytest.mark.slow
def test_built_optimizer_works_in_a_custom_loop_on_4_replicas():
    # An unbuilt Adam fails here with "You must feed a value for placeholder tensor".
    strategy = selection_for(4).strategy
    model, report = build_in_scope(strategy, two_layer_model, optimizer="adam", loss="mse")
    assert report.audit.optimizer_built
    optimizer = model.optimizer
    dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((X, Y)).batch(8))

    @tf.function
    def step(x, y):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        strategy.run(replica_step, args=(x, y))

    for x, y in dataset:
        step(x, y)
    assert int(optimizer.iterations.numpy()) == STEPS
    assert tfstrategy.require_scope(model, strategy, require_built_optimizer=True).passed


def test_checkpoint_without_optimizer_restores_weights_only(tmp_path, written):
    source, _ = build_in_scope(selection_for(1), two_layer_model, optimizer="adam", loss="mse")
    tf.train.Checkpoint(model=source).save(tmp_path / "ckpt")
    model, report = build_in_scope(
        selection_for(4), two_layer_model, optimizer="adam", loss="mse", checkpoint=tmp_path / "ckpt-1"
    )
    assert (report.restore.optimizer_state, report.restore.step) == (False, 0)
    for got, want in zip(model.weights, source.weights):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_checkpoint_written_with_write_restores_weights_slots_and_step(tmp_path):
    # Checkpoint.write() keeps no save_counter; restoring it once failed with "1 Python objects not bound".
    source, _ = build_in_scope(selection_for(1), two_layer_model, optimizer="adam", loss="mse")
    source.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    prefix = tf.train.Checkpoint(model=source, optimizer=source.optimizer).write(str(tmp_path / "written"))
    model, report = build_in_scope(selection_for(2), two_layer_model, optimizer="adam", loss="mse", checkpoint=prefix)
    assert report.restore.optimizer_state and report.restore.step == int(source.optimizer.iterations.numpy()) > 0
    for got, want in zip(model.weights + model.optimizer.variables, source.weights + source.optimizer.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def copy_checkpoint(written, tmp_path: Path) -> Path:
    return Path(shutil.copytree(written[1][0], tmp_path / "copy"))


CORRUPTIONS = [
    pytest.param("missing.weights.h5", None, "no such .weights.h5 file", id="missing-weights-h5"),
    pytest.param("missing.keras", None, "no such .keras file", id="missing-keras"),
    pytest.param("missing/ckpt-1", None, "no such file or directory", id="missing-checkpoint"),
    pytest.param("empty", None, "a directory with no tf.train.Checkpoint", id="empty-directory"),
    pytest.param(
        "model.weights.h5", "model.weights.h5", "truncated or not written by Keras", id="truncated-weights-h5"
    ),
    pytest.param("model.keras", "model.keras", "truncated or not written by Keras", id="truncated-keras"),
    pytest.param("ckpts/ckpt-1", "ckpts/ckpt-1.index", "Could not read the checkpoint", id="truncated-index"),
    pytest.param(
        "ckpts/ckpt-1", "ckpts/ckpt-1.data-00000-of-00001", "Could not read the checkpoint", id="truncated-data"
    ),
]


@pytest.mark.parametrize(("name", "damaged", "expected"), CORRUPTIONS)
def test_missing_or_corrupt_checkpoint_is_a_clear_error(written, tmp_path, name, damaged, expected):
    directory = copy_checkpoint(written, tmp_path)
    (directory / "empty").mkdir()
    if damaged:
        truncate(directory / damaged)
    with pytest.raises(CheckpointError, match=expected) as raised:
        build_in_scope(selection_for(4), two_layer_model, optimizer="adam", loss="mse", checkpoint=directory / name)
    assert str(directory / name.split("/")[0]) in str(raised.value)


@pytest.mark.parametrize(("name", "_kind"), FORMATS)
def test_mismatched_model_is_named_and_nothing_is_half_restored(written, name, _kind):
    directory, expected = written[1]
    model, _ = build_in_scope(selection_for(4), lambda: two_layer_model(units=2), optimizer="adam", loss="mse")
    before = values(model)
    # The hidden layer matches the file and would load before the head fails.
    assert not np.allclose(before[0], expected[0])
    with pytest.raises(CheckpointError, match=r"head/kernel has shape \(3, 2\) in this model but \(3, 1\) in the file"):
        restore_checkpoint(model, directory / name)
    for got, want in zip(values(model), before):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("model.weights.h5", "the file has 10 optimizer variables, this optimizer has 6", id="weights-h5"),
        pytest.param("ckpts", "holds 14 model/optimizer variables; this model and optimizer have 10", id="checkpoint"),
    ],
)
def test_mismatched_optimizer_is_named(written, name, expected):
    directory, _ = written[4]
    with pytest.raises(CheckpointError, match=expected):
        build_in_scope(
            selection_for(1),
            two_layer_model,
            optimizer=lambda: keras.optimizers.SGD(momentum=0.9),
            loss="mse",
            checkpoint=directory / name,
        )


def test_optimizer_made_outside_is_named_with_its_line():
    optimizer = keras.optimizers.Adam()  # created before the call, outside the scope
    source = Path(__file__).read_text().splitlines()
    line = source.index("    optimizer = keras.optimizers.Adam()  # created before the call, outside the scope") + 1
    with pytest.raises(ScopeError, match=f"optimizer variables created at .*test_build.py:{line}"):
        build_in_scope(selection_for(4), two_layer_model, optimizer=optimizer, loss="mse")


@pytest.mark.parametrize(
    ("model", "compile_args", "expected"),
    [
        pytest.param(two_layer_model(), {"loss": "mse"}, "pass build_model, not build_model()", id="model-instance"),
        pytest.param(
            "model.h5", {}, "expected a function that builds the model, or a path ending in .keras", id="h5-path"
        ),
        pytest.param(two_layer_model, {}, "not compiled and no compile arguments", id="not-compiled"),
        pytest.param(lambda: "model", {}, "returned str; expected it to return a keras.Model", id="returns-no-model"),
    ],
)
def test_unusable_model_source_is_a_build_error(model, compile_args, expected):
    with pytest.raises(BuildError, match=expected):
        build_in_scope(selection_for(1), model, **compile_args)


def test_keras_model_and_checkpoint_together_are_refused(written):
    directory, _ = written[1]
    with pytest.raises(CheckpointError, match="Pass only one of them"):
        build_in_scope(selection_for(1), directory / "model.keras", checkpoint=directory / "model.weights.h5")


@pytest.mark.slow
def test_two_selections_in_one_process_train_different_models():
    # Plain MirroredStrategy objects share collective keys: the second one's
    # training fails with "Shape mismatch in the collective instance 100".
    for build_model in (lambda: two_layer_model(units=1), lambda: two_layer_model(units=5)):
        model, _ = build_in_scope(selection_for(4), build_model, optimizer="adam", loss="mse")
        model.fit(X, np.repeat(Y, model.output_shape[-1], axis=1), batch_size=8, epochs=1, verbose=0)
        assert int(model.optimizer.iterations.numpy()) == STEPS
    assert tf.distribute.MirroredStrategy._collective_key_base == 0


@pytest.mark.slow
def test_readme_example_prints_the_report_and_names_the_stray_optimizer():
    result = run_example("step2-build-in-scope.py")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:5] == [
        "strategy MirroredStrategy",
        "replicas 4",
        "variables_in_scope True",
        "variables model=2, optimizer=6, metric=2",
        "optimizer_built True",
    ]
    assert lines[5].startswith("restored ") and lines[5].endswith("model.weights.h5 (weights.h5)")
    assert lines[6:9] == ["restored_weights 2", "restored_optimizer_state True", "restored_step 4"]
    source = (ROOT / "examples" / "step2-build-in-scope.py").read_text().splitlines()
    line = source.index("optimizer = keras.optimizers.Adam()") + 1
    assert lines[9] == "ScopeError: 2 of 6 variables were not created in the scope of MirroredStrategy (4 replicas):"
    assert lines[10].startswith(f"  - optimizer variables created at examples/step2-build-in-scope.py:{line}: ")
