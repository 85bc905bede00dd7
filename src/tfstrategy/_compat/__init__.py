"""Every private TensorFlow and Keras attribute tfstrategy reads or writes, in one place.

TensorFlow and Keras have no public API for some things tfstrategy must know
(which strategy owns a model, whether the runtime has started, the Keras trainer
functions the patches replace). Each such access is one small function in this
package, one module per upstream area, so a new release breaks this package only,
and ``tests/test_compat.py`` says which function broke. Nothing else in tfstrategy
names a private TF/Keras attribute. Callers use the names re-exported here.

Each accessor is registered (``@accessor`` in :mod:`.registry`) with the upstream
names it needs; :func:`accessor_status` checks them without calling upstream code,
and ``tfstrategy env --compat`` prints the result.

Keras flavours: a model is either Keras 3 (``keras``) or tf_keras (legacy
Keras 2, ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``); functions taking a
model handle both.
"""

from tfstrategy._compat.checkpoint import (
    checkpoint_module,
    checkpoint_object_graph,
    checkpoint_object_graph_key,
    checkpoint_write_target,
)
from tfstrategy._compat.collectives import (
    collective_strategy_module,
    collective_worker_count,
    coordination_store,
    deadline_exceeded_error,
    distribute_dataset_target,
    initialize_multi_worker_target,
    offset_collective_key_base,
    prepare_collective_runtime,
    serves_already,
    unavailable_error,
)
from tfstrategy._compat.datasets import (
    dataset_from_variant,
    dataset_function_captures,
    dataset_function_outputs,
    dataset_graph_def,
    dataset_inputs,
    op_function_outputs,
)
from tfstrategy._compat.distribute import (
    capture_call_time_value,
    in_multi_worker_mode,
    is_default_strategy,
    mirrored_collective_key_base,
    multi_worker_extended_stand_in,
    optional_type_spec,
    per_replica,
    slurm_hostlist_helpers,
)
from tfstrategy._compat.keras_fit import (
    build_peek_attribute,
    class_build_peek,
    clear_initial_epoch,
    epoch_iterator_source,
    has_class_build_peek,
    set_initial_epoch,
    set_steps_per_execution,
    skip_keras3_steps,
    steps_per_execution,
)
from tfstrategy._compat.keras_flavour import (
    is_tf_keras_object,
    keras_for,
    keras_version,
    resolved_tf_keras,
)
from tfstrategy._compat.keras_models import (
    compiled_metric_objects,
    keras3_nothing_left_to_build,
    keras_tensor_layer,
    keras_variable_types,
    model_metric_variables,
    model_state_variables,
    model_strategy,
    stand_in_build_model,
    symbolic_build,
    tf_variable,
    variable_path,
)
from tfstrategy._compat.keras_optimizers import (
    keras3_loss_scale_module,
    loss_scale_cross_replica_handler,
    loss_scale_step_handler,
    optimizer_built,
    optimizer_strategy,
    optimizer_variables,
)
from tfstrategy._compat.keras_trainer import (
    backup_file_attributes,
    backup_save_target,
    copy_autoconvert_optionals,
    get_path,
    keras3_file_writers,
    keras3_tensorflow_trainer,
    keras3_tree,
    set_model_strategy,
    set_path,
    tensorboard_write_dir,
    trainer_build_peek_target,
    trainer_make_function_target,
)
from tfstrategy._compat.random_state import (
    keras_global_seed_generator,
    numpy_if_imported,
    tf_global_generator,
)
from tfstrategy._compat.registry import (
    AccessorStatus,
    accessor_status,
    accessor_summary,
    registered_accessors,
)
from tfstrategy._compat.runtime import (
    autograph_source_map,
    eager_context_module,
    install_variable_creator,
    runtime_started,
    variable_creator_scope_open,
)

__all__ = [
    "AccessorStatus",
    "accessor_status",
    "accessor_summary",
    "autograph_source_map",
    "backup_file_attributes",
    "backup_save_target",
    "capture_call_time_value",
    "checkpoint_module",
    "checkpoint_object_graph",
    "checkpoint_object_graph_key",
    "checkpoint_write_target",
    "class_build_peek",
    "clear_initial_epoch",
    "collective_strategy_module",
    "collective_worker_count",
    "compiled_metric_objects",
    "coordination_store",
    "copy_autoconvert_optionals",
    "dataset_from_variant",
    "dataset_function_captures",
    "dataset_function_outputs",
    "dataset_graph_def",
    "dataset_inputs",
    "deadline_exceeded_error",
    "distribute_dataset_target",
    "eager_context_module",
    "epoch_iterator_source",
    "get_path",
    "has_class_build_peek",
    "in_multi_worker_mode",
    "initialize_multi_worker_target",
    "install_variable_creator",
    "is_default_strategy",
    "is_tf_keras_object",
    "keras3_file_writers",
    "keras3_loss_scale_module",
    "keras3_nothing_left_to_build",
    "keras3_tensorflow_trainer",
    "keras3_tree",
    "keras_for",
    "keras_global_seed_generator",
    "keras_tensor_layer",
    "keras_variable_types",
    "keras_version",
    "loss_scale_cross_replica_handler",
    "loss_scale_step_handler",
    "mirrored_collective_key_base",
    "model_metric_variables",
    "model_state_variables",
    "model_strategy",
    "multi_worker_extended_stand_in",
    "numpy_if_imported",
    "offset_collective_key_base",
    "op_function_outputs",
    "optimizer_built",
    "optimizer_strategy",
    "optimizer_variables",
    "optional_type_spec",
    "build_peek_attribute",
    "per_replica",
    "prepare_collective_runtime",
    "registered_accessors",
    "resolved_tf_keras",
    "runtime_started",
    "serves_already",
    "set_initial_epoch",
    "set_model_strategy",
    "set_path",
    "set_steps_per_execution",
    "skip_keras3_steps",
    "slurm_hostlist_helpers",
    "stand_in_build_model",
    "steps_per_execution",
    "symbolic_build",
    "tensorboard_write_dir",
    "tf_global_generator",
    "tf_variable",
    "trainer_build_peek_target",
    "trainer_make_function_target",
    "unavailable_error",
    "variable_creator_scope_open",
    "variable_path",
]
