"""``tf.distribute`` internals: strategy kinds, collective keys, per-replica values, Slurm parsing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tfstrategy._compat.registry import accessor
from tfstrategy._tf import tf

if TYPE_CHECKING:
    from tfstrategy._protocols import Strategy


@accessor("tensorflow.python.distribute.collective_all_reduce_strategy:CollectiveAllReduceExtended._in_multi_worker_mode")
def in_multi_worker_mode(strategy: Strategy) -> bool:
    """Whether a MultiWorkerMirroredStrategy spans more than one worker (Keras' own test)."""
    return isinstance(strategy, tf().distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode()
    )


@accessor("tensorflow.python.distribute.distribute_lib:_DefaultDistributionStrategy",
          "tensorflow.python.distribute.distribute_lib:_DefaultDistributionStrategyV1")
def is_default_strategy(strategy: Strategy) -> bool:
    """Whether ``strategy`` is TensorFlow's default (no-distribution) strategy (``_DefaultDistributionStrategy``,
    or its ``tf.compat.v1`` twin)."""
    return type(strategy).__name__ in ("_DefaultDistributionStrategy", "_DefaultDistributionStrategyV1")


@accessor("tensorflow.python.distribute.mirrored_strategy:MirroredStrategy._collective_key_base")
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


@accessor("tensorflow.python.distribute.values:PerReplica")
def per_replica(values: tuple[object, ...]) -> object:
    """A ``PerReplica`` value (what a distributed iterator yields) from per-replica parts."""
    from tensorflow.python.distribute.values import PerReplica

    return PerReplica(values)


@accessor("tensorflow.python.data.ops.optional_ops:_OptionalImpl._type_spec")
def optional_type_spec(optional: Any) -> object:
    """The ``TypeSpec`` of a ``tf.experimental.Optional`` (a ``while_loop`` shape invariant needs it)."""
    return optional._type_spec


@accessor("tensorflow.python.framework.func_graph:FuncGraph.capture_call_time_value")
def capture_call_time_value(function: object, spec: object) -> object:
    """A deferred capture in the graph being traced, as the collective ops' instance keys use."""
    return tf().compat.v1.get_default_graph().capture_call_time_value(function, spec)


@accessor("tensorflow.python.framework.func_graph:FuncGraph.captures",
          "tensorflow.python.framework.func_graph:FuncGraph.outer_graph")
def graph_captures(graph: object) -> tuple[list[tuple[Any, Any]], Any]:
    """A ``tf.function`` graph's captures as ``(outside value, placeholder inside)`` pairs, and its outer graph.

    ``([], None)`` for a graph that is not a function's (it captures nothing).
    """
    captures = getattr(graph, "captures", None)
    if captures is None:
        return [], None
    return list(captures), getattr(graph, "outer_graph", None)


@accessor("tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver:expand_hostlist", "tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver:expand_tasks_per_node")
def slurm_hostlist_helpers() -> tuple[Any, Any]:
    """TensorFlow's Slurm parsers: ``(expand_hostlist, expand_tasks_per_node)``."""
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_hostlist,
        expand_tasks_per_node,
    )

    return expand_hostlist, expand_tasks_per_node


@accessor("tensorflow.python.distribute.collective_all_reduce_strategy:CollectiveAllReduceExtended._in_multi_worker_mode")
def multi_worker_extended_stand_in(worker_device: str, **attributes: object) -> object:
    """A stand-in for the ``extended`` of a multi-worker ``MultiWorkerMirroredStrategy``, for probes.

    Its ``_in_multi_worker_mode()`` is true (what Keras asks), ``worker_devices`` is
    ``(worker_device,)``, and it has the given ``attributes``.
    """

    class _Extended:
        worker_devices = (worker_device,)

        def _in_multi_worker_mode(self) -> bool:
            return True

    extended = _Extended()
    for name, value in attributes.items():
        setattr(extended, name, value)
    return extended
