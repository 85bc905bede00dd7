"""``compile(jit_compile=True)`` on 2+ replicas of one host: XLA turned off, in one line, instead of a failing ``fit``.

The bug (keras-team/keras#21366, #19005, keras-team/tf-keras#194; TensorFlow 2.21, Keras 3.15.1):
``compile(jit_compile=True)`` under a MirroredStrategy of 2 devices makes the first ``fit`` step
fail, in float32 and ``mixed_float16`` alike: "Trying to access resource
sequential/dense/kernel/replica_1 located in device CPU:1 from device CPU:0 (Cf.
https://www.tensorflow.org/xla/known_issues#tfvariable_on_a_different_device)". With
``jit_compile="auto"`` (the default) Keras itself turns XLA off whenever a tf.distribute strategy
is active, without a word.

Root cause. Keras 3 wraps the function that calls ``strategy.run`` in
``tf.function(jit_compile=True)``, so XLA is asked to compile every replica's step into one
cluster on one device, which cannot touch the other devices' variables (an XLA limit TensorFlow
documents). tf_keras compiled each replica's step instead; a per-replica XLA step built the same
way fails the same way here (measured), so tfstrategy cannot give XLA back on this path.

The fix. Setting ``jit_compile=True`` (``compile`` sets it) on a model whose strategy has 2+
devices on this host sets ``False`` instead and says so in one warning line naming
``jit_compile``, the issue, and that Keras' default turns XLA off under a strategy too. ``fit``
then gives the one-device answer without XLA. A multi-worker strategy on CPU devices gets the same
(TensorFlow cannot compile a cross-worker collective with XLA on CPUs: the workers abort, measured
with the corpus' ``xla_jit_custom_loop.py``); there no probe can run (it needs a cluster), so up to
the verified release the line is given without one. A multi-worker job on GPUs keeps Keras' own.

The probe. One ``fit`` step of a one-layer model with Keras' own ``jit_compile=True`` under a
2-replica ``MirroredStrategy`` over two devices of this host: the bug raises. It runs TensorFlow
ops, so it waits until a model first asks for XLA on 2+ local devices. The upstream canary
``test_upstream_keras_still_fails_jit_compile_on_two_replicas`` fails once Keras' step runs.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat, _versions
from tfstrategy._tf import tf
from tfstrategy.patches.keras_uneven_batches import probe_devices
from tfstrategy.patches.mechanism import Patch, ProbeResult
from tfstrategy.selection.names import strategy_name
from tfstrategy.selection.strategies import mirrored_strategy

if TYPE_CHECKING:
    from tfstrategy._protocols import Model

TARGET = "Trainer.jit_compile"


class _Property(property):
    """A property that, unlike ``property`` itself, can carry the mechanism's marker attribute."""


def local_replicas(model: Model) -> int:
    strategy = _compat.model_strategy(model)
    return 0 if strategy is None else len(strategy.extended.worker_devices)


def turned_off(model: Model) -> bool:
    """Whether ``jit_compile=True`` on ``model`` would fail on its strategy (and is turned off)."""
    strategy = _compat.model_strategy(model)
    if strategy is None:
        return False
    if _compat.in_multi_worker_mode(strategy):
        on_cpus = all("CPU" in device.upper() for device in strategy.extended.worker_devices)
        return on_cpus and not _versions.newer_than(_compat.keras_version(_compat.keras_for()), PATCH.verified_up_to)
    return local_replicas(model) >= 2 and PATCH.needed() is True


class JitCompilePatch(Patch):
    """``jit_compile=True`` on 2+ local replicas becomes ``False``, with one line saying why."""

    name = "keras_jit_compile"
    change_text = 'jit_compile turned off on 2+ replicas (keras#21366)'
    upstream = "keras-team/keras#21366, keras-team/keras#19005, keras-team/tf-keras#194"
    verified_up_to = "3.15.1"
    targets = (TARGET,)
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_trainer_module()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        tf_ = tf()
        import keras
        import numpy as np

        strategy = mirrored_strategy(probe_devices())  # keys of its own: see mirrored_strategy
        with strategy.scope():
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=False)
        _compat.set_keras3_jit_compile(model, True)  # Keras' own setting, past this patch's setter
        try:
            model.fit(np.ones((4, 1), "float32"), np.ones((4, 1), "float32"), batch_size=4, epochs=1, verbose=0)
        except tf_.errors.InvalidArgumentError as error:
            if "device" not in str(error):
                raise
            return ProbeResult({TARGET: True})
        return ProbeResult({TARGET: False})

    def replacement(self, target: str, original: Any) -> Any:  # a property, not a function
        def set_jit_compile(model: Model, value: Any) -> None:
            if value is True and turned_off(model):
                PATCH.acted()
                strategy = _compat.model_strategy(model)
                where = (f"{strategy.num_replicas_in_sync} replicas across workers on CPUs"
                         if _compat.in_multi_worker_mode(strategy) else f"{local_replicas(model)} devices on this host")
                warnings.warn(
                    f"tfstrategy: jit_compile=True under {strategy_name(strategy)} with {where}: XLA turned off "
                    "(jit_compile=False); Keras 3 compiles the whole strategy.run with XLA, which cannot reach the other "
                    "devices' variables or compile a cross-worker collective on CPUs (keras-team/keras#21366, #19005), "
                    "and its default, jit_compile='auto', turns XLA off under any tf.distribute strategy too",
                    UserWarning, stacklevel=3)
                value = False
            original.fset(model, value)

        return _Property(original.fget, set_jit_compile, original.fdel, original.__doc__)


PATCH = JitCompilePatch()
