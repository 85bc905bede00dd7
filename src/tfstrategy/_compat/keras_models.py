"""Keras model internals: the strategy a model was made under, its variables, metrics and build state."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy._compat.keras_flavour import is_tf_keras_object
from tfstrategy._compat.keras_optimizers import optimizer_built
from tfstrategy._compat.registry import accessor
from tfstrategy._tf import tf

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy, Variable


@accessor("keras.src.trainers.trainer:Trainer._distribute_strategy | tf_keras.src.engine.training:Model._distribution_strategy")
def model_strategy(model: Model) -> Any:
    """The strategy a model was created under (``None`` if Keras recorded none)."""
    # Keras 3 keeps it in `_distribute_strategy`, tf_keras in `_distribution_strategy`.
    for name in ("_distribute_strategy", "_distribution_strategy"):
        strategy = getattr(model, name, None)
        if strategy is not None:
            return strategy
    return None


@accessor("keras.src.backend.tensorflow.core:Variable._value")
def tf_variable(variable: Variable) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (which wraps it in ``_value``); tf_keras' are already one."""
    return getattr(variable, "_value", variable)


def model_metric_variables(model: Model) -> list[object]:
    """Variables of a model's built metrics (Keras 3 ``metrics_variables``; tf_keras has only ``metrics``)."""
    variables = getattr(model, "metrics_variables", None)
    if variables is not None:
        return list(variables)
    return [variable for metric in getattr(model, "metrics", ()) for variable in metric.variables]


def model_state_variables(model: Model) -> list[object]:
    """Every variable a training step can change on the model: weights, and Keras 3's seed generator states.

    Keras 3's ``model.weights`` leaves out the seed generators (a ``Dropout``'s);
    ``model.variables`` has them. tf_keras keeps a layer's random state in the
    layer's generator, which is in neither list; its variables are the weights.
    """
    return list(model.variables)


@accessor("keras.src.trainers.trainer:Trainer._symbolic_build")
def symbolic_build(model: Model, batch: object) -> None:
    """Build a model's layers, compiled metrics and loss, and its optimizer's slots, from one batch.

    Keras 3's ``fit`` does it before its first step under a strategy (and at its
    first step's trace without one); tf_keras builds the optimizer at its first
    step. Built here, a snapshot taken next holds every variable training changes.
    """
    build = getattr(model, "_symbolic_build", None)
    if build is not None and not is_tf_keras_object(model):
        with model.distribute_strategy.scope():
            build(data_batch=batch)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer_built(optimizer) and callable(getattr(optimizer, "build", None)):
        with model.distribute_strategy.scope():
            optimizer.build(model.trainable_variables)


@accessor("keras.src.trainers.trainer:Trainer._compile_loss", "keras.src.trainers.trainer:Trainer._compile_metrics", "keras.src.layers.layer:Layer._flatten_layers")
def keras3_nothing_left_to_build(model: Any) -> bool:
    """Whether everything Keras 3's ``_symbolic_build`` needs a batch for is built: each layer, the compiled
    loss and metrics."""
    compiled = (getattr(model, "_compile_loss", None), getattr(model, "_compile_metrics", None))
    return (all(layer.built for layer in model._flatten_layers())
            and all(part is None or part.built for part in compiled))


def keras_variable_types() -> tuple[type, ...]:
    """Keras 3's own ``keras.Variable`` class, if ``tf.keras`` is Keras 3 (tf_keras uses ``tf.Variable``)."""
    variable = getattr(tf().keras, "Variable", None)
    return (variable,) if isinstance(variable, type) else ()


def variable_path(variable: Variable) -> str:
    """A variable's name for messages: Keras 3's ``path`` (``dense/kernel``), else the tf.Variable ``name``."""
    return str(getattr(variable, "path", None) or variable.name)


@accessor("keras.src.trainers.compile_utils:CompileMetrics._user_metrics | tf_keras.src.engine.compile_utils:MetricsContainer._user_metrics", "keras.src.trainers.compile_utils:CompileMetrics._user_weighted_metrics | tf_keras.src.engine.compile_utils:MetricsContainer._user_weighted_metrics")
def compiled_metric_objects(model: Model) -> list[Any]:
    """Metric objects passed to ``compile`` that Keras has not built yet (before the first step).

    Keras 3 holds them in ``model._compile_metrics._user_metrics`` (and
    ``_user_weighted_metrics``) until the first step; tf_keras in
    ``model.compiled_metrics._user_metrics``.
    """
    found: list[object] = []
    for holder_name in ("_compile_metrics", "compiled_metrics"):
        compiled = getattr(model, holder_name, None)
        if compiled is None or getattr(compiled, "built", getattr(compiled, "_built", True)):
            continue
        for structure in (getattr(compiled, "_user_metrics", None), getattr(compiled, "_user_weighted_metrics", None)):
            if structure is not None:
                found.extend(item for item in tf().nest.flatten(structure) if hasattr(item, "variables"))
    return found


@accessor("keras.src.ops.node:Node._keras_history | tf_keras.src.engine.node:Node._keras_history")
def keras_tensor_layer(tensor: object) -> object:
    """The layer that made a symbolic Keras tensor (a functional model's output), or ``None``.

    Read from ``tensor._keras_history``: its ``operation`` in Keras 3, its ``layer`` (or first item) in tf_keras.
    """
    history = getattr(tensor, "_keras_history", None)
    layer = getattr(history, "operation", None) or getattr(history, "layer", None)
    if layer is None and history is not None and len(history):
        layer = history[0]
    return layer


@accessor("keras.src.trainers.trainer:Trainer._distribute_strategy", "keras.src.trainers.trainer:Trainer._symbolic_build")
def stand_in_build_model(strategy: Strategy, symbolic_build: Callable[..., None]) -> object:
    """A stand-in for a Keras 3 model as ``TensorFlowTrainer._maybe_symbolic_build`` reads it, for probes.

    Its strategy (``_distribute_strategy``, ``distribute_strategy``) is ``strategy``; its
    ``_symbolic_build(iterator=None, data_batch=None)`` calls ``symbolic_build`` with the same arguments.
    """

    class _Model:
        _distribute_strategy = distribute_strategy = strategy

        def _symbolic_build(self, iterator: object = None, data_batch: object = None) -> None:
            symbolic_build(iterator=iterator, data_batch=data_batch)

    return _Model()
