"""Give Keras 3's ``LossScaleOptimizer`` the Keras 2 loss-scale calls, and refuse gradients of an unscaled loss.

The bugs (tensorflow/tensorflow#64124, keras-team/keras#20894, #19479; TensorFlow 2.21, Keras
3.15.1). TensorFlow's mixed-precision guide writes its custom loop with
``scaled_loss = optimizer.get_scaled_loss(loss)`` and
``grads = optimizer.get_unscaled_gradients(scaled_grads)``; Keras 3 removed both
(``AttributeError``). The port users make next (drop both calls, keep the
``LossScaleOptimizer``, apply the gradients of the unscaled loss) runs silently wrong: Keras 3's
``LossScaleOptimizer.apply`` divides every gradient by its loss scale, 32768 at the start, so each
step is 32768 times too small and the model barely moves.

Root cause. In Keras 2 the loop scaled and unscaled, and ``apply_gradients`` took the unscaled
gradients. Keras 3 moved the unscaling into ``apply``, which assumes the loss was scaled with
``scale_loss``; nothing checks that it was.

The fix. ``get_scaled_loss(loss)`` is ``scale_loss(loss)`` (a callable loss gives a callable, as in
Keras 2). ``get_unscaled_gradients(grads)`` divides by the scale, as in Keras 2, and remembers
the tensors it returned; when exactly those reach ``apply``, they are multiplied back by the same
scale (a power of two: exact) before Keras' ``apply`` unscales them once, so the guide's loop
takes the step it took in Keras 2, and non-finite gradients still skip it. ``apply`` with
gradients that came neither from ``get_unscaled_gradients`` nor after a ``scale_loss`` of this
optimizer in the same step (same thread: each replica traces its step in its own) is refused
with a :class:`~tfstrategy.errors.TrainingError` naming the fix, before the weights change.

The probe. Python only: Keras' ``LossScaleOptimizer`` lacks ``get_scaled_loss`` and
``get_unscaled_gradients``. The upstream canary ``test_upstream_keras_still_lacks_the_keras2_calls``
fails once Keras has them again (then drop this patch, and check the silent port anew).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.patches.mechanism import Patch, ProbeResult

GET_SCALED = "LossScaleOptimizer.get_scaled_loss"
GET_UNSCALED = "LossScaleOptimizer.get_unscaled_gradients"
SCALE = "LossScaleOptimizer.scale_loss"
APPLY = "LossScaleOptimizer.apply"

#: Per thread (a replica's step is traced in a thread of its own): the optimizers that scaled a loss
#: since their last apply, and the gradients each one's get_unscaled_gradients returned, with the scale.
_STEP = threading.local()
#: Marks the methods this patch adds, so a probe tells them from Keras' own.
_ADDED = "__tfstrategy_added__"


def _scaled() -> set[int]:
    if not hasattr(_STEP, "scaled"):
        _STEP.scaled = set()
    return _STEP.scaled  # type: ignore[no-any-return]


def _unscaled() -> dict[int, tuple[list[Any], Any]]:
    if not hasattr(_STEP, "unscaled"):
        _STEP.unscaled = {}
    return _STEP.unscaled  # type: ignore[no-any-return]


def _current_scale(optimizer: Any) -> Any:
    return optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale


class LossScaleApiPatch(Patch):
    """Keras 2's ``get_scaled_loss``/``get_unscaled_gradients``, and no step from gradients of an unscaled loss."""

    name = "keras_loss_scale_api"
    change_text = "Keras 2's get_scaled_loss/get_unscaled_gradients restored on LossScaleOptimizer"
    upstream = "tensorflow/tensorflow#64124, keras-team/keras#20894, keras-team/keras#19479"
    verified_up_to = "3.15.1"
    targets = (GET_SCALED, GET_UNSCALED, SCALE, APPLY)
    #: The targets Keras 3 lacks, which this patch adds (and removes again).
    restores = (GET_SCALED, GET_UNSCALED)

    def target_module(self) -> Any:
        return _compat.keras3_loss_scale_module()

    def run_probe(self, module: Any) -> ProbeResult:
        optimizer_class = module.LossScaleOptimizer
        keras_own = [getattr(optimizer_class, name, None) for name in ("get_scaled_loss", "get_unscaled_gradients")]
        missing = any(method is None or getattr(method, _ADDED, False) for method in keras_own)
        return ProbeResult({target: missing for target in self.targets})

    def replacement(self, target: str, original: Any) -> Any:
        return {GET_SCALED: _get_scaled_loss, GET_UNSCALED: _get_unscaled_gradients,
                SCALE: _noting_scale_loss, APPLY: _checked_apply}[target](original)


def _get_scaled_loss(original: Any) -> Any:
    def get_scaled_loss(optimizer: Any, loss: Any) -> Any:
        """Keras 2's name for ``scale_loss`` (restored by tfstrategy)."""
        PATCH.acted()
        if callable(loss):
            return lambda: optimizer.scale_loss(loss())
        return optimizer.scale_loss(loss)

    setattr(get_scaled_loss, _ADDED, True)
    return get_scaled_loss


def _get_unscaled_gradients(original: Any) -> Any:
    def get_unscaled_gradients(optimizer: Any, grads: Any) -> list[Any]:
        """Keras 2's unscaling: ``grads`` divided by the loss scale (``apply`` then does not divide again)."""
        PATCH.acted()
        tf_ = tf()
        scale = _current_scale(optimizer)
        unscaled = [None if g is None else g / tf_.cast(scale, g.dtype) for g in grads]
        _unscaled()[id(optimizer)] = (unscaled, scale)
        return unscaled

    setattr(get_unscaled_gradients, _ADDED, True)
    return get_unscaled_gradients


def _noting_scale_loss(original: Any) -> Any:
    @functools.wraps(original)
    def scale_loss(optimizer: Any, loss: Any) -> Any:
        _scaled().add(id(optimizer))
        return original(optimizer, loss)

    return scale_loss


def _checked_apply(original: Any) -> Any:
    @functools.wraps(original)
    def apply(optimizer: Any, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        remembered = _unscaled().pop(id(optimizer), None)
        scaled = id(optimizer) in _scaled()
        _scaled().discard(id(optimizer))
        if remembered is not None:
            unscaled, scale = remembered
            ids = {id(g) for g in unscaled if g is not None}
            if all(id(g) in ids for g in grads if g is not None):
                tf_ = tf()
                grads = [None if g is None else g * tf_.cast(scale, g.dtype) for g in grads]
                return original(optimizer, grads, trainable_variables)
        if not scaled:
            raise TrainingError(
                f"Received gradients for {type(optimizer).__name__}.apply_gradients of a loss that was not scaled; "
                f"Keras 3 divides them by the loss scale ({optimizer.initial_scale:g} at the start), so each step would "
                "be that many times too small (keras-team/keras#19479). Scale the loss before taking its gradient: "
                "`loss = optimizer.scale_loss(loss)` (or Keras 2's `optimizer.get_scaled_loss(loss)`, then "
                "`optimizer.get_unscaled_gradients(grads)`).")
        return original(optimizer, grads, trainable_variables)

    return apply


PATCH = LossScaleApiPatch()
