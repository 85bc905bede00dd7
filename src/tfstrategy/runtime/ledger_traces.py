"""Fingerprints of the train/eval functions a worker traces, for its ledger (:mod:`tfstrategy.runtime.ledger`).

Every synchronous step, Keras' ``train_function`` and a custom loop's ``tf.function`` alike,
calls ``tf.distribute.Strategy.run`` once per trace. The ``ledger`` step replaces it (an
undoable :class:`~tfstrategy.runtime.rewrites.Rewrite`) with a wrapper that, only while a
function is being traced, fingerprints the graph built so far: the counts of its op types
(nested functions included) and the shapes and dtypes of the variables it reads, hashed to 16
hex digits. Two workers that trace different steps (another model, another loss, another
optimizer) get different fingerprints, and their collectives never meet; the same code gives
the same fingerprint on every worker. The collective ops in the graph are counted too (the
multi-worker all-reduces and all-gathers; a single-process ``MirroredStrategy`` reduces without
them). An eager call (no trace) costs one attribute read. tfstrategy's own checks (the
divergence sentinel's, a probe's) are left out: they are the same on every worker by construction.

Only public TensorFlow API is read: the default graph, its operations and ``as_graph_def``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from tfstrategy.contract.ledger import FunctionTrace
from tfstrategy.state.registry import RUNTIME

__all__ = ["GraphSummary", "fingerprint_traces", "summarize_graph", "trace_of"]

#: Op types that call a function of the graph's library (their bodies are counted too).
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "While", "StatelessWhile", "If", "StatelessIf",
                    "Case", "StatelessCase"})
#: Collective op types that set up, not exchange, data.
_NOT_EXCHANGES = frozenset({"CollectiveAssignGroupV2", "CollectiveInitializeCommunicator"})


def is_collective(op_type: str) -> bool:
    """Whether an op of ``op_type`` exchanges data between replicas or workers (all-reduce, all-gather, ...)."""
    return (op_type.startswith("Collective") or op_type.startswith("Nccl")) and op_type not in _NOT_EXCHANGES


class GraphSummary:
    """What a traced graph computes: op-type counts and the variables it reads, and their hash."""

    def __init__(self, ops: Counter[str], variables: Iterable[tuple[tuple[int | None, ...] | None, str]]) -> None:
        self.ops = ops
        self.variables = sorted(variables, key=repr)

    @property
    def collectives(self) -> int:
        return sum(count for op_type, count in self.ops.items() if is_collective(op_type))

    def fingerprint(self) -> str:
        """16 hex digits of a hash of the op-type counts and the variables' shapes and dtypes."""
        text = repr((sorted(self.ops.items()), self.variables))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """A few words a user recognises: ``"120 ops, 6 variable reads"`` (the collectives have a field of their own)."""
        reads = len(self.variables)
        return f"{sum(self.ops.values())} ops, {reads} variable read{'s' if reads != 1 else ''}"


def summarize_graph(graph: Any) -> GraphSummary:
    """The summary of ``graph`` (a ``tf.Graph`` or a ``FuncGraph`` being built), nested functions included."""
    ops: Counter[str] = Counter()
    variables = []
    calls = False
    for op in graph.get_operations():
        ops[op.type] += 1
        if op.type in _CALLS:
            calls = True
        elif op.type == "ReadVariableOp":
            shape = op.outputs[0].shape
            variables.append((tuple(shape.as_list()) if shape.rank is not None else None, op.outputs[0].dtype.name))
    if calls:  # the bodies of nested functions, loops and conditions live in the graph's library
        for function in graph.as_graph_def().library.function:
            ops.update(node.op for node in function.node_def)
    return GraphSummary(ops, variables)


def trace_of(graph: object, *, kind: str, epoch: int, step: int) -> FunctionTrace:
    """The ledger's record of the function whose graph is ``graph``."""
    summary = summarize_graph(graph)
    return FunctionTrace(kind=kind, fingerprint=summary.fingerprint(), collectives=summary.collectives,
                         epoch=epoch, step=step, summary=summary.describe())


def _fingerprinting(original: Callable[..., object]) -> Callable[..., object]:
    import tensorflow as tf

    from tfstrategy.runtime.ledger import current_keeper

    def run(self: object, fn: object, args: object = (), kwargs: object = None, options: object = None) -> object:
        graph = tf.compat.v1.get_default_graph()
        if not getattr(graph, "building_function", False) or _tfstrategys_own(sys._getframe(1).f_code.co_filename):
            return original(self, fn, args, kwargs, options)  # eager, or tfstrategy's own check
        keeper = current_keeper()
        if keeper is not None:
            keeper.tracing = keeper.function_kind()  # a trace that never returns (it waits on a peer) says so
        try:
            result = original(self, fn, args, kwargs, options)
        finally:
            if keeper is not None:
                keeper.tracing = None
        _record(graph)
        return result

    run.__wrapped__ = original  # type: ignore[attr-defined]
    run.__doc__ = original.__doc__
    return run


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PATCHES = os.path.join(_PACKAGE, "patches") + os.sep


def _tfstrategys_own(filename: str) -> bool:
    """Whether a ``Strategy.run`` called from ``filename`` is tfstrategy's own check (the divergence sentinel, a
    probe): the same on every worker by construction, and no train/eval function of the user's. (A Keras
    workaround's ``Strategy.run`` is Keras' train function, rebuilt: it counts.)"""
    path = os.path.abspath(filename)
    return path.startswith(_PACKAGE) and not path.startswith(_PATCHES)


def _record(graph: object) -> None:
    from tfstrategy.runtime.ledger import current_keeper

    keeper = current_keeper()
    if keeper is None:
        return
    try:
        keeper.traced(trace_of(graph, kind=keeper.function_kind(), epoch=keeper.epoch, step=keeper.total_steps))
    except Exception:  # the ledger must never break the user's step
        pass


def fingerprint_traces() -> str:
    """Install the fingerprinting ``Strategy.run`` (a rewrite); what it adds to the ``ledger`` step's line."""
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    def distribute() -> Any:
        import tensorflow as tf

        return tf.distribute

    install_rewrite(Rewrite("ledger_traces", distribute,
                            {"Strategy.run": _fingerprinting, "Strategy.scope": _recording_weights_in_scope},
                            detail="each traced Strategy.run (Keras' train function, a custom loop) is fingerprinted "
                                   "for the worker's ledger, and each Keras weight created in the strategy's scope "
                                   "recorded"))
    return ", the fingerprints of traced functions and the model's weights"


def _recording_weights_in_scope(original: Callable[..., object]) -> Callable[..., object]:
    """``Strategy.scope`` that, once Keras is imported, records each Keras weight created (models are built there).

    The ledger step runs while TensorFlow is imported, often from inside Keras' own import: Keras'
    layers are hooked at the first ``scope()`` instead, where the user's model is about to be built.
    """

    def scope(self: object) -> object:
        if RUNTIME.replacement("ledger_weights") is None:
            _record_weights()
        return original(self)

    scope.__wrapped__ = original  # type: ignore[attr-defined]
    scope.__doc__ = original.__doc__
    return scope


def _record_weights() -> None:
    """Hook Keras 3's ``Layer.add_weight`` if Keras is imported and runs on TensorFlow (tf_keras: not recorded)."""
    from tfstrategy.runtime.rewrites import Rewrite, install_rewrite

    keras = sys.modules.get("keras")
    layers = getattr(keras, "layers", None)
    backend = getattr(keras, "backend", None)
    if layers is None or backend is None or backend.backend() != "tensorflow":
        return
    install_rewrite(Rewrite("ledger_weights", lambda: layers, {"Layer.add_weight": _recording_weights},
                            detail="each Keras weight's name and shape, for the worker's ledger (workers that build "
                                   "different models are told apart before their first trace)"))


def _recording_weights(original: Callable[..., object]) -> Callable[..., object]:
    import inspect

    signature = inspect.signature(original)

    def add_weight(self: object, *args: object, **kwargs: object) -> object:
        from tfstrategy.runtime.ledger import current_keeper

        keeper = current_keeper()
        if keeper is not None:
            try:
                bound = signature.bind(self, *args, **kwargs).arguments
                shape = bound.get("shape")
                keeper.weight_created(f"{getattr(self, 'name', '?')}/{bound.get('name') or 'weight'}",
                                      str(tuple(shape) if shape is not None else ()))
            except Exception:  # the ledger must never break the user's model
                pass
        return original(self, *args, **kwargs)

    add_weight.__wrapped__ = original  # type: ignore[attr-defined]
    add_weight.__doc__ = original.__doc__
    return add_weight
