"""Make Keras 3 ``fit``/``evaluate`` work on MultiWorkerMirroredStrategy (TensorFlow backend).

Two functions of ``keras/src/backend/tensorflow/trainer.py`` go wrong only
when the strategy is MultiWorkerMirroredStrategy (MWMS) with more than one
worker (keras-team/keras#20585, #20329; seen in Keras 3.0 to 3.15):

1. ``TensorFlowTrainer._maybe_symbolic_build`` takes one batch from the
   distributed iterator to build the model. In multi-worker mode every leaf
   of that batch is a ``PerReplica``, so Keras calls
   ``strategy.reduce("MEAN", (x, y, ...), axis=None)`` on the whole tuple.
   MirroredStrategy reduces nests; MWMS does not, and the tuple reaches
   ``convert_to_tensor``: ``ValueError: Attempt to convert a value (PerReplica...)``.
   Fix: build from the first local replica's part of each leaf. Only shapes
   and dtypes matter for a symbolic build, so no communication is needed.

2. ``reduce_per_replica``, in its MWMS branch, averages step outputs with
   ``strategy.reduce("MEAN", v, axis=0)``. ``axis`` of ``Strategy.reduce`` is an
   axis *inside* each replica's value (a further mean over the batch); the
   losses and metrics are scalars, hence ``Invalid reduction dimension 0 for
   input with 0 dimensions``. Every other strategy averages across replicas
   only. Fix: ``axis=None`` (the cross-replica mean) for ``auto``/``mean``; the
   same for ``sum``, which Keras calls without the required ``axis`` (unused by
   ``fit``/``evaluate``/``predict`` today). ``concat`` (``predict``) works as is.

Not fixed: ``compile(steps_per_execution>1)`` under MWMS fails inside the
``while_loop`` Keras builds around several steps ("You must feed a value for
placeholder tensor ...while/cond/Placeholder"), with or without this fix; the
fixed symbolic build refuses it up front with a clear error instead.

Both replacements call the original Keras function unless the strategy is
MWMS in multi-worker mode, so every other strategy runs Keras' own code.
:func:`probe` runs the *original* functions against a stand-in for a
multi-worker MWMS (a real one needs a cluster) and reports which bug is still
there; :func:`apply_keras_mwms_fix` installs only those parts, only on Keras 3.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable

from tfstrategy._tf import tf
from tfstrategy.errors import StrategyError

#: Keras versions known to need the fix (checked by tests/test_mwms_fix.py).
FIRST_AFFECTED = (3, 0)
LAST_CHECKED = "3.15.1"

_lock = threading.Lock()
_originals: dict[str, Callable[..., Any]] = {}


@dataclass(frozen=True, kw_only=True)
class MWMSFixStatus:
    """What :func:`probe`/:func:`apply_keras_mwms_fix` found and did."""

    keras_version: str
    build_broken: bool
    reduce_broken: bool
    applied: tuple[str, ...] = ()
    note: str = ""

    @property
    def needed(self) -> bool:
        return self.build_broken or self.reduce_broken


def _keras_trainer() -> tuple[str, Any]:
    """Keras' version and its TensorFlow trainer module (``None`` when not Keras 3 on TF)."""
    import keras

    version = str(getattr(keras, "__version__", "0"))
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if parts < FIRST_AFFECTED or keras.backend.backend() != "tensorflow":
        return version, None
    try:
        from keras.src.backend.tensorflow import trainer
    except ImportError:  # internals moved: nothing of ours applies any more
        return version, None
    return version, trainer


def _multi_worker(strategy: Any) -> bool:
    """Keras' own test for the code paths fixed here."""
    distribute = tf().distribute
    return isinstance(strategy, distribute.MultiWorkerMirroredStrategy) and bool(strategy.extended._in_multi_worker_mode())


def _first_local_replica(strategy: Any, value: Any) -> Any:
    if isinstance(value, tf().distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _fixed_symbolic_build(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = getattr(self, "_distribute_strategy", None)
        multi_worker = strategy is not None and _multi_worker(strategy)
        steps = int(getattr(self, "steps_per_execution", 1) or 1)
        if multi_worker and steps > 1:
            raise StrategyError(
                f"Received compile(steps_per_execution={steps}) with MultiWorkerMirroredStrategy; Keras "
                f"{_keras_trainer()[0]} cannot run several steps per call across workers (it fails with 'You must "
                "feed a value for placeholder tensor'). Compile with steps_per_execution=1 (the default)."
            )
        if iterator is not None and data_batch is None and multi_worker:
            from keras.src import tree

            # The same single peek Keras makes (fit resets the iterator afterwards).
            for _, _, batches in iterator:
                batch = next(batches)
                data_batch = tree.map_structure(lambda value: _first_local_replica(strategy, value), batch)
                break
            iterator = None
        return original(self, iterator=iterator, data_batch=data_batch)

    return _maybe_symbolic_build


def _fixed_reduce_per_replica(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        # MWMS is never a TPUStrategy, so Keras' "auto" means "mean" here.
        if reduction in ("auto", "mean", "sum") and _multi_worker(strategy):
            from keras.src import tree

            op = "SUM" if reduction == "sum" else "MEAN"
            return tree.map_structure(lambda value: strategy.reduce(op, value, axis=None), values)
        return original(values, strategy, reduction)

    return reduce_per_replica


def _stand_in_strategy(calls: list[tuple[Any, Any]]) -> Any:
    """Something Keras takes for a multi-worker MWMS, without a cluster; records ``reduce`` calls."""
    distribute = tf().distribute

    class _Extended:
        worker_devices = ("/job:worker/replica:0/task:0/device:CPU:0",)

        def _in_multi_worker_mode(self) -> bool:
            return True

    class _StandIn(distribute.MultiWorkerMirroredStrategy):
        def __init__(self) -> None:  # the real constructor would start a server and wait for peers
            self._stand_in_extended = _Extended()

        @property
        def extended(self) -> Any:
            return self._stand_in_extended

        def reduce(self, reduce_op: Any, value: Any, axis: Any = None) -> Any:
            calls.append((value, axis))
            return value.values[0] if isinstance(value, distribute.DistributedValues) else value

        def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
            return tuple(value.values) if isinstance(value, distribute.DistributedValues) else (value,)

        def scope(self) -> Any:
            import contextlib

            return contextlib.nullcontext()

    return _StandIn()


def probe() -> MWMSFixStatus:
    """Run Keras' original functions on a stand-in multi-worker MWMS: which bug is present?

    Uses NumPy values only, so it neither starts the TensorFlow runtime nor
    needs a cluster (a few milliseconds).
    """
    import numpy as np
    from tensorflow.python.distribute.values import PerReplica

    version, trainer = _keras_trainer()
    if trainer is None:
        return MWMSFixStatus(keras_version=version, build_broken=False, reduce_broken=False,
                             note="not Keras 3 with the TensorFlow backend: nothing to fix")
    build = _originals.get("build", trainer.TensorFlowTrainer._maybe_symbolic_build)
    reduce = _originals.get("reduce", trainer.reduce_per_replica)

    calls: list[tuple[Any, Any]] = []
    strategy = _stand_in_strategy(calls)

    class _Model:
        _distribute_strategy = distribute_strategy = strategy

        def _symbolic_build(self, iterator: Any = None, data_batch: Any = None) -> None:
            calls.append((data_batch, "built"))

    batch = (PerReplica((np.zeros((2, 3), "float32"),)), PerReplica((np.zeros((2, 1), "float32"),)))
    build(_Model(), iterator=[(0, 1, iter([batch]))])
    # Bug 1: a whole nest handed to Strategy.reduce (MWMS cannot reduce nests).
    build_broken = any(axis != "built" and isinstance(value, (tuple, list, dict)) for value, axis in calls)

    calls.clear()
    reduce({"loss": PerReplica((np.float32(1.0),))}, strategy, "auto")
    # Bug 2: a scalar reduced along axis 0.
    reduce_broken = any(axis is not None and np.ndim(_first_local_replica(strategy, value)) == 0 for value, axis in calls)
    return MWMSFixStatus(keras_version=version, build_broken=build_broken, reduce_broken=reduce_broken)


def apply_keras_mwms_fix() -> MWMSFixStatus:
    """Install the parts of the fix the installed Keras still needs (idempotent).

    tfstrategy calls this when it builds a MultiWorkerMirroredStrategy; call it
    yourself before ``fit`` if you create the strategy without tfstrategy.
    Other strategies keep running Keras' own code.
    """
    with _lock:
        status = probe()
        _, trainer = _keras_trainer()
        if trainer is None:
            return status
        if status.build_broken and "build" not in _originals:
            _originals["build"] = trainer.TensorFlowTrainer._maybe_symbolic_build
            trainer.TensorFlowTrainer._maybe_symbolic_build = _fixed_symbolic_build(_originals["build"])
        if status.reduce_broken and "reduce" not in _originals:
            # Keras looks the function up as a module global at each call.
            _originals["reduce"] = trainer.reduce_per_replica
            trainer.reduce_per_replica = _fixed_reduce_per_replica(_originals["reduce"])
        return MWMSFixStatus(keras_version=status.keras_version, build_broken=status.build_broken,
                             reduce_broken=status.reduce_broken, applied=tuple(sorted(_originals)))


def remove_keras_mwms_fix() -> None:
    """Restore Keras' original functions."""
    with _lock:
        _, trainer = _keras_trainer()
        if trainer is None:
            return
        if "build" in _originals:
            trainer.TensorFlowTrainer._maybe_symbolic_build = _originals.pop("build")
        if "reduce" in _originals:
            trainer.reduce_per_replica = _originals.pop("reduce")
