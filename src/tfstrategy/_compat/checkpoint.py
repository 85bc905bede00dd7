"""``tf.train.Checkpoint`` internals (where every save writes)."""

from __future__ import annotations

from types import ModuleType


def checkpoint_module() -> ModuleType:
    """TensorFlow's ``tf.train.Checkpoint`` module (``Checkpoint._write``, where every save writes)."""
    from tensorflow.python.checkpoint import checkpoint

    return checkpoint
