"""``tf.train.Checkpoint`` internals (where every save writes)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from tfstrategy._compat.registry import accessor


@accessor("tensorflow.python.checkpoint.checkpoint:Checkpoint")
def checkpoint_module() -> ModuleType:
    """TensorFlow's ``tf.train.Checkpoint`` module (``Checkpoint._write``, where every save writes)."""
    from tensorflow.python.checkpoint import checkpoint

    module: ModuleType = checkpoint
    return module


@accessor("tensorflow.python.checkpoint.checkpoint:Checkpoint._write")
def checkpoint_write_target() -> str:
    """``Checkpoint._write`` (where ``save``, ``write`` and ``CheckpointManager.save`` all write), as a path in
    :func:`checkpoint_module`."""
    return "Checkpoint._write"


@accessor("tensorflow.python.trackable.constants:OBJECT_GRAPH_PROTO_KEY")
def checkpoint_object_graph_key() -> str:
    """The key under which a checkpoint stores its object graph (``_CHECKPOINTABLE_OBJECT_GRAPH``)."""
    from tensorflow.python.trackable import constants

    return str(constants.OBJECT_GRAPH_PROTO_KEY)


@accessor("tensorflow.core.protobuf.trackable_object_graph_pb2:TrackableObjectGraph")
def checkpoint_object_graph(reader: Any) -> Any:
    """The ``TrackableObjectGraph`` proto a checkpoint stores, from its ``tf.train.load_checkpoint`` reader."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    return trackable_object_graph_pb2.TrackableObjectGraph.FromString(reader.get_tensor(checkpoint_object_graph_key()))
