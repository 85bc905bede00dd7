"""Make Keras ``fit`` count no optimizer step past the end of data of unknown size.

The bug (TensorFlow 2.21, Keras 3.15.1, ``steps_per_execution=1``): 10 examples
from ``tf.data.Dataset.from_generator``, batched by 4 with the remainder dropped,
``fit(epochs=2)``: 4 batches train and the weights are right, but the
optimizer's ``iterations`` ends at 4, 5 or 6 from run to run on 2 replicas (6
every time on one device), with Keras' "Your input ran out of data" warning.
Learning-rate schedules, ``BackupAndRestore`` steps and anything else keyed on
``iterations`` shift with it. Data of known size never hits it.

Root cause. For ``steps_per_execution=1``, Keras' ``TensorFlowTrainer._make_function``
builds ``multi_step_on_iterator(iterator)``, a ``tf.function`` that calls
``iterator.get_next()`` and the step inside one graph. Keras learns where data of
unknown size ends only by calling it once more, when ``get_next`` raises
``OutOfRangeError``. But the optimizer's ``iterations.assign_add(1)``
(``BaseOptimizer.apply``) takes no input from the batch, and automatic control
dependencies order only ops on the same resource, so TensorFlow may run the
increment before the failing ``get_next`` aborts the call: one phantom step
(always on one device, by the scheduling's luck on several). Keras' epoch
iterator then counts the failed call as a batch (``_num_batches = _steps_seen``),
so every later epoch makes one such call too: up to one phantom step per epoch.
TensorFlow's distributed iterator is not at fault: the batches it yields are the
data's, and ``make_train_step`` loops, which fetch the batch in Python before the
step, count exactly.

The fix. For that configuration (Keras 3, TensorFlow backend, not eager, no
``jit_compile``, ``steps_per_execution=1``), ``TensorFlowTrainer.make_train_function``
builds the train function with the loop of
:mod:`~tfstrategy.patches.keras_steps_per_execution` with one step: the batch is
fetched with ``get_next_as_optional`` and the step runs inside the loop only when
it has a value, so an exhausted iterator runs nothing. Every other configuration
keeps Keras' own function. Keras' warning and its progress bar one step past the
end (cosmetic) remain.

The probe. It runs Keras' own ``_make_function`` (what ``make_train_function``
calls) on a stand-in model whose step
enqueues into a ``tf.queue.FIFOQueue`` (a side effect that, like the optimizer's
increment, takes nothing from the batch) and calls it on an exhausted iterator:
the bug enqueues although no batch existed. It runs TensorFlow ops, so it waits
until a model first builds its train function, in a thread of its own (on one
device, whatever scope the model is in), and calls the exhausted stand-in up to
32 times: the bug is a race, which one call can miss. In a multi-worker job no
worker's probe decides up to the verified release (every worker builds the fix):
workers that built different functions would wait for each other's collectives
forever. The upstream canary ``test_upstream_keras_still_steps_past_the_end``
fails once Keras fixes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat, _versions
from tfstrategy._tf import tf
from tfstrategy.patches import keras_steps_per_execution as steps_per_execution
from tfstrategy.patches.keras_steps_per_execution import _multi_step_function
from tfstrategy.patches.mechanism import Patch, ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Model

_TARGET = "TensorFlowTrainer.make_train_function"
#: Keras' own builder of the step function, which the probe runs.
_BUILDER = _compat.trainer_make_function_target()
#: Calls of the exhausted stand-in, until one has a phantom side effect (the bug). The bug is a race
#: that a call may miss (with 3 calls, one worker missed it in 1 of 5 two-worker runs, built Keras'
#: function while its peer built the fix, and the job hung), so the probe keeps trying.
_PROBE_CALLS = 32


def fix_needed(model: Model) -> bool:
    """Whether ``model``'s next train/test function would count a step past the end of data without the fix."""
    if getattr(model, "run_eagerly", False) or getattr(model, "jit_compile", False) is True:
        return False
    if int(getattr(model, "steps_per_execution", 1) or 1) != 1:
        return False  # Keras' own multi-step loop (and tfstrategy's) guard the step with has_value()
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and _compat.in_multi_worker_mode(strategy) and not _versions.newer_than(
            _compat.keras_version(_compat.keras_for()), PATCH.verified_up_to):
        # Every worker must build the same function, and a probe of a race can miss it on one of them.
        # Up to the verified release the bug is known, so no worker's probe decides.
        return True
    return PATCH.needed() is True


class EndOfDataPatch(Patch):
    """``steps_per_execution=1``: the step runs only when the iterator had a batch."""

    name = "keras_end_of_data"
    change_text = "fit on data of unknown size stops its optimizer at the data's end"
    upstream = "keras-team/keras: fit on data of unknown size counts optimizer steps past the end of the data"
    verified_up_to = "3.15.1"
    targets = (_TARGET,)
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_tensorflow_trainer()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        tf_ = tf()
        # Keras' own _make_function, under keras_steps_per_execution's dispatcher if installed.
        original = steps_per_execution.PATCH.original(_BUILDER)
        with tf_.init_scope():
            queue = tf_.queue.FIFOQueue(_PROBE_CALLS + 1, tf_.int32, shapes=[])  # room for every call's phantom

            def step(data: object) -> object:
                queue.enqueue(tf_.constant(1))  # takes nothing from the batch, like iterations.assign_add(1)
                return {"value": tf_.reduce_sum(data)}

            function = original(steps_per_execution.stand_in_trainer(module, steps_per_execution=1), step)
            iterator = iter(tf_.data.Dataset.from_tensor_slices(tf_.ones((1, 1))).batch(1))
            first = function(iterator)
            if float(first["value"]) != 1.0 or int(queue.size()) != 1:
                raise RuntimeError(f"the stand-in step returned {first!r} with {int(queue.size())} enqueued, expected 1.0 and 1")
            for _ in range(_PROBE_CALLS):
                try:
                    function(iterator)
                except (StopIteration, tf_.errors.OutOfRangeError):
                    pass
                else:
                    raise RuntimeError("the stand-in step ran on an exhausted iterator without raising")
                if int(queue.size()) > 1:
                    break
            phantom = int(queue.size()) - 1
        return ProbeResult({_TARGET: phantom > 0})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def make_train_function(model: Model, force: bool = False) -> object:
            if model.train_function is not None and not force:
                return model.train_function
            if fix_needed(model):
                # Not reported as a change (PATCH.acted): on data of known size, the common case, the
                # guarded loop trains exactly as Keras' own, and which data comes is not known here.
                model.train_function = _multi_step_function(model, model.train_step)
                return None  # as Keras' own, which only sets train_function
            return original(model, force)

        return make_train_function


PATCH = EndOfDataPatch()
