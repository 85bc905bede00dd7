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
takes the step it took in Keras 2, and non-finite gradients still skip it.

The refusal, only on evidence. ``apply`` is refused (a :class:`~tfstrategy.errors.TrainingError`
naming the fix, before the weights change) only when what it received shows the mistake: the
gradients are the very tensors a ``tf.GradientTape.gradient`` call returned (the patch notes each
call's target and result, per thread: each replica traces its step in a thread of its own), with
no ``output_gradients``, and the target is a loss in a traced function whose graph shows that the
loss scale took no part in it: no output of ``scale_loss`` and no read of this optimizer's
``dynamic_scale`` among the ops it was computed from. Gradients that came from anywhere else
(made by hand, as Keras' own tests pass ``grads * initial_scale``; transformed after the tape,
e.g. clipped) are applied as Keras applies them: nothing shows that they were not scaled. A loss
multiplied by a constant (``loss * 32768.0``) is refused: Keras divides by the current dynamic
scale, which a constant stops matching at the first overflow. When the tape ran eagerly there is
no graph to read, so the same case (and no ``scale_loss`` call since the last ``apply`` in
this thread) gives one ``RuntimeWarning`` instead of a refusal.

The probe. Python only: Keras' ``LossScaleOptimizer`` lacks ``get_scaled_loss`` and
``get_unscaled_gradients``. The upstream canary ``test_upstream_keras_still_lacks_the_keras2_calls``
fails once Keras has them again (then drop this patch, and check the silent port anew).
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.patches.mechanism import Patch, ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Optimizer

GET_SCALED = "LossScaleOptimizer.get_scaled_loss"
GET_UNSCALED = "LossScaleOptimizer.get_unscaled_gradients"
SCALE = "LossScaleOptimizer.scale_loss"
APPLY = "LossScaleOptimizer.apply"
TAPE = "GradientTape.gradient"

#: Per thread (a replica's step is traced in a thread of its own): the latest outputs of scale_loss since
#: the last apply, the gradients each optimizer's get_unscaled_gradients returned (with the scale), and
#: the latest GradientTape.gradient call (weak references: nothing here keeps a tensor alive).
_STEP = threading.local()
#: Marks the methods this patch adds, so a probe tells them from Keras' own.
_ADDED = "__tfstrategy_added__"
#: Ops read back from a loss before giving up (no evidence, no refusal): far above a real model's step.
_ANCESTRY_LIMIT = 200_000


@dataclass(frozen=True)
class _TapeCall:
    """One ``GradientTape.gradient`` call: weak references to its targets and to the gradients it returned."""

    targets: tuple[Any, ...]
    gradients: tuple[Any, ...]
    seeded: bool  # output_gradients given: the caller chose the gradient's scale


def _scaled_outputs() -> deque[Any]:
    if not hasattr(_STEP, "scaled"):
        _STEP.scaled = deque(maxlen=16)
    return _STEP.scaled  # type: ignore[no-any-return]


def _unscaled() -> dict[int, tuple[list[object], Any]]:
    if not hasattr(_STEP, "unscaled"):
        _STEP.unscaled = {}
    return _STEP.unscaled  # type: ignore[no-any-return]


def _current_scale(optimizer: Optimizer) -> object:
    return optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale


def target_namespace() -> ModuleType | None:
    """Keras 3's ``LossScaleOptimizer`` and TensorFlow's ``GradientTape`` as attributes of one module object."""
    module = _compat.keras3_loss_scale_module()
    if module is None:
        return None
    namespace = ModuleType("tfstrategy.patches.keras_loss_scale_api.targets")
    namespace.LossScaleOptimizer = module.LossScaleOptimizer  # type: ignore[attr-defined]
    namespace.GradientTape = tf().GradientTape  # type: ignore[attr-defined]
    return namespace


class LossScaleApiPatch(Patch):
    """Keras 2's ``get_scaled_loss``/``get_unscaled_gradients``, and no step from gradients of an unscaled loss."""

    name = "keras_loss_scale_api"
    change_text = "Keras 2's get_scaled_loss/get_unscaled_gradients restored on LossScaleOptimizer"
    upstream = "tensorflow/tensorflow#64124, keras-team/keras#20894, keras-team/keras#19479"
    verified_up_to = "3.15.1"
    targets = (GET_SCALED, GET_UNSCALED, SCALE, APPLY, TAPE)
    #: The targets Keras 3 lacks, which this patch adds (and removes again).
    restores = (GET_SCALED, GET_UNSCALED)

    def target_module(self) -> Any:
        return target_namespace()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        optimizer_class = module.LossScaleOptimizer
        keras_own = [getattr(optimizer_class, name, None) for name in ("get_scaled_loss", "get_unscaled_gradients")]
        missing = any(method is None or getattr(method, _ADDED, False) for method in keras_own)
        return ProbeResult({target: missing for target in self.targets})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        return {GET_SCALED: _get_scaled_loss, GET_UNSCALED: _get_unscaled_gradients,
                SCALE: _noting_scale_loss, APPLY: _checked_apply, TAPE: _noting_gradient}[target](original)


def _get_scaled_loss(original: Callable[..., object]) -> Callable[..., object]:
    def get_scaled_loss(optimizer: Optimizer, loss: object) -> object:
        """Keras 2's name for ``scale_loss`` (restored by tfstrategy)."""
        PATCH.acted()
        if callable(loss):
            return lambda: optimizer.scale_loss(loss())
        return optimizer.scale_loss(loss)

    setattr(get_scaled_loss, _ADDED, True)
    return get_scaled_loss


def _get_unscaled_gradients(original: Callable[..., object]) -> Callable[..., object]:
    def get_unscaled_gradients(optimizer: Optimizer, grads: Any) -> list[object]:
        """Keras 2's unscaling: ``grads`` divided by the loss scale (``apply`` then does not divide again)."""
        PATCH.acted()
        tf_ = tf()
        scale = _current_scale(optimizer)
        unscaled = [None if g is None else g / tf_.cast(scale, g.dtype) for g in grads]
        _unscaled()[id(optimizer)] = (unscaled, scale)
        return unscaled

    setattr(get_unscaled_gradients, _ADDED, True)
    return get_unscaled_gradients


def _weak(value: object) -> object:
    """A weak reference to ``value``; raises ``TypeError`` for a value that takes none."""
    return weakref.ref(value)


def _noting_scale_loss(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def scale_loss(optimizer: Optimizer, loss: object) -> object:
        scaled = original(optimizer, loss)
        try:
            _scaled_outputs().append(_weak(scaled))
        except TypeError:  # a Python number: no tape can take its gradient
            pass
        return scaled

    return scale_loss


def _noting_gradient(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def gradient(tape: object, target: object, sources: object, *args: object, **kwargs: object) -> object:
        result = original(tape, target, sources, *args, **kwargs)
        seeded = (args[0] if args else kwargs.get("output_gradients")) is not None
        try:
            nest = tf().nest
            _STEP.tape = _TapeCall(targets=tuple(_weak(t) for t in nest.flatten(target)),
                                   gradients=tuple(_weak(g) for g in nest.flatten(result) if g is not None),
                                   seeded=seeded)
        except TypeError:  # a target or gradient that takes no weak reference: no evidence from this call
            _STEP.tape = None
        return result

    return gradient


def _checked_apply(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def apply(optimizer: Optimizer, grads: Any, trainable_variables: Any = None) -> object:
        grads = list(grads)
        remembered = _unscaled().pop(id(optimizer), None)
        scaled_outputs = [output for output in (ref() for ref in _scaled_outputs()) if output is not None]
        _scaled_outputs().clear()
        taped, _STEP.tape = getattr(_STEP, "tape", None), None
        if remembered is not None:
            unscaled, scale = remembered
            ids = {id(g) for g in unscaled if g is not None}
            if all(id(g) in ids for g in grads if g is not None):
                tf_ = tf()
                grads = [None if g is None else g * tf_.cast(scale, g.dtype) for g in grads]
                return original(optimizer, grads, trainable_variables)
        evidence = _unscaled_loss(optimizer, grads, taped, scaled_outputs)
        if evidence == "graph":
            raise TrainingError(
                f"Received gradients for {type(optimizer).__name__}.apply_gradients of a loss that was not scaled "
                "(GradientTape.gradient took them of a loss that neither scale_loss nor the optimizer's dynamic_scale "
                f"went into); Keras 3 divides them by the loss scale ({optimizer.initial_scale:g} at the start), so "
                "each step would be that many times too small (keras-team/keras#19479). Scale the loss before taking "
                "its gradient: `loss = optimizer.scale_loss(loss)` (or Keras 2's `optimizer.get_scaled_loss(loss)`, "
                "then `optimizer.get_unscaled_gradients(grads)`).")
        if evidence == "eager":
            warnings.warn(
                f"{type(optimizer).__name__}.apply_gradients received the gradients GradientTape.gradient took of a "
                "loss that no scale_loss call went into; Keras 3 divides them by the loss scale "
                f"({optimizer.initial_scale:g} at the start), so unless the loss was multiplied by "
                "optimizer.dynamic_scale by hand, each step is that many times too small (keras-team/keras#19479). "
                "Scale the loss before taking its gradient: `loss = optimizer.scale_loss(loss)`.",
                RuntimeWarning, stacklevel=3)
        return original(optimizer, grads, trainable_variables)

    return apply


def _unscaled_loss(optimizer: Optimizer, grads: list[object], taped: _TapeCall | None, scaled_outputs: list[object]) -> str | None:
    """``"graph"``/``"eager"`` when ``grads`` are a tape's gradients of a loss the loss scale took no part in.

    ``None`` when nothing shows that: gradients not (all) from the latest tape call, an ``output_gradients``
    seed, a target that is (or, in a graph, was computed from) a ``scale_loss`` output or a read of the
    optimizer's ``dynamic_scale``, or an eager tape after a ``scale_loss`` call in this step.
    """
    if taped is None or taped.seeded:
        return None
    given = [g for g in grads if g is not None]
    taken = [ref() for ref in taped.gradients]
    targets = [ref() for ref in taped.targets]
    if not given or any(target is None for target in targets):
        return None
    if not all(any(g is t for t in taken) for g in given):
        return None
    if any(target is output for target in targets for output in scaled_outputs):
        return None
    tf_ = tf()
    symbolic = [tf_.is_symbolic_tensor(target) for target in targets]
    if all(symbolic):
        return None if _scale_in_ancestry(optimizer, targets, scaled_outputs) else "graph"
    if not any(symbolic) and not scaled_outputs:
        return "eager"
    return None


def _scale_in_ancestry(optimizer: Optimizer, targets: list[Any], scaled_outputs: list[Any]) -> bool:
    """Whether a ``scale_loss`` output or a read of ``optimizer``'s scale is among the ops ``targets`` came from.

    True too when the graph is too large to read to the end (no evidence either way).
    """
    graph = targets[0].graph
    marks = {output.name for output in scaled_outputs
             if tf().is_symbolic_tensor(output) and output.graph is graph}
    marks |= _scale_handles(optimizer, graph)
    if any(target.name in marks for target in targets):
        return True
    seen: set[str] = set()
    stack = [target.op for target in targets]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if len(seen) > _ANCESTRY_LIMIT:
            return True
        for tensor in op.inputs:
            if tensor.name in marks:
                return True
            stack.append(tensor.op)
    return False


def _scale_handles(optimizer: Optimizer, graph: object) -> set[str]:
    """Names, in ``graph``, of the placeholders that capture ``optimizer.dynamic_scale``'s resource handles."""
    variable = getattr(optimizer, "dynamic_scale", None)
    if variable is None:  # not built yet: its scale_loss multiplied by initial_scale, a constant
        return set()
    tf_variable = _compat.tf_variable(variable)
    components = getattr(tf_variable, "values", None) or (tf_variable,)  # a distributed variable's per-device ones
    known = {id(component.handle) for component in components}
    chain = []
    while graph is not None:
        captures, outer = _compat.graph_captures(graph)
        chain.append(captures)
        graph = outer
    names: set[str] = set()
    for captures in reversed(chain):  # outermost first: a nested function captures its outer one's placeholder
        names = set()
        for external, internal in captures:
            if id(external) in known:
                known.add(id(internal))
                names.add(internal.name)
    return names


PATCH = LossScaleApiPatch()
