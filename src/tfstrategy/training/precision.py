"""Mixed precision under a strategy: the policy, loss scaling in custom loops, float16 outputs.

Three things go wrong silently when a model computes in float16 on N replicas:

- **The Keras global policy is set too late**, after the model was built, or only
  in some workers. :func:`set_precision` sets it (``mixed_float16``,
  ``mixed_bfloat16`` or ``float32``) for every Keras the process uses;
  ``select(precision=...)``, ``TFSTRATEGY_PRECISION`` and the start-up hook of
  ``tfstrategy run``/``launch --precision`` call it before the script builds a model.
- **A custom loop without loss scaling**: float16 gradients underflow to zero.
  Keras 3's ``LossScaleOptimizer`` unscales the gradients inside ``apply``, so the
  step must scale the loss (``optimizer.scale_loss``) before taking the gradient;
  tf_keras' must scale with ``get_scaled_loss`` and unscale with
  ``get_unscaled_gradients`` itself. :func:`loss_scaling` names which one an
  optimizer needs; :func:`require_loss_scaling` refuses a float16 model with an
  optimizer that does not scale (measured: 2 CPU replicas, SGD 0.05, 3 epochs of a
  small regression end at loss 10.82 without scaling, 0.085 in float32).
- **A float16 output feeding the loss** (a float16 softmax as the last layer)
  rounds probabilities to 3 significant digits and underflows small ones to 0.
  :func:`float16_outputs` names those layers; the scope audit reports them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfstrategy.errors import PrecisionError, TrainingError
from tfstrategy.settings import ENV_PRECISION, PRECISION, did_you_mean, received, resolve_setting, setting_name

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Optimizer

__all__ = [
    "PRECISIONS",
    "parse_precision",
    "resolve_precision",
    "set_precision",
    "loss_scaling",
    "loss_scale_optimizer",
    "require_loss_scaling",
    "float16_outputs",
]

#: The policies tfstrategy sets, as Keras names them.
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
_HALF = ("float16", "bfloat16")


def parse_precision(value: object, *, name: str = "precision") -> str:
    """``float32``, ``mixed_float16`` or ``mixed_bfloat16`` (any case, ``-`` or ``_``).

    Raises:
        PrecisionError: anything else.
    """
    text = str(value).strip().lower().replace("-", "_") if isinstance(value, str) else None
    if text in PRECISIONS:
        return text
    raise PrecisionError(
        f"Received {received(name, value)}; expected one of {', '.join(PRECISIONS)}."
        f"{did_you_mean(text, PRECISIONS) if text else ''} mixed_float16 suits GPUs "
        "with tensor cores, mixed_bfloat16 TPUs and recent CPUs; float32 is Keras' default."
    )


def resolve_precision(argument: str | None = None, env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The precision by argument > ``TFSTRATEGY_PRECISION`` > none (leave Keras' policy alone), and its source.

    Raises:
        PrecisionError: a value is not a precision (named after the variable if it came from there).
        SettingsConflictError: code and environment both set it and differ.
    """
    setting = resolve_setting(
        "precision", argument, ENV_PRECISION, None, env, normalise=lambda v, n: parse_precision(v, name=n)
    )
    if setting.value is None:
        return None, setting.source
    return parse_precision(setting.value, name=setting_name("precision", setting, ENV_PRECISION)), setting.source


def precision_setting(precision: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The policy ``--precision`` asks for (``None`` without it), validated against ``TFSTRATEGY_PRECISION``.

    Raises:
        PrecisionError: not a precision.
        SettingsConflictError: the environment already asks for another one.
    """
    if precision is None:
        return None
    value, _ = resolve_precision(parse_precision(precision, name="--precision"), env)
    return value


def precision_environment(precision: str | None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{TFSTRATEGY_PRECISION: policy}`` for ``--precision`` (empty without it), as :func:`precision_setting`.

    Raises:
        PrecisionError: not a precision.
        SettingsConflictError: the environment already asks for another one.
    """
    return PRECISION.to_environ(precision_setting(precision, env))


def _kerases() -> list[Any]:
    """Every Keras this process uses: ``tf.keras``'s, and Keras 3 too if imported beside tf_keras."""
    from tfstrategy import _compat

    found = [_compat.keras_for()]
    other = sys.modules.get("keras")
    if other is not None and other not in found and hasattr(other, "mixed_precision"):
        found.append(other)
    return found


def set_precision(precision: str) -> str:
    """Set the Keras global dtype policy; layers built afterwards compute in it.

    Returns:
        What was done, for ``Selection.steps`` and the hook's steps.

    Raises:
        PrecisionError: ``precision`` is not one of :data:`PRECISIONS`.
    """
    policy = parse_precision(precision)
    names = []
    for keras in _kerases():
        keras.mixed_precision.set_global_policy(policy)
        names.append(keras.__name__)
    return f"Keras global policy {policy} ({', '.join(names)})"


def _compute_dtype(obj: object) -> str:
    policy = getattr(obj, "dtype_policy", None)
    dtype = getattr(policy, "compute_dtype", None) or getattr(obj, "compute_dtype", None) or "float32"
    return str(getattr(dtype, "name", dtype))


def computes_in(model: Model, dtype: str = "float16") -> bool:
    """Whether the model or any of its layers computes in ``dtype``."""
    layers = [model, *(getattr(model, "layers", None) or [])]
    return any(_compute_dtype(layer) == dtype for layer in layers)


def loss_scaling(optimizer: Optimizer) -> str | None:
    """How a custom loop scales the loss for ``optimizer``.

    Returns:
        ``"keras3"`` (``scale_loss`` before the gradient; ``apply`` unscales),
        ``"tf_keras"`` (``get_scaled_loss``, then ``get_unscaled_gradients``), or
        ``None`` when the optimizer does not scale the loss.
    """
    if hasattr(optimizer, "get_scaled_loss") and hasattr(optimizer, "get_unscaled_gradients"):
        return "tf_keras"
    if "LossScaleOptimizer" in {klass.__name__ for klass in type(optimizer).__mro__}:
        return "keras3"
    if getattr(optimizer, "loss_scale_factor", None) is not None and hasattr(optimizer, "scale_loss"):
        return "keras3"  # a Keras 3 optimizer with a fixed loss_scale_factor: apply divides by it
    return None


def loss_scale_optimizer(optimizer: Optimizer, *, initial_scale: float | None = None) -> object:
    """``optimizer`` wrapped in its Keras' ``LossScaleOptimizer`` (create it in the strategy's scope)."""
    from tfstrategy import _compat

    keras = _compat.keras_for(optimizer)
    wrapper = getattr(keras.optimizers, "LossScaleOptimizer", None) or keras.mixed_precision.LossScaleOptimizer
    return wrapper(optimizer) if initial_scale is None else wrapper(optimizer, initial_scale=initial_scale)


def global_policy() -> str:
    """The name of the Keras global dtype policy in effect (``float32`` unless set)."""
    from tfstrategy import _compat

    return str(_compat.keras_for().mixed_precision.global_policy().name)


def require_loss_scaling(model: Model, optimizer: Optimizer) -> str | None:
    """The optimizer's loss scaling, refusing none for a model that computes in float16.

    Raises:
        TrainingError: the model computes in float16 and the optimizer does not scale the loss.
    """
    scaling = loss_scaling(optimizer)
    if scaling is None and computes_in(model, "float16"):
        name = type(optimizer).__name__
        raise TrainingError(
            f"Received model {getattr(model, 'name', type(model).__name__)!r} computing in float16 (mixed_float16 "
            f"policy) and optimizer {name} without loss scaling; expected a LossScaleOptimizer, because float16 "
            f"gradients underflow to zero without it. Pass optimizer=keras.optimizers.LossScaleOptimizer({name}(...)) "
            "made in the strategy's scope (tf_keras: keras.mixed_precision.LossScaleOptimizer), or use "
            "precision='mixed_bfloat16', which needs no scaling."
        )
    return scaling


def _output_layers(model: Model) -> list[Any]:
    from tfstrategy import _compat

    layers = getattr(model, "layers", None) or []
    outputs = getattr(model, "outputs", None)
    if not outputs:
        return layers[-1:]
    named = []
    for tensor in outputs:
        layer = _compat.keras_tensor_layer(tensor)
        if layer is not None:
            named.append(layer)
    return named or layers[-1:]


def float16_outputs(model: Model) -> list[str]:
    """Layers whose outputs the loss receives in float16 or bfloat16, as ``name (Class, dtype[, activation])``."""
    found = []
    for layer in _output_layers(model):
        dtype = _compute_dtype(layer)
        if dtype not in _HALF:
            continue
        activation = getattr(getattr(layer, "activation", None), "__name__", None)
        extra = f", {activation}" if activation and activation != "linear" else ""
        found.append(f"{layer.name} ({type(layer).__name__}, {dtype}{extra})")
    return found


def float16_output_message(model: Model) -> str | None:
    """One line naming the model's half-precision output layers, or ``None``."""
    found = float16_outputs(model)
    if not found:
        return None
    return (
        f"model {getattr(model, 'name', '?')!r} hands the loss outputs in half precision: {', '.join(found)}; "
        "a float16 softmax or sigmoid rounds probabilities to 3 digits and small ones to 0. Give the last layer "
        "dtype='float32' (e.g. keras.layers.Activation('softmax', dtype='float32'))."
    )

