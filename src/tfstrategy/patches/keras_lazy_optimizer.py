"""Create a Keras 3 optimizer's variables outside the step being traced (a backport of keras-team/keras#23087).

The bug (keras-team/keras#23085, #20164; tensorflow/tensorflow#72686; TensorFlow 2.21, Keras
3.15.1): TensorFlow's custom-training tutorial makes the model and ``Adam`` in
``strategy.scope()`` and lets the optimizer build its slots lazily, at the first
``apply_gradients`` inside ``strategy.run`` inside a ``tf.function``. On 2+ replicas of one
host the first call fails: "You must feed a value for placeholder tensor
'cond/else/_1/cond/Placeholder' with dtype int32". One replica, and a multi-worker job with one
device per worker, run.

Root cause. ``TFOptimizer.add_variable`` creates each slot variable where it is called: inside
the step's function graph, in a replica context. A mirrored variable's initial value is then
broadcast from the first replica by a collective whose keys are deferred captures of that graph,
and Keras' first ``apply_gradients`` runs inside a ``tf.cond`` that never feeds them. Keras
fixed it after 3.15 by creating optimizer variables under ``tf.init_scope()`` (eagerly, before
the graph runs), which tf_keras always did.

The fix. ``TFOptimizer.add_variable`` runs Keras' own function under ``tf.init_scope()`` when
called while a function is being traced; eagerly it is Keras' own, unchanged.

The probe. It traces a ``tf.function`` that calls Keras' own ``add_variable`` of a fresh
``SGD`` with an initializer that records whether it runs eagerly: the bug runs it inside the
graph. It traces a function, so it waits until an optimizer first creates a variable while a
function is traced. The upstream canary ``test_upstream_keras_still_builds_optimizers_in_the_step``
fails once Keras lifts the creation itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.patches.mechanism import Patch, ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Optimizer

TARGET = "TFOptimizer.add_variable"


class LazyOptimizerPatch(Patch):
    """``TFOptimizer.add_variable`` creates its variable under ``tf.init_scope()``."""

    name = "keras_lazy_optimizer"
    change_text = 'optimizer variables created outside the traced step (keras#23085)'
    upstream = "keras-team/keras#23085 (fixed by keras-team/keras#23087 after 3.15), keras-team/keras#20164"
    verified_up_to = "3.15.1"
    targets = (TARGET,)
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_tf_optimizer_module()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        tf_ = tf()
        import keras

        add_variable = self.original(TARGET)
        optimizer = keras.optimizers.SGD(0.1)
        eager: list[bool] = []

        def initializer(shape: object, dtype: object = None) -> object:
            eager.append(tf_.executing_eagerly())
            return tf_.zeros(shape, dtype)

        def create() -> object:
            return add_variable(optimizer, (1,), initializer=initializer, name="tfstrategy_probe").value + 1.0

        try:
            tf_.function(create).get_concrete_function()
        except ValueError:  # tf.function refuses a variable made in a trace; the initializer ran already
            pass
        if not eager:
            raise RuntimeError("Keras' add_variable never called the probe's initializer")
        return ProbeResult({TARGET: not eager[0]})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def add_variable(optimizer: Optimizer, *args: object, **kwargs: object) -> object:
            tf_ = tf()
            if not tf_.inside_function() or PATCH.needed() is not True:
                return original(optimizer, *args, **kwargs)
            PATCH.acted()
            with tf_.init_scope():
                return original(optimizer, *args, **kwargs)

        return add_variable


PATCH = LazyOptimizerPatch()
