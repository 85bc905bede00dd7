"""Keras 3 trainer and callback internals that the patches replace (``keras.src``)."""

from __future__ import annotations

from types import ModuleType
from typing import Any


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
