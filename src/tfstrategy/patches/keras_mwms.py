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
   Fix: while Keras' own function runs, that strategy's ``reduce`` returns the
   first local replica's part of each leaf instead. Only shapes and dtypes
   matter for a symbolic build, so no communication is needed, and Keras' own
   code (whichever way its release iterates the data) does the rest.

2. ``reduce_per_replica``, in its MWMS branch, averages step outputs with
   ``strategy.reduce("MEAN", v, axis=0)``. ``axis`` of ``Strategy.reduce`` is an
   axis *inside* each replica's value (a further mean over the batch); the
   losses and metrics are scalars, hence ``Invalid reduction dimension 0 for
   input with 0 dimensions``. Every other strategy averages across replicas
   only. Fix: ``axis=None`` (the cross-replica mean) for ``auto``/``mean``; the
   same for ``sum``, which Keras calls without the required ``axis`` (unused by
   ``fit``/``evaluate``/``predict`` today). ``concat`` (``predict``) works as is.
   The logs are sent in one packed all-reduce rather than one per log
   (``batch_reduce_to``), which saves a cross-worker round trip per metric per step.

3. ``compile(steps_per_execution>1)``, once 1 and 2 are fixed, fails at the
   first execution with "You must feed a value for placeholder tensor
   'while/body/_9/while/cond/then/_164/while/cond/Placeholder' with dtype int32".
   Root cause: the one described in
   :mod:`~tfstrategy.patches.keras_steps_per_execution`, nothing specific to
   workers. Each step's gradient all-reduce is a ``CollectiveReduceV2`` whose
   group and instance keys (the int32 placeholders) are deferred captures,
   picked when the function is called; Keras calls the step's nested
   ``tf.function`` from a ``tf.cond`` inside its ``while_loop``, and cond_v2
   never feeds deferred captures of its branches. MWMS reduces with the same
   collectives as a multi-device MirroredStrategy, so it breaks the same way
   (measured: TensorFlow 2.21, Keras 3.15.1, 2 workers on loopback). Fix: that
   patch's loop (the step traced inline in one ``while_loop``, no ``tf.cond``)
   already covers MWMS; the fixed symbolic build makes sure it is installed
   when a multi-worker model compiles with ``steps_per_execution > 1``, and
   refuses only if that patch could not be installed (its probe failed). The
   loop's end-of-data test, ``get_next_as_optional().has_value()`` on the
   distributed iterator, is agreed across workers by TensorFlow, so every
   worker runs the same number of steps in the last, shorter execution.

4. The same symbolic build on any strategy of 2+ replicas whose first batch is
   split unevenly (a global batch of 9 on 2 replicas: 5 and 4 examples; a last
   batch of 1: 1 and 0) fails in MirroredStrategy's ``reduce("MEAN")``: "Inputs
   to operation AddN of type AddN must have the same size and shape. Input 0:
   [5,4] != input 1: [4,4]" (keras-team/keras#19246; the training step's own
   fix is :mod:`~tfstrategy.patches.keras_uneven_batches`). Fix: when, and only
   when, the replicas' parts differ in shape, the build takes the largest part
   (shapes only, as in 1); even batches keep Keras' reduce.

5. The same ``reduce("MEAN")`` of the first batch fails on any strategy of 2+ replicas when a leaf cannot be
   added: strings (a model that takes strings into a ``StringLookup``), booleans. MirroredStrategy sums the
   parts with ``AddN``: "Value for attr 'T' of string is not in the list of allowed values" (on one device
   there is nothing to reduce, so the same model trains; keras-team/keras#21172, a string input under
   MirroredStrategy). A ragged leaf (``keras.Input(shape=(None,), ragged=True)`` fed a ``tf.data`` of ragged
   rows) fails there too: "'RaggedTensor' object has no attribute 'device'" (no public report found; the
   matrix's ``inputs:ragged``). Fix: when, and only when, a leaf is not a dense number or complex tensor, the
   build takes the largest part as in 4 (a mean of strings has no meaning, and the build reads shapes and
   dtypes only).

Both replacements call the original Keras function unless the strategy is
MWMS in multi-worker mode (or, for the build, the first batch is uneven), so
every other strategy runs Keras' own code. The
probe runs the *original* functions against a stand-in for a multi-worker MWMS
(a real one needs a cluster), on NumPy values only (it neither starts the
runtime nor needs a cluster), and the patch installs only the parts whose bug is
still there. tf_keras has neither bug and is never patched.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import StrategyError
from tfstrategy.patches.mechanism import Patch, PatchStatus, ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

BUILD = _compat.trainer_build_peek_target()
REDUCE = "reduce_per_replica"


def _first_local_replica(strategy: Strategy, value: object) -> Any:
    if isinstance(value, tf().distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


@contextlib.contextmanager
def _reduce_to_first_replica(strategy: Any) -> Iterator[None]:
    """Within the block, ``strategy.reduce`` returns each leaf's first local replica (shapes only)."""
    tree = _compat.keras3_tree()

    def reduce(reduce_op: Any, value: Any, axis: Any = None) -> object:
        return tree.map_structure(lambda leaf: _first_local_replica(strategy, leaf), value)

    strategy.reduce = reduce  # an instance attribute shadows the method until deleted
    try:
        yield
    finally:
        del strategy.reduce


def _addable(part: Any) -> bool:
    """Whether ``AddN`` can sum this replica's part: a dense number or complex tensor (a string, a bool, a ragged or
    sparse tensor cannot)."""
    if isinstance(part, (tf().RaggedTensor, tf().SparseTensor)):
        return False
    dtype = getattr(part, "dtype", None)
    return dtype is None or bool(dtype.is_floating or dtype.is_integer or dtype.is_complex)


@contextlib.contextmanager
def _reduce_unless_uneven(strategy: Any) -> Iterator[None]:
    """Within the block, ``strategy.reduce`` of replicas' parts that differ in shape, or that cannot be added
    (strings, booleans, ragged or sparse tensors), returns the largest part."""
    tree = _compat.keras3_tree()
    reduce_evenly = strategy.reduce
    distributed = tf().distribute.DistributedValues

    def reduce(reduce_op: Any, value: Any, axis: Any = None) -> object:
        leaves = [leaf for leaf in tree.flatten(value) if isinstance(leaf, distributed)]
        parts = [strategy.experimental_local_results(leaf) for leaf in leaves]
        if all(len({tuple(part.shape) for part in leaf_parts}) == 1 and _addable(leaf_parts[0])
               for leaf_parts in parts):
            return reduce_evenly(reduce_op, value, axis=axis)
        largest = max(range(len(parts[0])), key=lambda index: int(parts[0][index].shape[0] or 0))
        return tree.map_structure(
            lambda leaf: strategy.experimental_local_results(leaf)[largest] if isinstance(leaf, distributed) else leaf,
            value)

    strategy.reduce = reduce
    try:
        yield
    finally:
        del strategy.reduce


def _require_multi_step_loop(model: Model, steps: int) -> None:
    """Bug 3: several steps per execution need the steps_per_execution patch's loop; install it or refuse."""
    # Imported here: the package imports this module (that patch is independent of this one: either may be used alone).
    from tfstrategy.patches import apply_patches, keras_steps_per_execution

    apply_patches(keras_steps_per_execution.PATCH.name)
    if keras_steps_per_execution.fix_needed(model):
        for which in ("train", "test"):
            if getattr(model, f"{which}_function", None) is not None and not keras_steps_per_execution.uses_fixed_loop(
                model, which
            ):
                setattr(model, f"{which}_function", None)  # built before the patch: Keras' own failing loop
        return
    if keras_steps_per_execution.PATCH.needed() is False:
        return  # this Keras has no such bug
    raise StrategyError(
        f"Received compile(steps_per_execution={steps}) with MultiWorkerMirroredStrategy; Keras "
        f"{_compat.keras_version(_compat.keras_for())} fails to run several steps per call across workers ('You must "
        "feed a value for placeholder tensor') and tfstrategy's keras_steps_per_execution fix could not be installed "
        f"({keras_steps_per_execution.PATCH.status().line()}). Compile with steps_per_execution=1, or report this with "
        "`tfstrategy env` output."
    )


def _fixed_symbolic_build(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def _maybe_symbolic_build(self: Any, *args: object, **kwargs: object) -> object:
        strategy = _compat.model_strategy(self)
        if strategy is None:
            return original(self, *args, **kwargs)
        if not _compat.in_multi_worker_mode(strategy):
            if strategy.num_replicas_in_sync < 2 or not PATCH.build_reduces_replicas:
                return original(self, *args, **kwargs)
            with _reduce_unless_uneven(strategy):
                return original(self, *args, **kwargs)
        PATCH.acted()
        steps = int(getattr(self, "steps_per_execution", 1) or 1)
        if steps > 1:
            _require_multi_step_loop(self, steps)
        with _reduce_to_first_replica(strategy):
            return original(self, *args, **kwargs)

    return _maybe_symbolic_build


def _reduce_across_workers(strategy: Strategy, op: str, values: object) -> Any:
    """The cross-replica ``op`` of every leaf, packed into one all-reduce when the leaves share a dtype.

    Keras reduces each log (the loss, every metric) separately: one collective
    each, per step. Across workers each collective costs a round trip (measured
    in benchmarks/README.md), so they are sent as one.
    """
    tree = _compat.keras3_tree()
    leaves = tree.flatten(values)
    dtypes = {getattr(leaf, "dtype", None) for leaf in leaves}
    distributed = tf().distribute.DistributedValues
    if len(leaves) < 2 or len(dtypes) != 1 or not all(isinstance(leaf, distributed) for leaf in leaves):
        return tree.map_structure(lambda value: strategy.reduce(op, value, axis=None), values)
    reduced = strategy.extended.batch_reduce_to(op, [(leaf, leaf) for leaf in leaves])
    return tree.pack_sequence_as(values, [strategy.experimental_local_results(value)[0] for value in reduced])


def _fixed_reduce_per_replica(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def reduce_per_replica(values: object, strategy: Strategy, reduction: str) -> object:
        # MWMS is never a TPUStrategy, so Keras' "auto" means "mean" here.
        if reduction in ("auto", "mean", "sum") and _compat.in_multi_worker_mode(strategy):
            PATCH.acted()
            return _reduce_across_workers(strategy, "SUM" if reduction == "sum" else "MEAN", values)
        return original(values, strategy, reduction)

    return reduce_per_replica


def stand_in_strategy(calls: list[tuple[Any, Any]]) -> Any:
    """Something Keras takes for a multi-worker MWMS, without a cluster; records ``reduce`` calls."""
    distribute = tf().distribute

    class _StandIn(distribute.MultiWorkerMirroredStrategy):  # type: ignore[name-defined]  # an untyped TensorFlow/Keras class
        def __init__(self) -> None:  # the real constructor would start a server and wait for peers
            self._stand_in_extended = _compat.multi_worker_extended_stand_in("/job:worker/replica:0/task:0/device:CPU:0")

        @property
        def extended(self) -> object:
            return self._stand_in_extended

        def reduce(self, reduce_op: object, value: object, axis: object = None) -> object:
            calls.append((value, axis))
            return value.values[0] if isinstance(value, distribute.DistributedValues) else value

        def experimental_local_results(self, value: object) -> tuple[object, ...]:
            return tuple(value.values) if isinstance(value, distribute.DistributedValues) else (value,)

        def scope(self) -> object:
            return contextlib.nullcontext()

    return _StandIn()


def epoch_iterator_forms(batch: object) -> list[object]:
    """One epoch of one batch, in each form Keras' TensorFlow trainer has iterated (newest first)."""
    return [[(0, 1, iter([batch]))], [(0, iter([batch]))]]


class MWMSPatch(Patch):
    """Keras 3 ``fit``/``evaluate`` under a multi-worker MultiWorkerMirroredStrategy."""

    name = "keras_mwms"
    change_text = "Keras 3's training step fixed for MultiWorkerMirroredStrategy (keras#20585)"
    upstream = "keras-team/keras#20585, keras-team/keras#20329"
    verified_up_to = "3.15.1"
    targets = (BUILD, REDUCE)

    #: Set by the probe: Keras' build reduces the replicas' parts of its first batch (bug 4).
    build_reduces_replicas = False

    def target_module(self) -> Any:
        # Keras 3 models only; a tf_keras model (TF_USE_LEGACY_KERAS=1) never runs this trainer.
        return _compat.keras3_tensorflow_trainer()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        import numpy as np

        calls: list[tuple[Any, Any]] = []
        strategy = stand_in_strategy(calls)

        def built(iterator: object = None, data_batch: object = None) -> None:
            calls.append((data_batch, "built"))

        batch = (
            _compat.per_replica((np.zeros((2, 3), "float32"),)),
            _compat.per_replica((np.zeros((2, 1), "float32"),)),
        )
        build = self.original(BUILD)
        for form in epoch_iterator_forms(batch):
            calls.clear()
            try:
                build(_compat.stand_in_build_model(strategy, built), iterator=form)
                break
            except ValueError as error:  # this release unpacks another form
                if "unpack" not in str(error):
                    raise
        else:
            raise RuntimeError("Keras' _maybe_symbolic_build accepted none of the known epoch iterator forms")
        # Bug 1: a whole nest handed to Strategy.reduce (MWMS cannot reduce nests).
        build_broken = any(axis != "built" and isinstance(value, (tuple, list, dict)) for value, axis in calls)
        # Bug 4: the replicas' parts of the batch reduced at all (which fails when they differ in shape).
        self.build_reduces_replicas = any(axis != "built" for value, axis in calls)

        calls.clear()
        self.original(REDUCE)({"loss": _compat.per_replica((np.float32(1.0),))}, strategy, "auto")
        # Bug 2: a scalar reduced along axis 0.
        reduce_broken = any(
            axis is not None and np.ndim(_first_local_replica(strategy, value)) == 0 for value, axis in calls
        )
        return ProbeResult({BUILD: build_broken or self.build_reduces_replicas, REDUCE: reduce_broken})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        if target == BUILD:
            return _fixed_symbolic_build(original)
        return _fixed_reduce_per_replica(original)


PATCH = MWMSPatch()


def apply_keras_mwms_fix() -> PatchStatus:
    """Install the parts of the fix the installed Keras still needs (idempotent).

    ``tfstrategy.select`` installs it when it builds a MultiWorkerMirroredStrategy
    (and ``tfstrategy launch`` in every worker); call it yourself before ``fit``
    if you create the strategy without tfstrategy. Other strategies keep running
    Keras' own code.
    """
    from tfstrategy.patches import apply_patches  # the package imports this module

    (status,) = apply_patches(PATCH.name)
    return status
