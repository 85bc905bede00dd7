"""Keras 3 trainer and callback internals that the patches replace (``keras.src``)."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy._compat.registry import accessor
from tfstrategy.state.replacement import get_path as get_path  # one walker of dotted paths, the replacements'

if TYPE_CHECKING:
    from tfstrategy._protocols import Strategy


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer")
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
    module: ModuleType = trainer
    return module


@accessor("keras.src.saving.saving_lib:save_model", "keras.src.callbacks.backup_and_restore:BackupAndRestore", "keras.src.callbacks.csv_logger:CSVLogger", "keras.src.callbacks.tensorboard:TensorBoard", "keras.src.legacy.saving.legacy_h5_format:save_model_to_hdf5", "keras.src.utils.file_utils:makedirs", "keras.src.export.saved_model_export_archive:SavedModelExportArchive | keras.src.export.saved_model:ExportArchive")
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
    package: ModuleType = keras.src
    return package


@accessor("keras.src.callbacks.backup_and_restore:BackupAndRestore._weights_path", "keras.src.callbacks.backup_and_restore:BackupAndRestore._training_metadata_path", "keras.src.callbacks.backup_and_restore:BackupAndRestore._prev_weights_path", "keras.src.callbacks.backup_and_restore:BackupAndRestore._prev_training_metadata_path")
def backup_file_attributes() -> tuple[str, ...]:
    """The attributes of Keras 3's ``BackupAndRestore`` naming its files under ``backup_dir``."""
    return ("_weights_path", "_training_metadata_path", "_prev_weights_path", "_prev_training_metadata_path")


@accessor("keras.src.callbacks.tensorboard:TensorBoard._log_write_dir")
def tensorboard_write_dir(callback: Any) -> Any:
    """The directory Keras 3's ``TensorBoard`` callback writes its event files under."""
    return callback._log_write_dir


@accessor("keras.src.trainers.trainer:Trainer._distribute_strategy")
def set_model_strategy(model: Any, strategy: Strategy) -> None:
    """Record ``strategy`` as the one a Keras 3 model was created under (a probe's stand-in model)."""
    model._distribute_strategy = strategy


@accessor("keras.src.tree:flatten")
def keras3_tree() -> ModuleType:
    """Keras 3's nest utilities (``keras.src.tree``), which handle its ``None`` leaves as Keras does."""
    from keras.src import tree

    module: ModuleType = tree
    return module


def set_path(root: object, path: str, value: object) -> None:
    """Set ``root.a.b = value`` for ``path="a.b"``."""
    owner_path, _, name = path.rpartition(".")
    setattr(get_path(root, owner_path) if owner_path else root, name, value)


def del_path(root: object, path: str) -> None:
    """Delete ``root.a.b`` for ``path="a.b"`` (an attribute a patch added)."""
    owner_path, _, name = path.rpartition(".")
    delattr(get_path(root, owner_path) if owner_path else root, name)


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._make_function")
def trainer_make_function_target() -> str:
    """Keras 3's ``TensorFlowTrainer._make_function`` (builds the step loop ``fit`` calls), as a path in the trainer module."""
    return "TensorFlowTrainer._make_function"


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build")
def trainer_build_peek_target() -> str:
    """Keras 3's ``TensorFlowTrainer._maybe_symbolic_build`` (builds from one batch before the first step), as a path."""
    return "TensorFlowTrainer._maybe_symbolic_build"


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer._autoconvert_optionals?")
def copy_autoconvert_optionals(trainer_module: ModuleType, stand_in: type) -> None:
    """Give a stand-in trainer class Keras 3.12+'s ``TensorFlowTrainer._autoconvert_optionals`` (``_make_function``
    wraps the step with it); nothing on older Keras."""
    convert = getattr(trainer_module.TensorFlowTrainer, "_autoconvert_optionals", None)
    if convert is not None:
        stand_in._autoconvert_optionals = convert  # type: ignore[attr-defined]


@accessor("keras.src.callbacks.backup_and_restore:BackupAndRestore._save_model")
def backup_save_target() -> str:
    """Keras 3's ``BackupAndRestore._save_model`` (writes the backup), as a path in :func:`keras3_file_writers`."""
    return "callbacks.backup_and_restore.BackupAndRestore._save_model"


@accessor("keras.src.backend.tensorflow.trainer:TensorFlowTrainer.train_step", "keras.src.losses.loss:scale_loss_for_distribution", "keras.src.losses.loss:unscale_loss_for_distribution")
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


@accessor("keras.src.trainers.trainer:Trainer.compile", "keras.src.trainers.trainer:Trainer.jit_compile")
def keras3_trainer_module() -> ModuleType | None:
    """``keras.src.trainers.trainer`` (``Trainer.compile``) when Keras 3 runs on TensorFlow; else ``None``."""
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        from keras.src.trainers import trainer
    except ImportError:
        return None
    return trainer if hasattr(trainer, "Trainer") else None


@accessor("keras.src.trainers.trainer:Trainer._jit_compile")
def set_keras3_jit_compile(model: Any, value: bool) -> None:
    """Set a Keras 3 model's XLA setting past its ``jit_compile`` property (what Keras' own setter stores)."""
    model._jit_compile = value
    model.train_function = model.test_function = model.predict_function = None


@accessor("keras.src.utils.traceback_utils:inject_argument_info_in_traceback")
def keep_keras_error_message(error: BaseException) -> BaseException:
    """Mark an error raised inside a layer's ``call`` so Keras re-raises it as it is.

    Keras rewraps such an error in a new one of its class whose message adds "Exception encountered when
    calling ..." and the arguments, unless it carries ``_keras_call_info_injected`` (the innermost call's mark).
    """
    error._keras_call_info_injected = True  # type: ignore[attr-defined]
    return error


_TRAINER = "keras.src.backend.tensorflow.trainer:TensorFlowTrainer"
_BASE_TRAINER = "keras.src.trainers.trainer:Trainer"
_BASE_OPTIMIZER = "keras.src.optimizers.base_optimizer:BaseOptimizer"
_TF_OPTIMIZER = "keras.src.backend.tensorflow.optimizer:TFOptimizer"


@accessor(f"{_TRAINER}.predict_on_batch", f"{_BASE_TRAINER}.compute_loss", f"{_BASE_TRAINER}._compute_loss",
          f"{_BASE_OPTIMIZER}._clip_gradients", f"{_BASE_OPTIMIZER}._backend_apply_gradients",
          f"{_BASE_OPTIMIZER}._backend_reset_gradient_accumulators", f"{_BASE_OPTIMIZER}._get_variable_index",
          f"{_TF_OPTIMIZER}._all_reduce_sum_gradients", f"{_TF_OPTIMIZER}._backend_increment_gradient_accumulators",
          "keras.src.backend.tensorflow.random:draw_seed", "keras.src.backend.tensorflow.image:draw_seed",
          "keras.src.layers.rnn.rnn:RNN.call")
def keras3_training_api_root() -> ModuleType | None:
    """``keras.src`` with its TensorFlow trainer and optimizer imported, when Keras 3 runs on TensorFlow.

    The issue-44 patches name ``backend.tensorflow.trainer.TensorFlowTrainer.predict_on_batch``,
    ``trainers.trainer.Trainer.compute_loss``/``_compute_loss``, ``optimizers.base_optimizer.BaseOptimizer``'s
    ``_clip_gradients`` and ``backend.tensorflow.optimizer.TFOptimizer``'s ``_all_reduce_sum_gradients`` and
    ``_backend_apply_gradients`` inside it, and the TensorFlow backend's ``random.draw_seed`` and
    ``image.draw_seed`` (each module's own name for ``keras.src.random.seed_generator.draw_seed``), and
    ``layers.rnn.rnn.RNN.call``.
    """
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        import keras.src
        from keras.src.backend.tensorflow import image, optimizer, random  # noqa: F401 - imported for the attribute paths
        from keras.src.layers.rnn import rnn  # noqa: F401
        from keras.src.optimizers import base_optimizer  # noqa: F401
        from keras.src.trainers import trainer  # noqa: F401
    except ImportError:
        return None
    root: ModuleType = keras.src
    return root
