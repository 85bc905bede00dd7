"""Every private TensorFlow/Keras access tfstrategy makes, checked against the installed releases.

When a new TensorFlow or Keras breaks one, the failing test here names the accessor in
the src/tfstrategy/_compat/ package to update. Part of the smoke set, so it also runs on the oldest
supported release and on tf_keras.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from helpers import mirrored
from tfstrategy import _compat, _versions
from tfstrategy.patches import PATCHES

pytestmark = pytest.mark.smoke
keras = tf.keras
LEGACY = _versions.legacy_keras_requested()


@pytest.fixture(scope="module")
def compiled():
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="adam", loss="mse", metrics=[keras.metrics.MeanAbsoluteError()])
    return strategy, model


def test_keras_flavour(compiled):
    _, model = compiled
    assert _compat.is_tf_keras_object(model) is LEGACY
    assert _compat.keras_for(model).__name__ == ("tf_keras" if LEGACY else "keras")
    assert _versions.at_least(_compat.keras_version(_compat.keras_for()), "2.16")


def test_model_and_optimizer_strategy(compiled):
    strategy, model = compiled
    assert _compat.model_strategy(model) is strategy
    assert _compat.optimizer_strategy(model.optimizer) is strategy


def test_variables_and_metrics_before_the_first_step(compiled):
    strategy, model = compiled
    assert all(strategy.extended.variable_created_in_scope(_compat.tf_variable(v)) for v in model.weights)
    assert [type(m).__name__ for m in _compat.compiled_metric_objects(model)] == ["MeanAbsoluteError"]
    assert "kernel" in _compat.variable_path(model.weights[0])


def test_optimizer_built_and_its_variables(compiled):
    _, model = compiled
    with compiled[0].scope():
        model.optimizer.build(model.trainable_variables)
    assert _compat.optimizer_built(model.optimizer)
    assert len(_compat.optimizer_variables(model.optimizer)) > len(model.trainable_variables)


def test_strategy_facts():
    assert not _compat.in_multi_worker_mode(mirrored(2))
    assert _compat.is_default_strategy(tf.distribute.get_strategy())
    assert not _compat.is_default_strategy(mirrored(1))


def test_collective_key_base_is_set_and_restored():
    before = tf.distribute.MirroredStrategy._collective_key_base
    with _compat.mirrored_collective_key_base(7_000_000):
        assert tf.distribute.MirroredStrategy._collective_key_base == 7_000_000
    assert tf.distribute.MirroredStrategy._collective_key_base == before


def test_the_hooks_rewrite_targets_exist_with_the_arguments_it_passes():
    """collective_keys_per_strategy, checkpoint_files and data_sharding replace these private methods of TensorFlow's."""
    import inspect

    extended = _compat.collective_strategy_module().CollectiveAllReduceExtended
    assert list(inspect.signature(extended._initialize_multi_worker).parameters) == ["self", "cluster_resolver"]
    assert "_collective_key_base" in inspect.getsource(extended._initialize_multi_worker)
    checkpoint = _compat.checkpoint_module().Checkpoint
    assert list(inspect.signature(checkpoint._write).parameters)[:3] == ["self", "file_prefix", "options"]
    assert "experimental_write_callbacks" in inspect.getsource(checkpoint._write)
    distribute = extended._experimental_distribute_dataset
    assert list(inspect.signature(distribute).parameters) == ["self", "dataset", "options"]
    assert "_num_workers" in inspect.getsource(extended._make_input_context)


def test_per_replica_and_optional_type_spec():
    value = _compat.per_replica((np.zeros(2), np.ones(2)))
    assert isinstance(value, tf.distribute.DistributedValues) and len(value.values) == 2
    optional = tf.experimental.Optional.from_value(tf.constant(1))
    assert _compat.optional_type_spec(optional).is_compatible_with(optional)


def test_deferred_capture_inside_a_function():
    @tf.function
    def read():
        return _compat.capture_call_time_value(lambda: tf.constant(5.0), tf.TensorSpec([], tf.float32)) + 1.0

    assert float(read()) == 6.0


def test_graph_captures_of_a_function_and_of_a_function_inside_it():
    variable = tf.Variable(2.0)
    seen = {}

    @tf.function
    def outer():
        @tf.function
        def inner():
            value = variable * 3.0
            seen["inner"] = (_compat.graph_captures(tf.compat.v1.get_default_graph()),
                             tf.compat.v1.get_default_graph())
            return value

        value = inner()
        seen["outer"] = (_compat.graph_captures(tf.compat.v1.get_default_graph()), tf.compat.v1.get_default_graph())
        return value

    assert float(outer()) == 6.0
    (outer_captures, _), outer_graph = seen["outer"]
    (inner_captures, inner_outer), _ = seen["inner"]
    assert inner_outer is outer_graph
    # Each function captures the variable's handle (or, nested, the outer function's placeholder for it).
    handle_inside = [inside for outside, inside in outer_captures if outside is variable.handle]
    assert len(handle_inside) == 1
    assert any(outside is variable.handle or outside is handle_inside[0] for outside, _ in inner_captures)
    assert _compat.graph_captures(tf.Graph()) == ([], None)


def test_runtime_and_creator_scope_state():
    assert _compat.runtime_started()  # conftest split the CPU and tests ran ops
    seen = []

    def in_a_fresh_thread():  # creator scopes are per thread; select() keeps one open in the main thread
        seen.append(_compat.variable_creator_scope_open())
        with tf.variable_creator_scope(lambda next_creator, **kwargs: next_creator(**kwargs)):
            seen.append(_compat.variable_creator_scope_open())

    thread = threading.Thread(target=in_a_fresh_thread)
    thread.start()
    thread.join(timeout=30)
    assert seen == [False, True]


def test_slurm_hostlist_helpers():
    expand_hostlist, expand_tasks_per_node = _compat.slurm_hostlist_helpers()
    assert expand_hostlist("node[1-2],gpu7") == ["node1", "node2", "gpu7"]
    assert expand_tasks_per_node("2(x2),1") == [2, 2, 1]


@pytest.mark.skipif(LEGACY, reason="tf_keras: no Keras 3 trainer to patch")
@pytest.mark.parametrize("name", list(PATCHES))
def test_every_patch_target_exists_in_the_installed_keras(name):
    patch = PATCHES[name]
    module = patch.target_module()
    assert module is not None, "Keras 3's TensorFlow trainer module moved: update _compat.keras3_tensorflow_trainer"
    alternatives = {target: group for group in getattr(patch, "one_of", ()) for target in group}
    for group in getattr(patch, "one_of", ()):
        assert any(patch._has(module, target) for target in group), f"{name}: none of {group} in this Keras"
    for target in patch.targets:
        # restores: Keras lacks them (the patch adds them); optional: present only once a script imported them
        if target not in alternatives and target not in getattr(patch, "restores", ()) + getattr(patch, "optional", ()):
            found = _compat.get_path(module, target)
            assert callable(found) or isinstance(found, property), f"{name}: {target} is gone from this Keras"


def test_a_resumed_fit_starts_at_the_epoch_and_batch_it_is_given():
    """set_initial_epoch + skip_keras3_steps, called in on_train_begin as the coordinated backup does."""
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")

    class Resume(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            _compat.set_initial_epoch(self.model, 1, 3)
            _compat.skip_keras3_steps(self.model, 3)

    x, y = np.ones((64, 3), "float32"), np.ones((64, 1), "float32")
    history = model.fit(x, y, batch_size=8, epochs=2, callbacks=[Resume()], shuffle=False, verbose=0)
    _compat.clear_initial_epoch(model)
    assert len(history.history["loss"]) == 1  # epoch 2 only
    assert int(model.optimizer.iterations.numpy()) == 8 - 3  # its first 3 batches were skipped
    history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 1 and int(model.optimizer.iterations.numpy()) == 5 + 8


def test_coordination_store_is_absent_without_a_multi_worker_strategy():
    # The multiprocess tests of keras_chief_files use the real store of a 2-worker job.
    assert _compat.coordination_store() is None
    assert issubclass(_compat.deadline_exceeded_error(), tf.errors.OpError)
    assert issubclass(_compat.unavailable_error(), tf.errors.OpError)


@pytest.mark.skipif(LEGACY, reason="tf_keras: its callbacks are not patched")
def test_keras3_callback_attributes_the_file_patch_reads(tmp_path):
    import keras as keras3

    backup = keras3.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    for name in _compat.backup_file_attributes():
        assert str(getattr(backup, name)).startswith(str(tmp_path / "backup")), name
    board = keras3.callbacks.TensorBoard(log_dir=str(tmp_path / "logs"), write_graph=False, profile_batch=0)
    model = keras3.Sequential(name="compat_probe")
    board.set_model(model)
    assert str(_compat.tensorboard_write_dir(board)) == str(tmp_path / "logs")
    marker = object()
    _compat.set_model_strategy(model, marker)
    assert _compat.model_strategy(model) is marker


_OP_THEN_MWMS = """
import json, os, socket, sys
import tensorflow as tf
from tfstrategy import _compat
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]}, "task": {"type": "worker", "index": 0}})
if sys.argv[1] == "prepared":
    print("prepared", _compat.prepare_collective_runtime({"worker": [f"127.0.0.1:{port}"]}, "worker", 0))
two = tf.constant(1) + 1
try:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
except RuntimeError as error:
    print("refused:", error)
else:
    print("joined", strategy.extended._num_workers, int(strategy.reduce("SUM", strategy.run(lambda: two), axis=None)))
print("again", _compat.prepare_collective_runtime({"worker": [f"127.0.0.1:{port}"]}, "worker", 0))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "expected"), [
    pytest.param("prepared", ["prepared True", "joined 1 2", "again False"], id="prepared-before-the-first-op"),
    # Upstream canary: the day TensorFlow configures collectives after start-up, the hook's step is no longer needed.
    pytest.param("plain", ["refused: Collective ops must be configured at program startup", "again False"], id="upstream"),
])
def test_prepare_collective_runtime_lets_ops_come_before_the_strategy(mode, expected):
    result = subprocess.run([sys.executable, "-c", _OP_THEN_MWMS, mode], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.stdout.split("\n")[:-1] == expected, result.stderr[-3000:]


def test_resolved_tf_keras_and_a_creator_installed_for_a_thread_life():
    assert keras.layers is not None  # tf.keras resolved
    assert _compat.resolved_tf_keras() == ("tf_keras" if LEGACY else "keras")
    seen, unraisable = [], []

    def creator(next_creator, **kwargs):
        seen.append(kwargs.get("name"))
        return next_creator(**kwargs)

    def a_thread_that_ends():
        _compat.install_variable_creator(creator)
        tf.Variable(1.0, name="after_install")
        with tf.variable_creator_scope(lambda next_creator, **kwargs: next_creator(**kwargs)):
            tf.Variable(1.0, name="inside_a_later_scope")  # that scope closes cleanly over ours

    previous, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        thread = threading.Thread(target=a_thread_that_ends)
        thread.start()
        thread.join(timeout=60)
        del thread
        gc.collect()
    finally:
        sys.unraisablehook = previous
    assert seen == ["after_install", "inside_a_later_scope"] and unraisable == []


@pytest.mark.skipif(LEGACY, reason="tf_keras has no build peek: skip_build_peek leaves its models alone")
def test_keras3_build_state_and_the_dataset_behind_an_epoch_iterator():
    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    strategy = mirrored(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    assert not _compat.keras3_nothing_left_to_build(model)  # the compiled loss and metric wait for a batch
    batch = (tf.ones((4, 3)), tf.ones((4, 2)))
    _compat.symbolic_build(model, batch)
    assert _compat.keras3_nothing_left_to_build(model)
    dataset = tf.data.Dataset.from_tensors(batch)
    epoch_iterator = TFEpochIterator(distribute_strategy=strategy, x=dataset)
    assert _compat.epoch_iterator_source(epoch_iterator) is dataset
    assert _compat.epoch_iterator_source(object()) is None


# --- The registry: every accessor names its upstream objects, and they resolve here ---------------

#: Functions of _compat that read no private TF/Keras name (public API, or tfstrategy's own helpers).
NO_PRIVATE_NAME = {"accessor_status", "accessor_summary", "registered_accessors", "deadline_exceeded_error",
                   "unavailable_error", "get_path", "set_path", "del_path", "is_tf_keras_object", "keras_for", "keras_version",
                   "keras_variable_types", "model_metric_variables", "model_state_variables", "numpy_if_imported",
                   "optimizer_variables", "skip_keras3_steps", "variable_path"}


@pytest.mark.parametrize("name", sorted(_compat.registered_accessors()))
def test_every_accessor_resolves_on_this_install(name):
    (status,) = [status for status in _compat.accessor_status(import_modules=True) if status.name == name]
    assert status.resolved is True, f"_compat.{name}: {status.state()}; update it for this TensorFlow/Keras"


def test_every_function_of_compat_is_a_registered_accessor_or_reads_nothing_private():
    import inspect

    functions = {name for name in _compat.__all__ if inspect.isfunction(getattr(_compat, name))}
    registered = set(_compat.registered_accessors())
    assert functions - registered == NO_PRIVATE_NAME
    assert registered <= functions  # every accessor is re-exported by the package


def test_the_registry_tells_a_missing_name_an_optional_one_and_a_module_not_imported(monkeypatch):
    from tfstrategy._compat import registry

    monkeypatch.setattr(registry, "_REGISTRY", {})
    registry.accessor("tensorflow.python.eager.context:Context._context_handle")(lambda: None)
    for name, spec in [("gone", "tensorflow.python.eager.context:Context._no_such_attribute"),
                       ("either", "no_such_module_xyz:A.b | tensorflow.python.eager.context:Context.ensure_initialized"),
                       ("optional", "tensorflow.python.eager.context:Context._no_such_attribute?"),
                       ("unimported", "no_such_module_xyz:A")]:
        registry._REGISTRY[name] = (spec,)
    lines = [status.line() for status in registry.accessor_status()]
    assert lines == ["<lambda>: resolved",
                     "gone: MISSING (no tensorflow.python.eager.context:Context._no_such_attribute)",
                     "either: resolved",
                     "optional: resolved (tensorflow.python.eager.context:Context._no_such_attribute absent (optional))",
                     "unimported: not checked (no_such_module_xyz not imported)"]
    assert registry.accessor_status(import_modules=True)[-1].line() == "unimported: MISSING (no module no_such_module_xyz)"
    assert registry.accessor_summary(registry.accessor_status()) == (
        "3 of 5 accessors resolve; MISSING: gone; 1 not checked (their modules are not imported; "
        "tfstrategy env --compat checks them)")


def test_checking_without_imports_imports_nothing():
    script = ("import sys; from tfstrategy import _compat; statuses = _compat.accessor_status(); "
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras', 'tf_keras'}), "
              "{s.resolved for s in statuses})")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[] {None}", result.stderr[-2000:]


# --- Accessors the hooks, patches and training helpers use instead of private names ----------------


def test_rewrite_and_patch_targets_name_callables_of_their_modules():
    targets = [(_compat.checkpoint_module(), _compat.checkpoint_write_target()),
               (_compat.collective_strategy_module(), _compat.initialize_multi_worker_target()),
               (_compat.collective_strategy_module(), _compat.distribute_dataset_target())]
    if not LEGACY:
        trainer = _compat.keras3_tensorflow_trainer()
        targets += [(trainer, _compat.trainer_make_function_target()), (trainer, _compat.trainer_build_peek_target()),
                    (_compat.keras3_file_writers(), _compat.backup_save_target())]
    for module, target in targets:
        assert callable(_compat.get_path(module, target)), target


def test_dataset_graph_def_and_the_worker_count_of_a_strategy():
    dataset = tf.data.Dataset.range(4).map(lambda x: x + 1).batch(2)
    ops = {node.op for node in _compat.dataset_graph_def(dataset).node}
    assert {"RangeDataset", "MapDataset", "BatchDatasetV2"} <= ops
    extended = mirrored(2).extended
    assert _compat.collective_worker_count(extended) == 1
    before = extended._collective_key_base
    try:
        _compat.offset_collective_key_base(extended, 7)
        assert extended._collective_key_base == before + 7
    finally:
        extended._collective_key_base = before  # the strategy is shared with other tests


def test_checkpoint_object_graph(tmp_path):
    prefix = tf.train.Checkpoint(step=tf.Variable(3)).write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(prefix)
    graph = _compat.checkpoint_object_graph(reader)
    assert [child.local_name for child in graph.nodes[0].children] == ["step"]
    assert _compat.checkpoint_object_graph_key() in reader.get_variable_to_shape_map()


def test_the_layer_behind_a_functional_output():
    inputs = keras.Input((3,))
    dense = keras.layers.Dense(2, name="head")
    model = keras.Model(inputs, dense(inputs))
    assert _compat.keras_tensor_layer(model.outputs[0]) is dense
    assert _compat.keras_tensor_layer(object()) is None


def test_stand_ins_for_probes():
    extended = _compat.multi_worker_extended_stand_in("/job:worker/task:1/device:CPU:0", should_checkpoint=False)
    assert extended._in_multi_worker_mode() and extended.worker_devices == ("/job:worker/task:1/device:CPU:0",)
    assert extended.should_checkpoint is False
    built = []
    strategy = mirrored(1)
    model = _compat.stand_in_build_model(strategy, lambda **kwargs: built.append(kwargs))
    assert _compat.model_strategy(model) is strategy
    model._symbolic_build(data_batch=5)
    assert built == [{"iterator": None, "data_batch": 5}]


@pytest.mark.skipif(LEGACY, reason="tf_keras: no Keras 3 trainer, loss scale optimizer or build peek")
def test_keras3_trainer_stand_in_loss_scale_step_and_build_peek():
    from tfstrategy.patches.keras_loss_scale import _StandInDistribution, _Values

    trainer = _compat.keras3_tensorflow_trainer()

    class StandIn:
        pass

    _compat.copy_autoconvert_optionals(trainer, StandIn)
    assert hasattr(StandIn, "_autoconvert_optionals") == hasattr(trainer.TensorFlowTrainer, "_autoconvert_optionals")

    outcome = []
    handler = _compat.loss_scale_step_handler(
        _compat.keras3_loss_scale_module(), lambda optimizer, grads: tf.constant(False),
        lambda: outcome.append("applied"), lambda: outcome.append("skipped"))
    handler(_StandInDistribution(), _Values([[tf.constant([1.0])]]), None)
    assert outcome == ["skipped"]

    strategy = mirrored(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    assert _compat.has_class_build_peek(model)
    peeked = []
    object.__setattr__(model, _compat.build_peek_attribute(),
                       lambda iterator=None, data_batch=None: peeked.append(data_batch))
    assert not _compat.has_class_build_peek(model)
    model._maybe_symbolic_build(data_batch="batch")
    assert peeked == ["batch"]
    object.__delattr__(model, _compat.build_peek_attribute())
    assert _compat.has_class_build_peek(model)
    _compat.class_build_peek(model, data_batch=(tf.ones((2, 3)), tf.ones((2, 2))))
    assert _compat.keras3_nothing_left_to_build(model)


@pytest.mark.skipif(LEGACY, reason="Keras 3 internals: tf_keras has none of these bugs")
def test_keras3_internals_the_issue_36_patches_replace():
    """keras_uneven_batches, keras_lazy_optimizer, keras_compile_scope and keras_jit_compile name these."""
    root = _compat.keras3_loss_module_root()
    assert callable(root.backend.tensorflow.trainer.TensorFlowTrainer.train_step)
    assert callable(root.losses.loss.scale_loss_for_distribution) and callable(root.losses.loss.unscale_loss_for_distribution)
    assert callable(_compat.keras3_tf_optimizer_module().TFOptimizer.add_variable)
    trainer = _compat.keras3_trainer_module().Trainer
    assert callable(trainer.compile) and isinstance(trainer.__dict__["jit_compile"], property)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    _compat.set_keras3_jit_compile(model, True)
    assert model.jit_compile is True and model.train_function is None


@pytest.mark.skipif(LEGACY, reason="tf.keras is tf_keras: its legacy optimizers are real")
def test_keras3_keeps_the_legacy_optimizer_names_in_each_module():
    packages = _compat.keras3_legacy_optimizer_packages()
    names = vars(packages)
    assert "keras" in names and "tf_keras_copy" in names
    assert sys.modules["tensorflow.keras.optimizers.legacy"] in names.values()
    assert _compat.resolved_tf_keras() == "keras"  # tf.keras left as it was
    assert all(hasattr(module, "SGD") and hasattr(module, "Adam") for module in names.values())


def test_del_path_removes_what_set_path_added():
    from types import SimpleNamespace

    root = SimpleNamespace(inner=SimpleNamespace())
    _compat.set_path(root, "inner.added", 1)
    assert _compat.get_path(root, "inner.added") == 1
    _compat.del_path(root, "inner.added")
    assert not hasattr(root.inner, "added")


@pytest.mark.skipif(LEGACY, reason="Keras 3 internals: tf_keras has none of these bugs")
def test_keras3_internals_the_issue_44_layer_patches_replace():
    """keras_replica_seeds, keras_stateful_rnn and keras_batch_norm_statistics name these; a marked error leaves a
    layer's call as it is."""
    root = _compat.keras3_training_api_root()
    assert callable(root.backend.tensorflow.random.draw_seed) and callable(root.backend.tensorflow.image.draw_seed)
    assert callable(root.layers.rnn.rnn.RNN.call)
    assert callable(root.layers.normalization.batch_normalization.BatchNormalization.add_weight)
    assert callable(root.losses.loss.scale_loss_for_distribution)  # keras_cross_replica_loss
    assert callable(root.losses.loss.unscale_loss_for_distribution)

    class Refusing(keras.layers.Layer):
        def call(self, x):
            raise _compat.keep_keras_error_message(ValueError("one line"))

    with pytest.raises(ValueError) as raised:
        Refusing()(np.ones((1, 1), "float32"))
    assert str(raised.value) == "one line"
