"""Make Keras 3's ``LossScaleOptimizer`` skip a step when *any* replica's gradients overflow.

The bug (TensorFlow 2.21, Keras 3.15.1; every Keras 3 release with this
``_tf_apply``): under ``mixed_float16`` on MirroredStrategy with 2+ replicas, one
overflowing step turns every weight into ``inf``/``NaN``, in ``fit`` and in
custom loops alike. Measured with the equivalence model (8 steps, SGD 0.05,
global batch 32, 2 CPU replicas): the largest weight difference to 1 replica is
``inf``; with the fix 7.5e-5. One replica is fine.

Root cause. ``LossScaleOptimizer._tf_apply`` runs, in a ``merge_call``,
``check_finite`` on each replica's gradients and keeps replica 0's answer, on the
belief (its comment) that "grads is all-reduced across replicas". In Keras 3 it
is not: the gradients reach ``apply`` per replica and are summed later, inside
the inner optimizer. When replica 1's gradients overflow and replica 0's do
not, the step is applied and the all-reduce sums ``inf`` into every weight;
dynamic loss scaling never gets to halve the scale.

The fix. ``LossScaleOptimizer.check_finite`` all-reduces its answer over the
replicas in sync (a sum of "this replica overflowed" flags, one scalar), so
every replica, replica 0 included, reports whether any overflowed. On one
replica, or outside a replica context, it is Keras' own function.

The probe. It calls Keras' own cross-replica handler from ``_tf_apply`` with a
stand-in two-replica distribution (plain Python, eager ops, no devices) whose
replica 0 has finite gradients and replica 1 an ``inf``: the bug applies the
step. It runs eager ops, so it waits until a multi-replica step first checks
its gradients. The upstream canary ``test_upstream_keras_applies_overflowing_steps``
fails once Keras fixes it.
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

_TARGET = "LossScaleOptimizer.check_finite"


class _Values:
    def __init__(self, values: list[object]) -> None:
        self.values = values


class _StandInExtended:
    def call_for_each_replica(self, fn: Any, args: tuple[object, ...] = (), kwargs: Any = None) -> _Values:
        count = max(len(arg.values) for arg in args if isinstance(arg, _Values))
        return _Values([fn(*[arg.values[i] if isinstance(arg, _Values) else arg for arg in args]) for i in range(count)])


class _StandInDistribution:
    extended = _StandInExtended()

    def experimental_local_results(self, value: Any) -> list[object]:
        return list(value.values)


class LossScalePatch(Patch):
    """``LossScaleOptimizer.check_finite`` answers for all replicas, not replica 0's alone."""

    name = "keras_loss_scale"
    change_text = 'LossScaleOptimizer skips a step that overflowed on any replica'
    upstream = "keras-team/keras: LossScaleOptimizer applies a step that overflowed on another replica (inf weights)"
    verified_up_to = "3.15.1"
    targets = (_TARGET,)
    # The probe runs eager ops: it waits for the first multi-replica check (after any CPU split).
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_loss_scale_module()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        tf_ = tf()
        check_finite = self.original(_TARGET)
        outcome: list[str] = []
        handler = _compat.loss_scale_step_handler(module, check_finite, lambda: outcome.append("applied"),
                                                  lambda: outcome.append("skipped"))
        with tf_.init_scope():  # eager even when Keras calls check_finite while tracing its step
            grads = _Values([[tf_.constant([1.0])], [tf_.constant([float("inf")])]])
            handler(_StandInDistribution(), grads, None)
        if set(outcome) not in ({"applied"}, {"skipped"}):
            raise RuntimeError(f"the stand-in step ran {outcome!r}, expected it applied or skipped")
        # Applied (on every replica) although replica 1 overflowed: the bug.
        return ProbeResult({_TARGET: outcome[0] == "applied"})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def check_finite(optimizer: Optimizer, grads: object) -> object:
            finite = original(optimizer, grads)
            tf_ = tf()
            context = tf_.distribute.get_replica_context()
            if context is None or context.num_replicas_in_sync < 2 or PATCH.needed() is not True:
                return finite
            PATCH.acted()
            overflowed = context.all_reduce(tf_.distribute.ReduceOp.SUM, tf_.cast(tf_.logical_not(finite), tf_.float32))
            return tf_.equal(overflowed, 0.0)

        return check_finite


PATCH = LossScalePatch()
