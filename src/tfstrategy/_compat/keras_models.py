"""Keras model internals: the strategy a model was made under, its variables, metrics and build state."""

from __future__ import annotations

from typing import Any

from tfstrategy._compat.keras_flavour import is_tf_keras_object
from tfstrategy._compat.keras_optimizers import optimizer_built
from tfstrategy._tf import tf


def model_strategy(model: Any) -> Any:
    """The strategy a model was created under (``None`` if Keras recorded none)."""
    # Keras 3 keeps it in `_distribute_strategy`, tf_keras in `_distribution_strategy`.
    for name in ("_distribute_strategy", "_distribution_strategy"):
        strategy = getattr(model, name, None)
        if strategy is not None:
            return strategy
    return None


def tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (which wraps it in ``_value``); tf_keras' are already one."""
    return getattr(variable, "_value", variable)


def model_metric_variables(model: Any) -> list[Any]:
    """Variables of a model's built metrics (Keras 3 ``metrics_variables``; tf_keras has only ``metrics``)."""
    variables = getattr(model, "metrics_variables", None)
    if variables is not None:
        return list(variables)
    return [variable for metric in getattr(model, "metrics", ()) for variable in metric.variables]


def model_state_variables(model: Any) -> list[Any]:
    """Every variable a training step can change on the model: weights, and Keras 3's seed generator states.

    Keras 3's ``model.weights`` leaves out the seed generators (a ``Dropout``'s);
    ``model.variables`` has them. tf_keras keeps a layer's random state in the
    layer's generator, which is in neither list; its variables are the weights.
    """
    return list(model.variables)


def symbolic_build(model: Any, batch: Any) -> None:
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


def variable_path(variable: Any) -> str:
    """A variable's name for messages: Keras 3's ``path`` (``dense/kernel``), else the tf.Variable ``name``."""
    return str(getattr(variable, "path", None) or variable.name)


def compiled_metric_objects(model: Any) -> list[Any]:
    """Metric objects passed to ``compile`` that Keras has not built yet (before the first step).

    Keras 3 holds them in ``model._compile_metrics._user_metrics`` (and
    ``_user_weighted_metrics``) until the first step; tf_keras in
    ``model.compiled_metrics._user_metrics``.
    """
    found: list[Any] = []
    for holder_name in ("_compile_metrics", "compiled_metrics"):
        compiled = getattr(model, holder_name, None)
        if compiled is None or getattr(compiled, "built", getattr(compiled, "_built", True)):
            continue
        for structure in (getattr(compiled, "_user_metrics", None), getattr(compiled, "_user_weighted_metrics", None)):
            if structure is not None:
                found.extend(item for item in tf().nest.flatten(structure) if hasattr(item, "variables"))
    return found
