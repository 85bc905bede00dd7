"""Run Keras 3's ``compile()`` in the scope of the strategy the model was built in, as tf_keras did.

The bug (TensorFlow 2.21, Keras 3.15.1). TensorFlow's guide for migrating to MirroredStrategy
builds the model in ``strategy.scope()`` and calls ``model.compile(optimizer=Adam(), metrics=[...])``
after the block. tf_keras entered the model's strategy scope inside ``compile()`` and created its
optimizer's variables lazily, so that worked. Keras 3 creates the loss tracker and the metrics
wherever ``compile()`` runs, and an optimizer binds the strategy current when it is created
(``TFOptimizer.__init__``) and creates ``iterations`` there: ``fit`` then fails on MirroredStrategy
("Mixing different tf.distribute.Strategy objects: MirroredStrategy is not
_DefaultDistributionStrategy"), and under ``launch -n 2`` each worker reports its own shard's loss
while training stays in sync.

The fix. ``Trainer.compile`` of a model that recorded a strategy, called outside any strategy
scope, runs Keras' own ``compile`` inside that strategy's scope. An optimizer or a metric object
passed to it that was created outside that scope (its variables were not created in it:
``StrategyExtended.variable_created_in_scope``) is re-created from its config inside the scope,
which loses nothing while it has no state (an optimizer that already took steps is refused with
a :class:`~tfstrategy.errors.ScopeError`). One warning line says what was done.

The probe. It builds a one-layer model in a ``OneDeviceStrategy`` scope and calls Keras' own
``compile(optimizer="sgd")`` outside it: the bug binds the optimizer to the default strategy. It
creates variables, so it waits until a model first compiles outside its scope. The upstream canary
``test_upstream_keras_still_compiles_outside_the_models_scope`` fails once Keras enters the scope.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import ScopeError
from tfstrategy.patches.mechanism import Patch, ProbeResult
from tfstrategy.selection.names import strategy_name

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

TARGET = "Trainer.compile"


def _created_in(strategy: Strategy, obj: Any) -> bool:
    variables = obj.variables() if callable(obj.variables) else obj.variables
    return all(strategy.extended.variable_created_in_scope(_compat.tf_variable(v)) for v in variables)


def _in_scope(strategy: Strategy, value: Any, renewed: list[str]) -> Any:
    """``value``, or a copy made from its config in ``strategy``'s scope if it was created outside it."""
    if isinstance(value, str) or not hasattr(value, "variables") or not hasattr(value, "get_config"):
        return value
    if _created_in(strategy, value):
        return value
    if hasattr(value, "iterations") and _compat.optimizer_built(value):
        raise ScopeError(
            f"Received model.compile(optimizer={type(value).__name__}(...)) outside strategy.scope(), with an "
            "optimizer that was created outside the model's strategy scope and has already taken steps; its state "
            "cannot move into the scope. Create the optimizer and call compile() inside `with strategy.scope():`.")
    renewed.append(type(value).__name__)
    return type(value).from_config(value.get_config())


class CompileScopePatch(Patch):
    """``compile()`` outside any scope runs in the model's strategy scope."""

    name = "keras_compile_scope"
    change_text = "compile() run in the model's strategy scope"
    upstream = "TensorFlow's MirroredStrategy migration guide: compile() after the scope (tf_keras entered the model's)"
    verified_up_to = "3.15.1"
    targets = (TARGET,)
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_trainer_module()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        tf_ = tf()
        import keras

        strategy = tf_.distribute.OneDeviceStrategy("/cpu:0")
        with strategy.scope():
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        self.original(TARGET)(model, optimizer="sgd", loss="mse")
        return ProbeResult({TARGET: not _created_in(strategy, model.optimizer)})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def compile(model: Model, *args: object, **kwargs: object) -> object:
            strategy = _compat.model_strategy(model)
            if strategy is None or tf().distribute.has_strategy() or PATCH.needed() is not True:
                return original(model, *args, **kwargs)
            PATCH.acted()
            bound = signature.bind(model, *args, **kwargs)
            renewed: list[str] = []
            tree = _compat.keras3_tree()
            with strategy.scope():
                for name in ("optimizer", "metrics", "weighted_metrics"):
                    if name in bound.arguments and bound.arguments[name] is not None:
                        bound.arguments[name] = tree.map_structure(
                            lambda value: _in_scope(strategy, value, renewed), bound.arguments[name])
                result = original(*bound.args, **bound.kwargs)
            warnings.warn(
                f"tfstrategy: model.compile() ran outside strategy.scope(); compiled in the model's "
                f"{strategy_name(strategy)} scope, as tf_keras did"
                + (f"; re-created there from its config: {', '.join(renewed)}" if renewed else ""),
                UserWarning, stacklevel=2)
            return result

        return compile


PATCH = CompileScopePatch()
