"""Every private TensorFlow and Keras attribute tfstrategy reads or writes, in one place.

TensorFlow and Keras have no public API for some things tfstrategy must know
(which strategy owns a model, whether the runtime has started, the Keras trainer
functions the patches replace). Each such access is one small function in this
package, one module per upstream area, so a new release breaks this package only,
and ``tests/test_compat.py`` says which function broke. Nothing else in tfstrategy
names a private TF/Keras attribute. Callers use the names re-exported here.

Keras flavours: a model is either Keras 3 (``keras``) or tf_keras (legacy
Keras 2, ``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``); functions taking a
model handle both.
"""

from tfstrategy._compat.checkpoint import (
    checkpoint_module,
)
from tfstrategy._compat.collectives import (
    collective_strategy_module,
    coordination_store,
    deadline_exceeded_error,
    prepare_collective_runtime,
    serves_already,
    unavailable_error,
)
from tfstrategy._compat.datasets import (
    dataset_from_variant,
    dataset_function_captures,
    dataset_function_outputs,
    dataset_inputs,
    op_function_outputs,
)
from tfstrategy._compat.distribute import (
    capture_call_time_value,
    in_multi_worker_mode,
    is_default_strategy,
    mirrored_collective_key_base,
    optional_type_spec,
    per_replica,
    slurm_hostlist_helpers,
)
from tfstrategy._compat.keras_fit import (
    clear_initial_epoch,
    epoch_iterator_source,
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
    keras_variable_types,
    model_metric_variables,
    model_state_variables,
    model_strategy,
    symbolic_build,
    tf_variable,
    variable_path,
)
from tfstrategy._compat.keras_optimizers import (
    keras3_loss_scale_module,
    loss_scale_cross_replica_handler,
    optimizer_built,
    optimizer_strategy,
    optimizer_variables,
)
from tfstrategy._compat.keras_trainer import (
    backup_file_attributes,
    get_path,
    keras3_file_writers,
    keras3_tensorflow_trainer,
    keras3_tree,
    set_model_strategy,
    set_path,
    tensorboard_write_dir,
)
from tfstrategy._compat.random_state import (
    keras_global_seed_generator,
    numpy_if_imported,
    tf_global_generator,
)
from tfstrategy._compat.runtime import (
    autograph_source_map,
    eager_context_module,
    install_variable_creator,
    runtime_started,
    variable_creator_scope_open,
)

__all__ = [
    "is_tf_keras_object",
    "keras_for",
    "keras_version",
    "resolved_tf_keras",
    "backup_file_attributes",
    "get_path",
    "keras3_file_writers",
    "keras3_tensorflow_trainer",
    "keras3_tree",
    "set_model_strategy",
    "set_path",
    "tensorboard_write_dir",
    "keras3_loss_scale_module",
    "loss_scale_cross_replica_handler",
    "optimizer_built",
    "optimizer_strategy",
    "optimizer_variables",
    "compiled_metric_objects",
    "keras3_nothing_left_to_build",
    "keras_variable_types",
    "model_metric_variables",
    "model_state_variables",
    "model_strategy",
    "symbolic_build",
    "tf_variable",
    "variable_path",
    "clear_initial_epoch",
    "epoch_iterator_source",
    "set_initial_epoch",
    "set_steps_per_execution",
    "skip_keras3_steps",
    "steps_per_execution",
    "keras_global_seed_generator",
    "numpy_if_imported",
    "tf_global_generator",
    "capture_call_time_value",
    "in_multi_worker_mode",
    "is_default_strategy",
    "mirrored_collective_key_base",
    "optional_type_spec",
    "per_replica",
    "slurm_hostlist_helpers",
    "dataset_from_variant",
    "dataset_function_captures",
    "dataset_function_outputs",
    "dataset_inputs",
    "op_function_outputs",
    "autograph_source_map",
    "eager_context_module",
    "install_variable_creator",
    "runtime_started",
    "variable_creator_scope_open",
    "collective_strategy_module",
    "coordination_store",
    "deadline_exceeded_error",
    "prepare_collective_runtime",
    "serves_already",
    "unavailable_error",
    "checkpoint_module",
]
