"""Which Keras a model or ``tf.keras`` belongs to: Keras 3 or tf_keras (legacy Keras 2)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from types import ModuleType

from tfstrategy._compat.registry import accessor

#: The values of TF_USE_LEGACY_KERAS that make TensorFlow load tf_keras as tf.keras.
LEGACY_KERAS_TRUE = ("true", "True", "1")


def is_tf_keras_object(obj: object) -> bool:
    """Whether ``obj`` (a model, optimizer, metric, ...) comes from tf_keras rather than Keras 3."""
    return any(klass.__module__.split(".", 1)[0] == "tf_keras" for klass in type(obj).__mro__)


def keras_for(obj: object = None) -> ModuleType:
    """The Keras package ``obj`` belongs to, or the one ``tf.keras`` resolves to when ``obj`` is ``None``."""
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


def legacy_keras_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``TF_USE_LEGACY_KERAS`` asks ``tf.keras`` to load tf_keras (TensorFlow's own rule).

    The variable only counts until ``tf.keras`` is first used; :func:`keras_package`
    says what ``tf.keras`` is.
    """
    env = os.environ if env is None else env
    return env.get("TF_USE_LEGACY_KERAS") in LEGACY_KERAS_TRUE


def keras_package(env: Mapping[str, str] | None = None) -> str:
    """``"tf_keras"`` or ``"keras"``: the package ``tf.keras`` is, or will be, in this process.

    Once TensorFlow is imported and ``tf.keras`` resolved, what it resolved to
    (a host may set ``TF_USE_LEGACY_KERAS`` afterwards, as Ray Train does, and
    TensorFlow ignores it then); before that, what ``TF_USE_LEGACY_KERAS``
    will make it. An explicit ``env`` other than ``os.environ`` is a preview of
    another process: only its variable counts.
    """
    if env is None or env is os.environ:
        resolved = resolved_tf_keras()
        if resolved is not None:
            return resolved
    return "tf_keras" if legacy_keras_requested(env) else "keras"
