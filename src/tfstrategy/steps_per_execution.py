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
with 2+ replicas) the model gets a multi-step function of ours in which
``strategy.run`` is traced *inline* (no nested ``tf.function``) and no
``tf.cond`` wraps the step: the while loop's condition already stops at the end
of the data. The collective's key is then captured by the outer function and
fed normally. Everything else (1 replica, ``steps_per_execution=1``, other
strategies, other Keras versions) keeps Keras' own function. The upstream test
``test_upstream_keras_still_fails_without_the_fix`` fails once Keras fixes it;
then set :data:`KERAS_FIXED_IN`.
"""

from __future__ import annotations

import logging
import types
from typing import Any

from tfstrategy._tf import tf

logger = logging.getLogger(__name__)

#: First Keras release whose TensorFlow trainer runs the multi-step loop as
#: ``tf.while_loop`` + ``tf.cond`` around a nested ``tf.function``.
KERAS_FIRST_AFFECTED = (3, 7, 0)
#: First Keras release that works without this fix; ``None`` while none does
#: (3.15.1 is affected). The upstream test says when to set it.
KERAS_FIXED_IN: tuple[int, int, int] | None = None

_MARKER = "_tfstrategy_steps_per_execution_fix"


def _version(text: str) -> tuple[int, int, int]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit()) or "0"
        parts.append(int(digits))
    return tuple((parts + [0, 0, 0])[:3])  # type: ignore[return-value]


def keras_is_affected(version: str | None = None) -> bool:
    """Whether this Keras (or ``version``) has the bug, judged by version and backend."""
    keras = tf().keras
    if version is None:
        if keras.backend.backend() != "tensorflow":
            return False
        version = keras.version()
    release = _version(version)
    if release < KERAS_FIRST_AFFECTED:
        return False
    return KERAS_FIXED_IN is None or release < KERAS_FIXED_IN


def _collective_strategy(strategy: Any) -> bool:
    distribute = tf().distribute
    return isinstance(strategy, (distribute.MirroredStrategy, distribute.MultiWorkerMirroredStrategy))


def fix_needed(model: Any) -> bool:
    """Whether ``model``'s next train/test function would hit the bug without the fix."""
    if getattr(model, "run_eagerly", False) or int(getattr(model, "steps_per_execution", 1) or 1) <= 1:
        return False
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None or strategy.num_replicas_in_sync < 2 or not _collective_strategy(strategy):
        return False
    return keras_is_affected()


def _without_optionals(data: Any) -> Any:
    # Keras passes absent sample weights as empty tf.experimental.Optional; its
    # steps expect None there.
    optional = tf().experimental.Optional
    return tf().nest.map_structure(lambda item: None if isinstance(item, optional) else item, data)


def _multi_step_function(model: Any, step_function: Any) -> Any:
    """``function(iterator) -> logs`` with Keras' calling convention, step traced inline."""
    from keras.src.backend.tensorflow.trainer import reduce_per_replica

    tf_ = tf()
    strategy = model.distribute_strategy
    if model.jit_compile:
        logger.warning("tfstrategy: jit_compile is not applied to the multi-replica steps_per_execution loop.")

    def one_step(data: Any) -> Any:
        # A plain Python function: strategy.run is traced into whichever graph
        # calls it, so no nested tf.function holds the collective's deferred key.
        outputs = strategy.run(step_function, args=(_without_optionals(data),))
        return reduce_per_replica(outputs, strategy, reduction="auto")

    one_step_function = tf_.function(one_step, reduce_retracing=True, autograph=False)

    def multi_step(iterator: Any, outputs_like: Any) -> Any:
        steps = int(model.steps_per_execution)
        # Every step runs inside the loop, guarded by the loop condition, so an
        # exhausted iterator runs none. (Taking the first batch with get_next()
        # outside the loop would let the optimizer's iteration counter tick
        # once more at the end of data of unknown size, before get_next fails.)
        # The loop's outputs start as zeros shaped like the step's outputs.
        initial = tf_.nest.map_structure(lambda spec: tf_.zeros([d or 0 for d in spec.shape], spec.dtype), outputs_like)

        def more(done: Any, outputs: Any, next_data: Any) -> Any:
            return tf_.logical_and(done < steps, next_data.has_value())

        def step(done: Any, outputs: Any, next_data: Any) -> Any:
            outputs = one_step(next_data.get_value())
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
            options["shape_invariants"] = (tf_.TensorShape([]), shapes, first._type_spec)
        done, outputs, _ = tf_.while_loop(more, step, loop_vars, **options)
        return done, outputs

    compiled: list[Any] = []

    def function(iterator: Any) -> Any:
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


def _make_function(self: Any, step_function: Any) -> Any:
    # Decided each time Keras (re)builds a function, so a later compile() with
    # other settings is honoured.
    if fix_needed(self):
        return _multi_step_function(self, step_function)
    return type(self)._make_function(self, step_function)


def fix_steps_per_execution(model: Any) -> bool:
    """Let ``model.fit``/``evaluate`` run ``steps_per_execution > 1`` on 2+ replicas.

    Safe to call on any model, before or after ``compile``: the replacement
    loop is used only when :func:`fix_needed` says so; otherwise Keras' own
    function runs. Idempotent.

    Returns:
        Whether this Keras is affected (and the model now carries the fix).

    Example:
        >>> with strategy.scope():
        ...     model = build_model()
        ...     model.compile(optimizer="adam", loss="mse", steps_per_execution=32)
        >>> tfstrategy.fix_steps_per_execution(model)
        True
    """
    if not keras_is_affected() or not hasattr(type(model), "_make_function"):
        return False
    if "_make_function" not in vars(model):
        # object.__setattr__ skips Keras' attribute tracking of layers and variables.
        object.__setattr__(model, "_make_function", types.MethodType(_make_function, model))
    # Functions built before the fix would keep the nested tf.function.
    model.train_function = None
    model.test_function = None
    return True


def uses_fixed_loop(model: Any, which: str = "train") -> bool:
    """Whether the model's built ``train`` (or ``test``) function is tfstrategy's loop."""
    return bool(getattr(getattr(model, f"{which}_function", None), _MARKER, False))
