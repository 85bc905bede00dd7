"""Make ``clipnorm``, ``global_clipnorm`` and ``clipvalue`` clip the global gradient on 2+ replicas.

The bug (TensorFlow 2.21, Keras 3.15.1; the tf.keras form is tensorflow/tensorflow#33929, where Keras
refused clipping under a strategy instead, "clipping before gradients get aggregated (usually
wrong)"): ``SGD(clipnorm=0.1)`` (or ``global_clipnorm``, ``clipvalue``) in ``fit`` or a custom loop
under a MirroredStrategy of 2 replicas: no error, and every step differs from one device's (the
matrix's cells: weights up to 0.04 away after 2 epochs, epoch-2 loss 0.2-0.4 off).

Root cause. ``BaseOptimizer._backend_apply_gradients`` clips (``_clip_gradients``) the gradients it
receives, which on 2+ replicas are each replica's part of the gradient, and only then does
``TFOptimizer._backend_update_step`` sum them across replicas (``_all_reduce_sum_gradients``). The
sum of the clipped parts is not the clipped sum: with a threshold that binds, 2 replicas take up to
2 times the step one device takes.

The fix. When the optimizer clips (one of the three options set) and runs in a replica context of 2+
replicas, ``_clip_gradients`` first sums the gradients across replicas (the same all-reduce Keras
makes, moved before the clipping), clips the sum, and marks the optimizer in this replica's thread;
``_all_reduce_sum_gradients`` then passes the already-summed gradients through instead of summing
them again. One all-reduce per step, as before. An optimizer that does not clip, one replica, or a
call outside a replica context runs Keras' own functions unchanged.

The probe. Each of the three options at 1.0, on SGD(1.0), applying a gradient of 2.0 on each replica
of a 2-replica ``MirroredStrategy`` over two devices of this host: the global gradient is 4.0, clipped
to 1.0 (one device's step); the bug steps by 2.0. It runs TensorFlow ops, so it waits until a clipping
optimizer first applies gradients on 2+ replicas. The upstream canary
``test_upstream_keras_still_clips_before_the_all_reduce`` fails once Keras fixes it.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Optimizer, Strategy

CLIP = "optimizers.base_optimizer.BaseOptimizer._clip_gradients"
ALL_REDUCE = "backend.tensorflow.optimizer.TFOptimizer._all_reduce_sum_gradients"
OPTIONS = ("clipnorm", "global_clipnorm", "clipvalue")

#: The optimizers whose gradients this replica's thread already summed (before clipping them).
_SUMMED = threading.local()
#: The probe's own optimizers: Keras' functions run for them as they are (the probe measures those).
_PROBING: weakref.WeakSet[Any] = weakref.WeakSet()


def clips(optimizer: Optimizer) -> bool:
    """Whether ``optimizer`` clips its gradients (Keras' own test: one of the three options set above 0)."""
    return any((getattr(optimizer, option, None) or 0) > 0 for option in OPTIONS)


def _summed() -> set[int]:
    if not hasattr(_SUMMED, "ids"):
        _SUMMED.ids = set()
    ids: set[int] = _SUMMED.ids
    return ids


class ClippingPatch(TrainingApiPatch):
    """Clipping optimizers clip the gradient summed over the replicas, not each replica's part."""

    name = "keras_clipping"
    change_text = ("clipnorm/global_clipnorm/clipvalue clip the gradient summed over the replicas, as one device "
                   "clips the global batch's, not each replica's part (tensorflow#33929)")
    upstream = "tensorflow/tensorflow#33929: gradient clipping before the cross-replica sum"
    targets = (CLIP, ALL_REDUCE)

    def probe_on(self, strategy: Strategy) -> ProbeResult:
        import keras

        tf_ = tf()
        with strategy.scope():
            weights = {option: keras.Variable([0.0], name=f"probe_{option}") for option in OPTIONS}
            optimizers = {option: keras.optimizers.SGD(1.0, **{option: 1.0}) for option in OPTIONS}
            for option, optimizer in optimizers.items():
                _PROBING.add(optimizer)
                optimizer.build([weights[option]])

        def replica() -> None:
            for option, optimizer in optimizers.items():
                optimizer.apply([tf_.constant([2.0])], [weights[option]])

        tf_.function(lambda: strategy.run(replica))()
        moved = {option: round(-float(weights[option].numpy()[0]), 4) for option in OPTIONS}
        if set(moved.values()) - {1.0, 2.0}:
            raise RuntimeError(f"the probe's steps were {moved}, expected 1.0 (clipped sum) or 2.0 (summed clips)")
        broken = any(value == 2.0 for value in moved.values())
        return ProbeResult({CLIP: broken, ALL_REDUCE: broken})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        if target == ALL_REDUCE:
            @functools.wraps(original)
            def _all_reduce_sum_gradients(optimizer: Optimizer, grads_and_vars: Any) -> object:
                summed = _summed()
                if id(optimizer) in summed:
                    summed.discard(id(optimizer))
                    return list(grads_and_vars)
                return original(optimizer, grads_and_vars)

            return _all_reduce_sum_gradients

        @functools.wraps(original)
        def _clip_gradients(optimizer: Optimizer, grads: Any) -> object:
            tf_ = tf()
            context = tf_.distribute.get_replica_context()
            if (not clips(optimizer) or context is None or context.num_replicas_in_sync < 2 or optimizer in _PROBING
                    or not _compat.sums_gradients_across_replicas(optimizer) or not PATCH.acts_on(context.strategy)):
                return original(optimizer, grads)
            PATCH.acted()
            present = [grad for grad in grads if grad is not None]
            reduced = iter(context.all_reduce(tf_.distribute.ReduceOp.SUM, present) if present else [])
            _summed().add(id(optimizer))
            return original(optimizer, [None if grad is None else next(reduced) for grad in grads])

        return _clip_gradients


PATCH = ClippingPatch()
