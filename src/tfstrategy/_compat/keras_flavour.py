"""Which Keras a model or ``tf.keras`` belongs to: Keras 3 or tf_keras (legacy Keras 2)."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

from tfstrategy._compat.registry import accessor


def is_tf_keras_object(obj: Any) -> bool:
    """Whether ``obj`` (a model, optimizer, metric, ...) comes from tf_keras rather than Keras 3."""
    return any(klass.__module__.split(".", 1)[0] == "tf_keras" for klass in type(obj).__mro__)


def keras_for(obj: Any = None) -> ModuleType:
    """The Keras package ``obj`` belongs to, or the one ``tf.keras`` resolves to when ``obj`` is ``None``."""
    from tfstrategy._versions import keras_package

    if is_tf_keras_object(obj) if obj is not None else keras_package() == "tf_keras":
        import tf_keras

        legacy: ModuleType = tf_keras
        return legacy
    import keras

    keras3: ModuleType = keras
    return keras3


@accessor("tensorflow.python.util.lazy_loader:KerasLazyLoader._tfll_initialized", "tensorflow.python.util.lazy_loader:KerasLazyLoader._tfll_keras_version")
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
        version = str(state.get("_tfll_keras_version"))
        return {"tf_keras": "tf_keras", "keras_3": "keras"}.get(version)
    root = str(state.get("__name__", "")).split(".", 1)[0]
    return root if root in ("keras", "tf_keras") else None


def keras_version(module: ModuleType) -> str:
    """The ``__version__`` of a Keras package (Keras 3 or tf_keras)."""
    return str(getattr(module, "__version__", "0"))
