"""Keras optimizer internals: their strategy, variables, build state, and Keras 3's LossScaleOptimizer."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy._compat.keras_trainer import keras3_tensorflow_trainer
from tfstrategy._compat.registry import accessor

if TYPE_CHECKING:
    from tfstrategy._protocols import Optimizer


@accessor("keras.src.backend.tensorflow.optimizer:TFOptimizer._distribution_strategy | tf_keras.src.optimizers.optimizer:Optimizer._distribution_strategy")
def optimizer_strategy(optimizer: Optimizer, default: object = None) -> Any:
    """The strategy an optimizer was created under (Keras 3 and tf_keras both call it ``_distribution_strategy``)."""
    return getattr(optimizer, "_distribution_strategy", default)


def optimizer_variables(optimizer: Optimizer) -> list[object]:
    """An optimizer's variables (a list in Keras 3 and tf_keras; a method on tf_keras' legacy optimizers)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) and not isinstance(variables, list) else variables)


@accessor("keras.src.optimizers.base_optimizer:BaseOptimizer.built | tf_keras.src.optimizers.optimizer:_BaseOptimizer._built")
def optimizer_built(optimizer: Optimizer) -> bool:
    """Whether an optimizer has its slot variables (Keras 3 ``built``; tf_keras sets ``_built`` in ``build``)."""
    if hasattr(optimizer, "built"):
        return bool(optimizer.built)
    return bool(getattr(optimizer, "_built", False))


@accessor("keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer")
def keras3_loss_scale_module() -> ModuleType | None:
    """``keras.src.optimizers.loss_scale_optimizer`` when Keras 3 runs on TensorFlow; else ``None``."""
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        from keras.src.optimizers import loss_scale_optimizer
    except ImportError:
        return None
    return loss_scale_optimizer if hasattr(loss_scale_optimizer, "LossScaleOptimizer") else None


@accessor("keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer._tf_apply._handle_cross_replica")
def loss_scale_cross_replica_handler(apply: Any, optimizer: object) -> object:
    """The ``_handle_cross_replica`` closure inside ``LossScaleOptimizer._tf_apply``, bound to ``optimizer``.

    Keras decides "apply or skip this step" there; the probe calls it with a
    stand-in distribution. Raises ``LookupError`` if the release has no such closure.
    """
    import types

    for const in apply.__code__.co_consts:
        if isinstance(const, types.CodeType) and const.co_name == "_handle_cross_replica":
            if const.co_freevars != ("self",):
                break
            return types.FunctionType(const, apply.__globals__, "_handle_cross_replica", None,
                                      (types.CellType(optimizer),))
    raise LookupError("LossScaleOptimizer._tf_apply has no _handle_cross_replica(self) closure")


_LSO = "keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer"


@accessor(f"{_LSO}._tf_apply._handle_cross_replica", f"{_LSO}._stateful_handle_finite_grads",
          f"{_LSO}._stateful_handle_non_finite_grads")
def loss_scale_step_handler(module: ModuleType, check_finite: Callable[[Any, Any], Any],
                            applied: Callable[[], None], skipped: Callable[[], None]) -> Any:
    """Keras 3's "apply or skip this step" of ``LossScaleOptimizer._tf_apply``, on a stand-in optimizer.

    ``check_finite(optimizer, grads)`` answers for the stand-in; ``applied()`` or ``skipped()`` is called
    where Keras would apply the gradients (``_stateful_handle_finite_grads``) or skip the step
    (``_stateful_handle_non_finite_grads``). Call the result with ``(distribution, grads, variables)``.
    Raises ``LookupError`` if the release has no such handler.
    """

    class _StandInOptimizer:
        def check_finite(self, grads: object) -> object:
            return check_finite(self, grads)

        def _stateful_handle_finite_grads(self, grads: object, variables: object) -> None:
            applied()

        def _stateful_handle_non_finite_grads(self) -> None:
            skipped()

    return loss_scale_cross_replica_handler(module.LossScaleOptimizer._tf_apply, _StandInOptimizer())


@accessor("keras.src.backend.tensorflow.optimizer:TFOptimizer.add_variable")
def keras3_tf_optimizer_module() -> ModuleType | None:
    """``keras.src.backend.tensorflow.optimizer`` (``TFOptimizer``) when Keras 3 runs on TensorFlow; else ``None``."""
    if keras3_tensorflow_trainer() is None:
        return None
    try:
        from keras.src.backend.tensorflow import optimizer
    except ImportError:
        return None
    return optimizer if hasattr(optimizer, "TFOptimizer") else None


@accessor("keras.optimizers.legacy:SGD", "keras.optimizers.legacy:Adam", "keras._tf_keras.keras.optimizers.legacy:SGD?", "keras._tf_keras.keras.optimizers.legacy:Adam?")
def keras3_legacy_optimizer_packages() -> object:
    """Every module object Keras 3 keeps its ``optimizers.legacy`` names in, as attributes of one namespace.

    ``keras.optimizers.legacy`` and ``tf.keras``'s copy (``keras._tf_keras.keras.optimizers.legacy``).
    ``from tensorflow.keras.optimizers.legacy import SGD`` would load that copy's file again as a
    module of its own; ``sys.modules`` gets ``tensorflow.keras.optimizers.legacy`` as the copy
    itself, so that import finds it (importing it here instead would replace ``tf.keras`` in the
    ``tensorflow`` module). A module of that name already loaded is included as it is. Keras 3
    keeps the names only to raise ``ImportError``. ``None`` when ``tf.keras`` is tf_keras (whose
    legacy optimizers are real) or Keras 3 is not on TensorFlow.
    """
    import types

    from tfstrategy._compat.keras_flavour import keras_package

    if keras3_tensorflow_trainer() is None or keras_package() != "keras":
        return None
    found: dict[str, ModuleType] = {}
    for attribute, name in (("keras", "keras.optimizers.legacy"), ("tf_keras_copy", "keras._tf_keras.keras.optimizers.legacy")):
        try:
            found[attribute] = importlib.import_module(name)
        except ImportError:  # this Keras lacks that copy
            continue
    alias = "tensorflow.keras.optimizers.legacy"
    if "tf_keras_copy" in found:
        sys.modules.setdefault(alias, found["tf_keras_copy"])
    loaded = sys.modules.get(alias)
    if loaded is not None and all(loaded is not module for module in found.values()):
        found["tensorflow_keras"] = loaded
    return types.SimpleNamespace(**found) if found else None


_BASE = "keras.src.optimizers.base_optimizer:BaseOptimizer"


@accessor(f"{_BASE}._accumulated_gradients", f"{_BASE}._get_variable_index")
def gradient_accumulators(optimizer: Any, variables: list[Any]) -> list[Any]:
    """A Keras 3 optimizer's gradient accumulator of each of ``variables`` (``gradient_accumulation_steps``)."""
    return [optimizer._accumulated_gradients[optimizer._get_variable_index(v)] for v in variables]


@accessor(f"{_BASE}._iterations")
def optimizer_calls(optimizer: Any) -> Any:
    """How many times a Keras 3 optimizer applied gradients (``iterations`` counts accumulated steps once)."""
    return optimizer._iterations


@accessor(f"{_BASE}._clip_gradients", f"{_BASE}._apply_weight_decay", f"{_BASE}._backend_update_step")
def apply_step(optimizer: Any, grads: list[object], variables: list[object]) -> None:
    """Keras 3's step of an optimizer for ``grads``: clipping, weight decay, then the update (all-reduced on replicas)."""
    grads = optimizer._clip_gradients(grads)
    optimizer._apply_weight_decay(variables)
    optimizer._backend_update_step(grads, variables, optimizer.learning_rate)


@accessor(f"{_BASE}._backend_reset_gradient_accumulators")
def reset_gradient_accumulators(optimizer: Any) -> None:
    """Zero a Keras 3 optimizer's gradient accumulators (in a cross-replica context: every replica's copy)."""
    optimizer._backend_reset_gradient_accumulators()


@accessor("keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients")
def sums_gradients_across_replicas(optimizer: Optimizer) -> bool:
    """Whether a Keras 3 optimizer is TensorFlow's, whose update step sums the replicas' gradients."""
    return hasattr(optimizer, "_all_reduce_sum_gradients")
