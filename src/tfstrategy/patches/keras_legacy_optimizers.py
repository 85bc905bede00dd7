"""``tf.keras.optimizers.legacy.SGD``/``Adam`` under Keras 3: Keras 3's optimizer with the same hyper-parameters.

The bug (tensorflow/tensorflow#72686, whose script follows TensorFlow's distributed
custom-training tutorial; TensorFlow 2.21, Keras 3.15.1): Keras 3 keeps the names
``keras.optimizers.legacy.*`` (and ``tf.keras.optimizers.legacy.*``) only to raise
``ImportError: keras.optimizers.legacy is not supported in Keras 3`` when called, so every
script written for Keras 2 stops at its optimizer.

Why a translation is honest for these two. ``legacy.SGD`` and Keras 3's ``SGD`` take the same
step (``v = momentum * v - lr * g``; ``w += v``, or ``w += momentum * v - lr * g`` with
Nesterov), and so do ``legacy.Adam`` and Keras 3's ``Adam`` (the bias-corrected rate times
``m / (sqrt(v) + epsilon)``, AMSGrad alike); ``tests/patches/test_keras_legacy_optimizers.py``
checks both against TensorFlow's own kernels that the legacy optimizers ran
(``ResourceApplyKerasMomentum``, ``ResourceApplyAdam``). The legacy arguments map one to one
(``lr`` is ``learning_rate``; ``clipnorm``, ``clipvalue``, ``global_clipnorm`` and ``name`` are
the same), and the legacy time-based ``decay`` (``lr / (1 + decay * iterations)``) is exactly
``keras.optimizers.schedules.InverseTimeDecay(lr, decay_steps=1, decay_rate=decay)``. The other
legacy optimizers (``RMSprop``, ``Adagrad``: epsilon outside the square root in Keras 2, inside
in Keras 3; ``Ftrl``; the ``Optimizer`` base) keep Keras' own ``ImportError``: their step differs.

The fix. ``keras.optimizers.legacy.SGD``/``Adam`` (both the ``keras`` and the ``tf.keras`` names)
return Keras 3's ``SGD``/``Adam`` built from the same arguments, and say so in one warning line.

The probe. Python only: Keras' own ``keras.optimizers.legacy.SGD(0.1)`` raises ``ImportError``.
The upstream canary ``test_upstream_keras_still_refuses_legacy_optimizers`` fails once it does not.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tfstrategy import _compat
from tfstrategy.patches.mechanism import Patch, ProbeResult

#: Where Keras 3 keeps the legacy names (``_compat.keras3_legacy_optimizer_packages``): ``keras``'s,
#: ``tf.keras``'s copy, and ``tensorflow.keras``'s (the same file loaded as a module of its own).
PACKAGES = ("keras", "tf_keras_copy", "tensorflow_keras")
NAMES = ("SGD", "Adam")


def _translate(name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> tuple[dict[str, object], str]:
    """Keras 3 keyword arguments for a legacy optimizer's call, and what was changed, for the warning line."""
    import inspect

    import keras

    legacy_order = {"SGD": ("learning_rate", "momentum", "nesterov", "name"),
                    "Adam": ("learning_rate", "beta_1", "beta_2", "epsilon", "amsgrad", "name")}[name]
    if len(args) > len(legacy_order):
        raise TypeError(f"legacy.{name}() takes at most {len(legacy_order)} positional arguments ({len(args)} given)")
    arguments = dict(zip(legacy_order, args))
    for key, value in kwargs.items():
        if key in arguments:
            raise TypeError(f"legacy.{name}() got multiple values for argument {key!r}")
        arguments[key] = value
    notes = []
    if "lr" in arguments:
        arguments["learning_rate"] = arguments.pop("lr")
        notes.append("lr= as learning_rate=")
    decay = arguments.pop("decay", 0.0)
    if decay:
        rate = arguments.get("learning_rate", 0.01 if name == "SGD" else 0.001)
        arguments["learning_rate"] = keras.optimizers.schedules.InverseTimeDecay(rate, decay_steps=1, decay_rate=decay)
        notes.append(f"decay={decay} as InverseTimeDecay({rate}, decay_steps=1, decay_rate={decay})")
    accepted = inspect.signature(getattr(keras.optimizers, name)).parameters
    unknown = sorted(set(arguments) - set(accepted))
    if unknown:
        raise TypeError(f"legacy.{name}() got arguments Keras 3's {name} does not take: {', '.join(unknown)}")
    return arguments, "; ".join(notes)


def _keras3_optimizer(name: str, package: str) -> Any:
    public = "keras" if package == "keras" else "tf.keras"

    def legacy_optimizer(*args: object, **kwargs: object) -> object:
        import keras

        PATCH.acted()
        arguments, notes = _translate(name, args, kwargs)
        optimizer = getattr(keras.optimizers, name)(**arguments)
        shown = ", ".join(f"{key}={value!r}" for key, value in arguments.items()
                          if not isinstance(value, keras.optimizers.schedules.LearningRateSchedule))
        warnings.warn(
            f"tfstrategy: {public}.optimizers.legacy.{name} does not exist in Keras 3 (tensorflow/tensorflow#72686); "
            f"using keras.optimizers.{name}({shown}), which takes the same step" + (f" ({notes})" if notes else ""),
            UserWarning, stacklevel=2)
        return optimizer

    legacy_optimizer.__name__ = legacy_optimizer.__qualname__ = name
    return legacy_optimizer


class LegacyOptimizersPatch(Patch):
    """``keras.optimizers.legacy.SGD``/``Adam`` build Keras 3's ``SGD``/``Adam``."""

    name = "keras_legacy_optimizers"
    change_text = "tf.keras.optimizers.legacy optimizers given as Keras 3's"
    upstream = "tensorflow/tensorflow#72686: tf.keras.optimizers.legacy raises ImportError under Keras 3"
    verified_up_to = "3.15.1"
    targets = tuple(f"{package}.{name}" for package in PACKAGES for name in NAMES)
    #: Present only when a script loaded ``tensorflow.keras.optimizers.legacy`` as a module of its own first.
    optional = tuple(f"tensorflow_keras.{name}" for name in NAMES)

    def target_module(self) -> Any:
        return _compat.keras3_legacy_optimizer_packages()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        broken = {}
        for target in self.targets:
            if not self._has(module, target):
                broken[target] = False
                continue
            try:
                self.original(target)(0.1)
            except ImportError:
                broken[target] = True
            else:
                broken[target] = False
        return ProbeResult(broken)

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        package, _, name = target.rpartition(".")
        return functools.update_wrapper(_keras3_optimizer(name, package), original, assigned=("__module__",))


PATCH = LegacyOptimizersPatch()
