"""Make Keras ``fit``/``evaluate`` work with ``steps_per_execution > 1`` on 2+ replicas.

The bug (TensorFlow 2.21, Keras 3.15.1; Keras 3 releases since the multi-step
loop became a ``tf.while_loop``): ``compile(steps_per_execution=8)`` and
``fit`` under MirroredStrategy with 2 or more replicas fail with "You must feed
a value for placeholder tensor 'while/cond/Placeholder'". One replica works,
and is ~2.7x faster than ``steps_per_execution=1`` on a small model.

Root cause. Keras' TensorFlow trainer (``TensorFlowTrainer._make_function``)
wraps each step, ``strategy.run(train_step)``, in its own ``tf.function``
(``one_step_on_data``) and calls it from a ``tf.cond`` branch inside the
``tf.while_loop`` of the outer multi-step ``tf.function``. With 2+ replicas the
step all-reduces gradients with ``CollectiveReduceV2``, whose instance key is a
*deferred* capture (``FuncGraph.capture_call_time_value``): TensorFlow only picks
the key when the function is called, so workers that retrace at different times
still agree. When the collective is traced directly inside control flow,
TensorFlow walks up past the control-flow graphs and records the capture on the
enclosing function graph, which is fed at call time. But here the capture
belongs to the *nested* function; calling that function from the ``tf.cond``
branch re-records it as a deferred capture of the branch graph, and cond_v2
never feeds deferred captures of its branches. The placeholder dangles and the
first call fails. A one-replica strategy has no collective, so no deferred
capture, hence no failure. (Reproduced without Keras: a ``tf.function`` with a
``capture_call_time_value`` called inside a ``tf.cond`` in another
``tf.function`` fails the same way; called in a ``tf.while_loop`` it works.)

The fix. For exactly that configuration (Keras with this loop, TensorFlow
backend, not eager, ``steps_per_execution > 1``, a collective-based strategy
with 2+ replicas) Keras' ``TensorFlowTrainer._make_function`` returns a
multi-step function of ours in which
``strategy.run`` is traced *inline* (no nested ``tf.function``) and no
``tf.cond`` wraps the step: the while loop's condition already stops at the end
of the data. The collective's key is then captured by the outer function and
fed normally. Everything else (1 replica, ``steps_per_execution=1``, other
strategies, tf_keras) keeps Keras' own function. MultiWorkerMirroredStrategy
with 2+ workers fails the same way, for the same reason, and gets the same
loop (:mod:`~tfstrategy.patches.keras_mwms` installs this patch when such a
model compiles with ``steps_per_execution > 1``); tested on 2 real workers.

The probe. It runs Keras' own ``_make_function`` with ``steps_per_execution=2``
on a stand-in model whose step makes a deferred capture, exactly what a
collective's instance key is, on the default strategy: the bug reproduces
without replicas in a few milliseconds. It runs TensorFlow ops, so it waits
until a model first needs the fix (the runtime is up by then). The upstream
canary ``test_upstream_keras_still_fails_without_the_fix`` fails once Keras
fixes it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.patches.mechanism import Patch, ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

logger = logging.getLogger(__name__)

#: Set on the functions built by this fix, so tests and reports can tell them from Keras' own.
_MARKER = "_tfstrategy_steps_per_execution_fix"
#: Keras' builder of the step loop, which this patch replaces.
_MAKE_FUNCTION = _compat.trainer_make_function_target()


def _collective_strategy(strategy: Strategy) -> bool:
    distribute = tf().distribute
    return isinstance(strategy, (distribute.MirroredStrategy, distribute.MultiWorkerMirroredStrategy))


def fix_needed(model: Model) -> bool:
    """Whether ``model``'s next train/test function would hit the bug without the fix."""
    if getattr(model, "run_eagerly", False) or int(getattr(model, "steps_per_execution", 1) or 1) <= 1:
        return False
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or strategy.num_replicas_in_sync < 2 or not _collective_strategy(strategy):
        return False
    return PATCH.needed() is True


def _without_optionals(data: object) -> object:
    # Keras passes absent sample weights as empty tf.experimental.Optional; its
    # steps expect None there.
    optional = tf().experimental.Optional
    return tf().nest.map_structure(lambda item: None if isinstance(item, optional) else item, data)


def _multi_step_function(model: Model, step_function: Any) -> object:
    """``function(iterator) -> logs`` with Keras' calling convention, step traced inline."""
    trainer = _compat.keras3_tensorflow_trainer()
    if trainer is None:  # the patch is applied only where Keras 3 runs on TensorFlow
        raise RuntimeError("keras_steps_per_execution needs Keras 3's TensorFlow trainer")
    reduce_per_replica = trainer.reduce_per_replica
    tf_ = tf()
    strategy = model.distribute_strategy
    if model.jit_compile:
        logger.warning("tfstrategy: jit_compile is not applied to the multi-replica steps_per_execution loop.")

    def one_step(data: Any) -> object:
        # A plain Python function: strategy.run is traced into whichever graph
        # calls it, so no nested tf.function holds the collective's deferred key.
        outputs = strategy.run(step_function, args=(_without_optionals(data),))
        return reduce_per_replica(outputs, strategy, reduction="auto")

    one_step_function = tf_.function(one_step, reduce_retracing=True, autograph=False)
    # Across workers each reduction of the logs is a network round trip, and
    # only the last step's logs are returned: there, carry this worker's
    # (single replica's) logs through the loop and reduce them once, after it.
    reduce_once = _compat.in_multi_worker_mode(strategy) and len(strategy.extended.worker_devices) == 1

    def local_step(data: Any) -> object:
        outputs = strategy.run(step_function, args=(_without_optionals(data),))
        return tf_.nest.map_structure(lambda value: strategy.experimental_local_results(value)[0], outputs)

    def multi_step(iterator: Any, outputs_like: Any) -> object:
        steps = int(model.steps_per_execution)
        # Every step runs inside the loop, guarded by the loop condition, so an
        # exhausted iterator runs none. (Taking the first batch with get_next()
        # outside the loop would let the optimizer's iteration counter tick
        # once more at the end of data of unknown size, before get_next fails.)
        # The loop's outputs start as zeros shaped like the step's outputs.
        initial = tf_.nest.map_structure(lambda spec: tf_.zeros([d or 0 for d in spec.shape], spec.dtype), outputs_like)

        def more(done: Any, outputs: Any, next_data: Any) -> object:
            return tf_.logical_and(done < steps, next_data.has_value())

        def step(done: Any, outputs: Any, next_data: Any) -> object:
            outputs = (local_step if reduce_once else one_step)(next_data.get_value())
            # Fetch only when another step follows: a batch fetched at the end
            # of an execution would be lost to the next one.
            next_data = tf_.cond(done + 1 < steps, iterator.get_next_as_optional, lambda: next_data)
            return done + 1, outputs, next_data

        first = iterator.get_next_as_optional()
        loop_vars = (tf_.constant(0), initial, first)
        options = {}
        if any(not spec.shape.is_fully_defined() for spec in tf_.nest.flatten(outputs_like)):
            # Outputs of dynamic shape (custom steps) may change shape between iterations.
            shapes = tf_.nest.map_structure(lambda spec: spec.shape, outputs_like)
            options["shape_invariants"] = (tf_.TensorShape([]), shapes, _compat.optional_type_spec(first))
        done, outputs, _ = tf_.while_loop(more, step, loop_vars, **options)
        if reduce_once:
            outputs = reduce_per_replica(
                tf_.nest.map_structure(lambda value: _compat.per_replica((value,)), outputs), strategy, reduction="auto"
            )
        return done, outputs

    compiled: list[Any] = []

    def function(iterator: Any) -> object:
        if isinstance(iterator, (tf_.data.Iterator, tf_.distribute.DistributedIterator)):
            if not compiled:
                # The step's output structure, from a trace that never runs.
                traced = one_step_function.get_concrete_function(iterator.element_spec).structured_outputs
                like = tf_.nest.map_structure(lambda t: tf_.TensorSpec(t.shape, t.dtype), traced)
                compiled.append(tf_.function(lambda it: multi_step(it, like), reduce_retracing=True, autograph=False))
            done, outputs = compiled[0](iterator)
            if int(done) == 0:
                raise StopIteration  # Keras' signal that the epoch's data ran out
            return outputs
        # train_on_batch/test_on_batch pass a Python list of batches.
        outputs = None
        for _, data in zip(range(int(model.steps_per_execution)), iterator):
            outputs = one_step_function(data)
        return outputs

    setattr(function, _MARKER, True)
    return function


def stand_in_trainer(module: ModuleType, *, steps_per_execution: int) -> object:
    """The few attributes of a Keras model that ``TensorFlowTrainer._make_function`` reads, for the probes."""
    steps = steps_per_execution  # a class body cannot read an enclosing name it assigns

    class _StandIn:
        run_eagerly = False
        jit_compile = False
        unrolled_steps_per_execution = 1
        distribute_strategy = tf().distribute.get_strategy()
        steps_per_execution = steps

    _compat.copy_autoconvert_optionals(module, _StandIn)
    return _StandIn()


class StepsPerExecutionPatch(Patch):
    """Keras' multi-step loop with 2+ replicas: one ``while_loop`` with the step traced inline."""

    name = "keras_steps_per_execution"
    change_text = 'compile(steps_per_execution>1) made to work on 2+ replicas'
    upstream = "keras-team/keras: compile(steps_per_execution>1) fails on MirroredStrategy with 2+ replicas"
    verified_up_to = "3.15.1"
    targets = (_MAKE_FUNCTION,)
    probe_on_first_use = True

    def target_module(self) -> Any:
        # Keras 3 models only; a tf_keras model (TF_USE_LEGACY_KERAS=1) never runs this trainer.
        return _compat.keras3_tensorflow_trainer()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        tf_ = tf()
        original = self.original(_MAKE_FUNCTION)

        def step(data: object) -> object:
            # What a collective's instance key is: a value captured when the function is called.
            key = _compat.capture_call_time_value(lambda: tf_.constant(1.0), tf_.TensorSpec([], tf_.float32))
            return {"value": tf_.reduce_sum(data) + key}

        function = original(stand_in_trainer(module, steps_per_execution=2), step)
        data = iter(tf_.data.Dataset.from_tensor_slices(tf_.ones((4, 1))).batch(1))
        try:
            outputs = function(data)
        except tf_.errors.InvalidArgumentError as error:
            if "must feed a value for placeholder" not in str(error):
                raise
            return ProbeResult({_MAKE_FUNCTION: True})
        if float(outputs["value"]) != 2.0:
            raise RuntimeError(f"the stand-in step returned {outputs!r}, expected 2.0")
        return ProbeResult({_MAKE_FUNCTION: False})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def _make_function(model: Model, step_function: object) -> object:
            # Decided each time Keras (re)builds a function, so a later compile()
            # with other settings is honoured.
            if fix_needed(model):
                PATCH.acted()
                return _multi_step_function(model, step_function)
            return original(model, step_function)

        return _make_function


PATCH = StepsPerExecutionPatch()


def fix_steps_per_execution(model: Model) -> bool:
    """Let ``model.fit``/``evaluate`` run ``steps_per_execution > 1`` on 2+ replicas.

    Installs the process-wide patch (``tfstrategy.select`` already does) and
    makes the model rebuild its train/test functions. Safe on any model, before
    or after ``compile``: the replacement loop is used only when
    :func:`fix_needed` says so; otherwise Keras' own function runs. A tf_keras
    model needs no fix (its loop has no such bug).

    Returns:
        Whether the installed Keras has the bug (and the patch now covers the model).

    Example:
        >>> with strategy.scope():
        ...     model = build_model()
        ...     model.compile(optimizer="adam", loss="mse", steps_per_execution=32)
        >>> fix_steps_per_execution(model)
        True
    """
    if _compat.is_tf_keras_object(model) or PATCH.target_module() is None:
        return False
    from tfstrategy.patches import apply_patches  # the package imports this module

    apply_patches(PATCH.name)
    # Functions built before the patch would keep the nested tf.function.
    model.train_function = None
    model.test_function = None
    return PATCH.needed() is True


def uses_fixed_loop(model: Model, which: str = "train") -> bool:
    """Whether the model's built ``train`` (or ``test``) function is tfstrategy's loop."""
    return bool(getattr(getattr(model, f"{which}_function", None), _MARKER, False))
