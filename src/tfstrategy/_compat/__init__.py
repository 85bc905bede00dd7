"""Every private TensorFlow and Keras attribute tfstrategy reads or writes, in one place.

TensorFlow and Keras have no public API for some things tfstrategy must know
(which strategy owns a model, whether the runtime has started, the Keras trainer
functions the patches replace). Each such access is one small function here,
so a new release breaks this file only, and ``tests/test_compat.py`` says which
function broke. Nothing else in tfstrategy names a private TF/Keras attribute.

Keras flavours: a model is either Keras 3 (``keras``) or tf_keras (legacy
Keras 2, ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``); functions taking a
model handle both.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from tfstrategy._tf import tf

# --- Keras flavour -------------------------------------------------------------------


def is_tf_keras_object(obj: Any) -> bool:
    """Whether ``obj`` (a model, optimizer, metric, ...) comes from tf_keras rather than Keras 3."""
    return any(klass.__module__.split(".", 1)[0] == "tf_keras" for klass in type(obj).__mro__)


def keras_for(obj: Any = None) -> ModuleType:
    """The Keras package ``obj`` belongs to, or the one ``tf.keras`` resolves to when ``obj`` is ``None``."""
    from tfstrategy._versions import keras_package

    if is_tf_keras_object(obj) if obj is not None else keras_package() == "tf_keras":
        import tf_keras

        return tf_keras
    import keras

    return keras


def resolved_tf_keras() -> str | None:
    """What ``tf.keras`` already resolved to in this process: ``"keras"``, ``"tf_keras"``, or ``None``.

    ``None`` while TensorFlow is not imported or ``tf.keras`` was not used yet:
    TensorFlow decides lazily, reading ``TF_USE_LEGACY_KERAS`` at the first
    attribute access, then replaces its ``KerasLazyLoader`` in the ``tensorflow``
    module by the package it loaded. A host that sets the variable after that
    (Ray Train does, on every worker) changes nothing, so the variable alone
    would misreport the flavour.
    """
    module = sys.modules.get("tensorflow")
    if module is None:
        return None
    loaded = vars(module).get("keras")
    if not isinstance(loaded, ModuleType):
        return None
    state = vars(loaded)
    if "_tfll_initialized" in state:  # still TensorFlow's KerasLazyLoader
        if not state.get("_tfll_initialized"):
            return None
        version = state.get("_tfll_keras_version")
        return {"tf_keras": "tf_keras", "keras_3": "keras"}.get(version)
    root = str(state.get("__name__", "")).split(".", 1)[0]
    return root if root in ("keras", "tf_keras") else None


def keras_version(module: ModuleType) -> str:
    """The ``__version__`` of a Keras package (Keras 3 or tf_keras)."""
    return str(getattr(module, "__version__", "0"))


# --- Keras 3 trainer internals that the patches replace ------------------------------


def keras3_tensorflow_trainer() -> ModuleType | None:
    """``keras.src.backend.tensorflow.trainer`` when Keras 3 runs on TensorFlow; else ``None``.

    Imports Keras only if it is already imported, or asked for by the caller's
    code path (the patches call this once TensorFlow is in use).
    """
    try:
        import keras

        if keras.backend.backend() != "tensorflow":
            return None
        from keras.src.backend.tensorflow import trainer
    except ImportError:  # internals moved or Keras 3 missing: nothing of ours applies
        return None
    return trainer


def keras3_file_writers() -> ModuleType | None:
    """``keras.src`` with the modules whose functions write files imported, when Keras 3 runs on TensorFlow.

    The file-writing patch names its targets inside this package
    (``saving.saving_lib.save_model``, ``callbacks.csv_logger.CSVLogger.on_train_begin``, ...).
    """
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        import keras.src
        from keras.src.callbacks import backup_and_restore, csv_logger, tensorboard  # noqa: F401
        from keras.src.export import saved_model  # noqa: F401
        from keras.src.legacy.saving import legacy_h5_format  # noqa: F401
        from keras.src.saving import saving_lib  # noqa: F401
        from keras.src.utils import file_utils  # noqa: F401
    except ImportError:
        return None
    try:  # Model.export's writer has its own module in newer Keras (3.15); ExportArchive had it before (3.10)
        from keras.src.export import saved_model_export_archive  # noqa: F401
    except ImportError:
        pass
    return keras.src


def backup_file_attributes() -> tuple[str, ...]:
    """The attributes of Keras 3's ``BackupAndRestore`` naming its files under ``backup_dir``."""
    return ("_weights_path", "_training_metadata_path", "_prev_weights_path", "_prev_training_metadata_path")


def tensorboard_write_dir(callback: Any) -> Any:
    """The directory Keras 3's ``TensorBoard`` callback writes its event files under."""
    return callback._log_write_dir


def set_model_strategy(model: Any, strategy: Any) -> None:
    """Record ``strategy`` as the one a Keras 3 model was created under (a probe's stand-in model)."""
    model._distribute_strategy = strategy


def keras3_tree() -> ModuleType:
    """Keras 3's nest utilities (``keras.src.tree``), which handle its ``None`` leaves as Keras does."""
    from keras.src import tree

    return tree


def get_path(root: Any, path: str) -> Any:
    """``root.a.b`` for ``path="a.b"``; ``AttributeError`` if any part is missing."""
    value = root
    for part in path.split("."):
        value = getattr(value, part)
    return value


def set_path(root: Any, path: str, value: Any) -> None:
    """Set ``root.a.b = value`` for ``path="a.b"``."""
    owner_path, _, name = path.rpartition(".")
    setattr(get_path(root, owner_path) if owner_path else root, name, value)


def del_path(root: Any, path: str) -> None:
    """Delete ``root.a.b`` for ``path="a.b"`` (an attribute a patch added)."""
    owner_path, _, name = path.rpartition(".")
    delattr(get_path(root, owner_path) if owner_path else root, name)


# --- Strategies and variables -------------------------------------------------------


def model_strategy(model: Any) -> Any:
    """The strategy a model was created under (``None`` if Keras recorded none)."""
    # Keras 3 keeps it in `_distribute_strategy`, tf_keras in `_distribution_strategy`.
    for name in ("_distribute_strategy", "_distribution_strategy"):
        strategy = getattr(model, name, None)
        if strategy is not None:
            return strategy
    return None


def optimizer_strategy(optimizer: Any, default: Any = None) -> Any:
    """The strategy an optimizer was created under (Keras 3 and tf_keras both call it ``_distribution_strategy``)."""
    return getattr(optimizer, "_distribution_strategy", default)


def tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (which wraps it in ``_value``); tf_keras' are already one."""
    return getattr(variable, "_value", variable)


def model_metric_variables(model: Any) -> list[Any]:
    """Variables of a model's built metrics (Keras 3 ``metrics_variables``; tf_keras has only ``metrics``)."""
    variables = getattr(model, "metrics_variables", None)
    if variables is not None:
        return list(variables)
    return [variable for metric in getattr(model, "metrics", ()) for variable in metric.variables]


def optimizer_variables(optimizer: Any) -> list[Any]:
    """An optimizer's variables (a list in Keras 3 and tf_keras; a method on tf_keras' legacy optimizers)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) and not isinstance(variables, list) else variables)


def model_state_variables(model: Any) -> list[Any]:
    """Every variable a training step can change on the model: weights, and Keras 3's seed generator states.

    Keras 3's ``model.weights`` leaves out the seed generators (a ``Dropout``'s);
    ``model.variables`` has them. tf_keras keeps a layer's random state in the
    layer's generator, which is in neither list; its variables are the weights.
    """
    return list(model.variables)


def keras_global_seed_generator() -> Any:
    """Keras 3's global ``SeedGenerator`` (unseeded ``keras.random`` calls draw from it), if one was made."""
    if "keras" not in sys.modules:
        return None
    try:
        from keras.src.backend.common import global_state
        from keras.src.random import seed_generator
    except ImportError:  # tf_keras only, or a Keras that moved them
        return None
    # The attribute's name: a constant since Keras 3.11, the same string in 3.10.
    name = getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator")
    return global_state.get_global_attribute(name)


def tf_global_generator() -> Any:
    """TensorFlow's global ``tf.random.Generator``, if one was made (never makes one)."""
    module = sys.modules.get("tensorflow.python.ops.stateful_random_ops")
    return getattr(module, "global_generator", None)


def numpy_if_imported() -> ModuleType | None:
    """NumPy, if something imported it (so saving its random state costs no import)."""
    return sys.modules.get("numpy")


def dataset_from_variant(variant: Any, element_spec: Any) -> Any:
    """A ``tf.data.Dataset`` over a dataset variant tensor (from ``DatasetFromGraph``, say)."""
    from tensorflow.python.data.ops import dataset_ops

    return dataset_ops._VariantDataset(variant, element_spec)


def steps_per_execution(model: Any) -> int:
    """A compiled model's K (Keras 3: an attribute; tf_keras: a variable)."""
    value = getattr(model, "_steps_per_execution", None) if is_tf_keras_object(model) else None
    if value is None:
        value = getattr(model, "steps_per_execution", 1)
    value = value.numpy() if hasattr(value, "numpy") else value
    return int(value or 1)


def set_steps_per_execution(model: Any, steps: int) -> None:
    """Set K on a compiled model (Keras 3: a plain attribute; tf_keras: a variable behind a private setter)."""
    configure = getattr(model, "_configure_steps_per_execution", None)
    if configure is not None and is_tf_keras_object(model):
        configure(steps)
    else:
        model.steps_per_execution = steps
    model.train_function = None  # rebuilt with the new K by the next make_train_function


def symbolic_build(model: Any, batch: Any) -> None:
    """Build a model's layers, compiled metrics and loss, and its optimizer's slots, from one batch.

    Keras 3's ``fit`` does it before its first step under a strategy (and at its
    first step's trace without one); tf_keras builds the optimizer at its first
    step. Built here, a snapshot taken next holds every variable training changes.
    """
    build = getattr(model, "_symbolic_build", None)
    if build is not None and not is_tf_keras_object(model):
        with model.distribute_strategy.scope():
            build(data_batch=batch)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer_built(optimizer) and callable(getattr(optimizer, "build", None)):
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


def keras3_nothing_left_to_build(model: Any) -> bool:
    """Whether everything Keras 3's ``_symbolic_build`` needs a batch for is built: each layer, the compiled
    loss and metrics."""
    compiled = (getattr(model, "_compile_loss", None), getattr(model, "_compile_metrics", None))
    return (all(layer.built for layer in model._flatten_layers())
            and all(part is None or part.built for part in compiled))


def epoch_iterator_source(epoch_iterator: Any) -> Any:
    """The ``tf.data.Dataset`` a Keras 3 ``TFEpochIterator`` distributes, or ``None`` (data from a function,
    or another iterator)."""
    distributed = getattr(epoch_iterator, "_distributed_dataset", None)
    source = getattr(distributed, "_original_dataset", None)
    return source if isinstance(source, tf().data.Dataset) else None


def keras_variable_types() -> tuple[type, ...]:
    """Keras 3's own ``keras.Variable`` class, if ``tf.keras`` is Keras 3 (tf_keras uses ``tf.Variable``)."""
    variable = getattr(tf().keras, "Variable", None)
    return (variable,) if isinstance(variable, type) else ()


def optimizer_built(optimizer: Any) -> bool:
    """Whether an optimizer has its slot variables (Keras 3 ``built``; tf_keras sets ``_built`` in ``build``)."""
    if hasattr(optimizer, "built"):
        return bool(optimizer.built)
    return bool(getattr(optimizer, "_built", False))


def variable_path(variable: Any) -> str:
    """A variable's name for messages: Keras 3's ``path`` (``dense/kernel``), else the tf.Variable ``name``."""
    return str(getattr(variable, "path", None) or variable.name)


def compiled_metric_objects(model: Any) -> list[Any]:
    """Metric objects passed to ``compile`` that Keras has not built yet (before the first step).

    Keras 3 holds them in ``model._compile_metrics._user_metrics`` (and
    ``_user_weighted_metrics``) until the first step; tf_keras in
    ``model.compiled_metrics._user_metrics``.
    """
    found: list[Any] = []
    for holder_name in ("_compile_metrics", "compiled_metrics"):
        compiled = getattr(model, holder_name, None)
        if compiled is None or getattr(compiled, "built", getattr(compiled, "_built", True)):
            continue
        for structure in (getattr(compiled, "_user_metrics", None), getattr(compiled, "_user_weighted_metrics", None)):
            if structure is not None:
                found.extend(item for item in tf().nest.flatten(structure) if hasattr(item, "variables"))
    return found


def in_multi_worker_mode(strategy: Any) -> bool:
    """Whether a MultiWorkerMirroredStrategy spans more than one worker (Keras' own test)."""
    return isinstance(strategy, tf().distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode()
    )


def is_default_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` is TensorFlow's default (no-distribution) strategy."""
    return type(strategy).__name__ == "_DefaultDistributionStrategy"


@contextlib.contextmanager
def mirrored_collective_key_base(base: int) -> Iterator[None]:
    """Create MirroredStrategies in this block with collective keys starting at ``base``.

    Every MirroredStrategy starts its collective group and instance keys at the
    same numbers, so two in one process over the same devices collide ("Shape
    mismatch in the collective instance 100"). TensorFlow's tests set the class
    attribute ``_collective_key_base``; the default is put back afterwards.
    """
    cls = tf().distribute.MirroredStrategy
    default = cls._collective_key_base
    cls._collective_key_base = base
    try:
        yield
    finally:
        cls._collective_key_base = default


def per_replica(values: tuple[Any, ...]) -> Any:
    """A ``PerReplica`` value (what a distributed iterator yields) from per-replica parts."""
    from tensorflow.python.distribute.values import PerReplica

    return PerReplica(values)


def optional_type_spec(optional: Any) -> Any:
    """The ``TypeSpec`` of a ``tf.experimental.Optional`` (a ``while_loop`` shape invariant needs it)."""
    return optional._type_spec


def capture_call_time_value(function: Any, spec: Any) -> Any:
    """A deferred capture in the graph being traced, as the collective ops' instance keys use."""
    return tf().compat.v1.get_default_graph().capture_call_time_value(function, spec)


# --- tf.data pipelines ------------------------------------------------------------------


def dataset_inputs(dataset: Any) -> list[Any]:
    """The datasets ``dataset`` reads from (tf.data's own ``_inputs()``); ``[]`` for a source."""
    try:
        return list(dataset._inputs())
    except (AttributeError, NotImplementedError):
        return []


def dataset_function_outputs(dataset: Any) -> list[Any]:
    """The variant (dataset) outputs of the functions a transformation holds.

    ``interleave``/``flat_map`` keep their ``map_func`` and ``group_by_window``
    (behind ``bucket_by_sequence_length``) its ``reduce_func`` as
    ``StructuredFunctionWrapper`` attributes; the datasets those functions return
    are where their elements come from, yet ``_inputs()`` does not list them.
    """
    variant = tf().variant
    outputs = []
    for value in vars(dataset).values():
        graph = getattr(getattr(value, "function", None), "graph", None)
        if graph is not None:
            outputs.extend(tensor for tensor in graph.outputs if tensor.dtype == variant)
    return outputs


def dataset_function_captures(dataset: Any) -> list[Any]:
    """The ``tf.data.Dataset`` objects the Python functions of a transformation capture.

    ``ds.interleave(lambda i: batched)`` returns a dataset made *outside* the
    function: its graph output is a captured placeholder, with nothing to walk.
    The wrapper keeps the user's function (``StructuredFunctionWrapper._func``);
    the datasets it closes over, takes as defaults or names as globals are the ones
    whose elements come out.
    """
    dataset_type = tf().data.Dataset
    variant = tf().variant
    found = []
    for value in vars(dataset).values():
        func = getattr(value, "_func", None)
        code = getattr(func, "__code__", None)
        graph = getattr(getattr(value, "function", None), "graph", None)
        if code is None or graph is None:
            continue
        if not any(_is_captured(tensor) for tensor in graph.outputs if tensor.dtype == variant):
            continue  # the function builds its output itself; dataset_function_outputs walks it
        candidates = [cell.cell_contents for cell in (func.__closure__ or ()) if _cell_filled(cell)]
        candidates += list(func.__defaults__ or ())
        candidates += [func.__globals__[name] for name in code.co_names if name in func.__globals__]
        found.extend(candidate for candidate in candidates if isinstance(candidate, dataset_type))
    return found


def _is_captured(tensor: Any) -> bool:
    op = tensor.op
    while op.type == "Identity" and op.inputs:
        op = op.inputs[0].op
    return op.type == "Placeholder"


def _cell_filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def op_function_outputs(op: Any) -> list[Any]:
    """The variant outputs of the functions a dataset op inside a function graph calls (nested interleave)."""
    variant = tf().variant
    outputs = []
    for attr in op.node_def.attr.values():
        name = attr.func.name if attr.HasField("func") else None
        function = op.graph._get_function(name) if name else None
        graph = getattr(function, "graph", None)
        if graph is not None:
            outputs.extend(tensor for tensor in graph.outputs if tensor.dtype == variant)
    return outputs


# --- Runtime and tracing state ------------------------------------------------------


def autograph_source_map() -> dict[tuple[str, int], tuple[str, int, str]]:
    """Autograph's map from its generated code to the user's, for the function being converted now.

    ``{(generated_file, line): (user_file, line, function)}``; empty outside
    autograph. Autograph pushes one mapper per converted call on a per-thread
    stack in ``tf_stack`` (its tracebacks use it); the top one merges its parents.
    """
    try:
        from tensorflow.python.util import tf_stack

        stack = tf_stack._source_mapper_stacks.get(tf_stack._get_thread_key())
        return dict(stack[-1].get_effective_source_map()) if stack else {}
    except Exception:  # internals moved: report the generated file rather than fail a variable's creation
        return {}


def runtime_started() -> bool:
    """Whether this process's TensorFlow runtime (eager context) has started; ``False`` if TF is not imported."""
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    # No public query exists; the eager context's handle is created exactly when
    # the runtime starts (the first op or device listing).
    return context.context()._context_handle is not None


def variable_creator_scope_open() -> bool:
    """Whether some ``tf.variable_creator_scope`` is open in this thread."""
    graph = tf().compat.v1.get_default_graph()
    return bool(getattr(graph, "_variable_creator_stack", None))


def install_variable_creator(creator: Any) -> None:
    """Add ``creator`` to this thread's variable creator stack for the rest of the thread's life.

    What ``tf.variable_creator_scope`` does on entry, without a context to exit:
    a scope kept open for a thread's life is closed by the garbage collector when
    the thread ends (Ray Train's training thread), after TensorFlow's
    thread-local stack is gone, and its exit raises ``AttributeError: '_thread._local'
    object has no attribute '_variable_creator_stack'``. The stack TensorFlow builds
    inside the scope (entries of whatever shape this release uses) is copied and set
    again once the scope has closed; a new list, so a scope opened later still finds
    its own on exit.
    """
    graph = tf().compat.v1.get_default_graph()
    with tf().variable_creator_scope(creator):
        stack = list(graph._variable_creator_stack)
    graph._variable_creator_stack = stack


# --- Slurm ------------------------------------------------------------------------------


def slurm_hostlist_helpers() -> tuple[Any, Any]:
    """TensorFlow's Slurm parsers: ``(expand_hostlist, expand_tasks_per_node)``."""
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_hostlist,
        expand_tasks_per_node,
    )

    return expand_hostlist, expand_tasks_per_node


# --- Resuming fit from a coordinated backup ------------------------------------------


def set_initial_epoch(model: Any, epoch: int, batch: int = 0) -> None:
    """Make the running ``fit`` start at ``epoch``, skipping its first ``batch`` steps.

    Keras 3 reads ``model._initial_epoch`` after ``on_train_begin`` (as its
    BackupAndRestore sets it). tf_keras asks ``model._training_state`` for the
    initial epoch and step after ``on_train_begin`` and skips the steps itself.
    """
    if is_tf_keras_object(model):
        class _State:
            def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch: Any, initial_epoch: int,
                                                      mode: Any = None) -> tuple[int, int]:
                return epoch, batch

        model._training_state = _State()
        return
    model._initial_epoch = epoch


def clear_initial_epoch(model: Any) -> None:
    """Undo :func:`set_initial_epoch` once ``fit`` ends, so a later ``fit`` starts where it is asked to."""
    if is_tf_keras_object(model):
        if getattr(model, "_training_state", None) is not None:
            model._training_state = None
        return
    model._initial_epoch = None


def skip_keras3_steps(model: Any, batches: int) -> None:
    """Make Keras 3's ``fit`` consume the first ``batches`` batches of its epoch without training on them.

    Keras 3 resumes at epoch boundaries only: its ``fit`` calls ``model.train_function(iterator)``
    once per ``steps_per_execution`` batches, after ``on_train_begin``. The wrapper draws those
    batches from the iterator (the data order stays that of an uninterrupted run) and puts the
    real function back once they are consumed. tf_keras skips them itself
    (:func:`set_initial_epoch`).
    """
    if batches <= 0 or is_tf_keras_object(model):
        return
    original = model.train_function
    per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
    left = [batches]

    def skipping(iterator: Any) -> Any:
        if left[0] <= 0:
            return original(iterator)
        for _ in range(min(per_call, left[0])):
            next(iterator)
        left[0] -= per_call
        if left[0] <= 0:
            model.train_function = original
        return {}

    model.train_function = skipping

# --- Keras 3 LossScaleOptimizer internals (patches/keras_loss_scale.py) --------------------


def keras3_loss_scale_module() -> ModuleType | None:
    """``keras.src.optimizers.loss_scale_optimizer`` when Keras 3 runs on TensorFlow; else ``None``."""
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        from keras.src.optimizers import loss_scale_optimizer
    except ImportError:
        return None
    return loss_scale_optimizer if hasattr(loss_scale_optimizer, "LossScaleOptimizer") else None


def loss_scale_cross_replica_handler(apply: Any, optimizer: Any) -> Any:
    """The ``_handle_cross_replica`` closure inside ``LossScaleOptimizer._tf_apply``, bound to ``optimizer``.

    Keras decides "apply or skip this step" there; the probe calls it with a
    stand-in distribution. Raises ``LookupError`` if the release has no such closure.
    """
    import types

    for const in apply.__code__.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == "_handle_cross_replica":
            if const.co_freevars != ("self",):
                break
            return types.FunctionType(const, apply.__globals__, "_handle_cross_replica", None,
                                      (types.CellType(optimizer),))
    raise LookupError("LossScaleOptimizer._tf_apply has no _handle_cross_replica(self) closure")

def keras3_loss_module_root() -> ModuleType | None:
    """``keras.src`` with its TensorFlow trainer and ``losses.loss`` imported, when Keras 3 runs on TensorFlow.

    The uneven-batch patch names ``backend.tensorflow.trainer.TensorFlowTrainer.train_step`` and
    ``losses.loss.scale_loss_for_distribution``/``unscale_loss_for_distribution`` inside it.
    """
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        import keras.src
        from keras.src.losses import loss

        loss.scale_loss_for_distribution, loss.unscale_loss_for_distribution  # noqa: B018 - both exist
    except (ImportError, AttributeError):
        return None
    root: ModuleType = keras.src
    return root

def keras3_tf_optimizer_module() -> ModuleType | None:
    """``keras.src.backend.tensorflow.optimizer`` (``TFOptimizer``) when Keras 3 runs on TensorFlow; else ``None``."""
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        from keras.src.backend.tensorflow import optimizer
    except ImportError:
        return None
    return optimizer if hasattr(optimizer, "TFOptimizer") else None

def keras3_legacy_optimizer_packages() -> Any:
    """Every module object Keras 3 keeps its ``optimizers.legacy`` names in, as attributes of one namespace.

    ``keras.optimizers.legacy`` and ``tf.keras``'s copy (``keras._tf_keras.keras.optimizers.legacy``).
    ``from tensorflow.keras.optimizers.legacy import SGD`` would load that copy's file again as a
    module of its own; ``sys.modules`` gets ``tensorflow.keras.optimizers.legacy`` as the copy
    itself, so that import finds it (importing it here instead would replace ``tf.keras`` in the
    ``tensorflow`` module). A module of that name already loaded is included as it is. Keras 3
    keeps the names only to raise ``ImportError``. ``None`` when ``tf.keras`` is tf_keras (whose
    legacy optimizers are real) or Keras 3 is not on TensorFlow.
    """
    import types

    from tfstrategy._versions import keras_package

    if keras3_tensorflow_trainer() is None or keras_package() != "keras":
        return None
    found: dict[str, ModuleType] = {}
    for attribute, name in (("keras", "keras.optimizers.legacy"), ("tf_keras_copy", "keras._tf_keras.keras.optimizers.legacy")):
        try:
            found[attribute] = importlib.import_module(name)
        except ImportError:  # this Keras lacks that copy
            continue
    alias = "tensorflow.keras.optimizers.legacy"
    if "tf_keras_copy" in found:
        sys.modules.setdefault(alias, found["tf_keras_copy"])
    loaded = sys.modules.get(alias)
    if loaded is not None and all(loaded is not module for module in found.values()):
        found["tensorflow_keras"] = loaded
    return types.SimpleNamespace(**found) if found else None


def keras3_trainer_module() -> ModuleType | None:
    """``keras.src.trainers.trainer`` (``Trainer.compile``) when Keras 3 runs on TensorFlow; else ``None``."""
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        from keras.src.trainers import trainer
    except ImportError:
        return None
    return trainer if hasattr(trainer, "Trainer") else None

def set_keras3_jit_compile(model: Any, value: bool) -> None:
    """Set a Keras 3 model's XLA setting past its ``jit_compile`` property (what Keras' own setter stores)."""
    model._jit_compile = value
    model.train_function = model.test_function = model.predict_function = None

# --- The coordination service of a multi-worker job ----------------------------------


def coordination_store() -> Any:
    """The eager context when this process's coordination service is configured (its key-value store), else ``None``.

    MultiWorkerMirroredStrategy configures the service when it is created in a
    multi-worker cluster; TensorFlow exposes its store only on the private context.
    """
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.eager import context

    ctx = context.context()
    if getattr(ctx, "coordination_service", None) is None or ctx._context_handle is None:
        return None
    return ctx


def deadline_exceeded_error() -> type[BaseException]:
    """What a timed-out ``get_config_key_value`` raises."""
    return tf().errors.DeadlineExceededError


def unavailable_error() -> type[BaseException]:
    """What ``get_config_key_value`` raises once the task hosting the coordination service has exited."""
    return tf().errors.UnavailableError


# --- The multi-worker runtime, prepared before the first op --------------------------


def eager_context_module() -> ModuleType:
    """TensorFlow's eager context module (``Context`` and its collective configuration)."""
    from tensorflow.python.eager import context

    return context


def collective_strategy_module() -> ModuleType:
    """TensorFlow's ``MultiWorkerMirroredStrategy`` module (``CollectiveAllReduceExtended``)."""
    from tensorflow.python.distribute import collective_all_reduce_strategy

    return collective_all_reduce_strategy


def checkpoint_module() -> ModuleType:
    """TensorFlow's ``tf.train.Checkpoint`` module (``Checkpoint._write``, where every save writes)."""
    from tensorflow.python.checkpoint import checkpoint

    return checkpoint


def serves_already(ctx: Any, server_def: Any) -> bool:
    """Whether the running eager context ``ctx`` already serves this cluster as this task.

    The same cluster, job, task and protocol as the server it was started with
    (a ``ServerDef``); the session config may differ in what only matters before
    start-up.
    """
    enabled = ctx._collective_ops_server_def
    if ctx._context_handle is None or enabled is None or server_def is None:
        return False
    return all(getattr(enabled, field) == getattr(server_def, field)
               for field in ("cluster", "job_name", "task_index", "protocol"))


def prepare_collective_runtime(cluster: dict[str, list[str]], task_type: str, task_index: int,
                               rpc_layer: str | None = None) -> bool:
    """Configure this process's eager context for collectives as ``MultiWorkerMirroredStrategy`` would.

    ``CollectiveAllReduceExtended._initialize_multi_worker`` configures collective
    ops, the coordination service and the collective server on the eager context,
    and ``configure_collective_ops`` raises "Collective ops must be configured at
    program startup" once any op started the runtime. Made here with the same
    values before the first op, the strategy's own calls later find them already
    made (identical values are accepted), and ``enable_collective_ops`` before the
    runtime starts only records the server: it starts with the runtime, so every
    tensor the script makes before its strategy already lives on this task's devices.

    Returns:
        False if the runtime had already started (nothing was changed).
    """
    import copy

    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    if runtime_started():
        return False
    ctx = context.context()
    spec = multi_worker_util.normalize_cluster_spec(cluster)
    leader = multi_worker_util.collective_leader(spec, task_type, task_index)
    ctx.configure_collective_ops(
        collective_leader=leader,
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{task_type}/task:{task_index}",),
    )
    if ctx.coordination_service is None and task_type in ("chief", "worker"):
        jobs = [mwms.coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
                for job in ("chief", "worker") if job in spec.jobs]
        ctx.configure_coordination_service(service_type="standalone",
                                           service_leader=multi_worker_util.coordination_leader(spec),
                                           coordinated_jobs=jobs)
    config = copy.deepcopy(ctx.config)
    rewrite = config.graph_options.rewrite_options
    rewrite.scoped_allocator_optimization = mwms.rewriter_config_pb2.RewriterConfig.ON
    del rewrite.scoped_allocator_opts.enable_op[:]
    rewrite.scoped_allocator_opts.enable_op.append("CollectiveReduce")
    config.experimental.collective_group_leader = leader
    ctx.enable_collective_ops(mwms.tensorflow_server_pb2.ServerDef(
        cluster=spec.as_cluster_def(), default_session_config=config, job_name=task_type,
        task_index=task_index, protocol=rpc_layer or "grpc", port=0,
    ))
    return True
