"""Make Keras 3 ``fit`` weight each replica's loss by its share of an uneven batch.

The bug (keras-team/keras#19246; tensorflow/tensorflow#58809, #41657, #30847; TensorFlow 2.21,
Keras 3.15.1): ``fit(x, y, batch_size=8)`` on 33 NumPy examples with 2 replicas ends one epoch
with a batch of 1, which one replica gets while the other gets none; a global batch of 9 is split
5/4 at every step. No error: those steps are wrong. Measured (2 epochs, SGD 0.1, a small MLP):
the final weights are 0.27 away from the same fit on one device.

Root cause. Keras averages each replica's loss over the replica's own examples and then divides
by the number of replicas (``scale_loss_for_distribution``), so the gradients summed across
replicas are those of a mean of per-replica means. That equals the global mean only when every
replica has as many examples. A replica with 1 example then counts as much as one with 4 (and
the one with 0 contributes nothing while still dividing the step by 2).

The fix. ``TensorFlowTrainer.train_step`` (Keras' own, for models that do not override it) runs
with the replica's share of the global batch, ``n_local / n_global`` (``n_global`` summed over the
replicas in sync, one scalar all-reduce), in place of ``1 / replicas``: Keras'
``scale_loss_for_distribution`` multiplies by it, and ``unscale_loss_for_distribution`` divides by
it, so the loss tracker (weighted by ``n_local``) still reports the mean loss. Regularization
losses, scaled the same way, still add up to one copy. Outside that step (a custom
``train_step``, ``evaluate``, one replica) both are Keras' own. Loss reductions that are not
``sum_over_batch_size`` (``sum``, ``mean_with_sample_weight``) are left as Keras makes them.

Only where the bug's condition holds. The same all-reduce carries each replica's ``n_local**2``,
so every replica knows whether the shares differ (``replicas * sum(n**2) != sum(n)**2``, exact
in float64); when they are equal (every even batch) a ``tf.cond`` takes Keras' own
``scale``/``unscale`` instead of multiplying by a share that equals ``1 / replicas`` only up to
rounding, so an even-batch run trains bit for bit as plain Keras does. It is decided per step
at run time: a replica's step is traced in a thread of its own and sees only its own static
shape, and Keras' batches from NumPy arrays have a dynamic batch size anyway.

The probe. One step of Keras' own ``train_step`` on a one-weight model, under a 2-replica
``MirroredStrategy`` over two devices of this host, on a global batch of 3 split 2/1: the bug
moves the weight by a different amount than the same step on one device (computed in closed
form). It runs TensorFlow ops, so it waits until a model first trains on 2+ replicas. In a
multi-worker job, where a worker may have a single device, no probe decides up to the verified
release (every worker installs the fix, so all of them build the same step). The upstream
canary ``test_upstream_keras_still_weights_replicas_equally`` fails once Keras fixes it.

The first batch of an odd global batch also crashed before any step, in Keras' symbolic build
(``AddN must have the same size and shape. Input 0: [5,4] != input 1: [4,4]``); that part is in
:mod:`~tfstrategy.patches.keras_mwms`, which owns that function.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat, _versions
from tfstrategy._tf import tf
from tfstrategy.patches.mechanism import Patch, ProbeResult
from tfstrategy.selection.strategies import mirrored_strategy

if TYPE_CHECKING:
    from tfstrategy._protocols import Model

STEP = "backend.tensorflow.trainer.TensorFlowTrainer.train_step"
SCALE = "losses.loss.scale_loss_for_distribution"
UNSCALE = "losses.loss.unscale_loss_for_distribution"

#: The probe's weight update on one device: w = 1, x = [1, 2, 3], y = 0, mse, SGD(0.01).
_PROBE_RATE = 0.01
_PROBE_EXPECTED = 1.0 - _PROBE_RATE * 2.0 * (1.0 + 4.0 + 9.0) / 3.0

#: The share of the global batch of the replica whose step this thread traces (MirroredStrategy
#: runs each replica's step in a thread of its own).
_SHARE = threading.local()


@contextlib.contextmanager
def _batch_share(share: object) -> Iterator[None]:
    previous = getattr(_SHARE, "value", None)
    _SHARE.value = share
    try:
        yield
    finally:
        _SHARE.value = previous


def local_batch_size(data: object) -> object:
    """The number of examples in one replica's ``(x, y, sample_weight)`` (or ``x``) batch, as a tensor."""
    x = data[0] if isinstance(data, tuple) and 1 <= len(data) <= 3 else data
    leaf = next(item for item in _compat.keras3_tree().flatten(x) if item is not None)
    return tf().shape(leaf)[0]


def fix_needed(model: Model) -> bool:
    """Whether ``model``'s Keras ``train_step`` on this strategy needs the batch-share weighting."""
    strategy = _compat.model_strategy(model)
    if strategy is not None and _compat.in_multi_worker_mode(strategy) and not _versions.newer_than(
            _compat.keras_version(_compat.keras_for()), PATCH.verified_up_to):
        return True  # every worker must build the same step; the bug is known up to the verified release
    return PATCH.needed() is True


def probe_devices() -> list[str]:
    """Two devices of one kind on this host (GPUs first) for a 2-replica probe; raises if there are fewer."""
    tf_ = tf()
    for kind in ("GPU", "CPU"):
        devices = [device.name for device in tf_.config.list_logical_devices(kind)]
        if len(devices) >= 2:
            return devices[:2]
    raise RuntimeError("this host has fewer than 2 devices of one kind, so no 2-replica probe can run")


class UnevenBatchesPatch(Patch):
    """Keras' ``train_step`` weights each replica's loss by its share of the global batch."""

    name = "keras_uneven_batches"
    change_text = ("a step whose batch splits unevenly weights each replica's loss by its share (keras#19246); "
                   "even ones run as Keras' own")
    upstream = "keras-team/keras#19246, tensorflow/tensorflow#58809: uneven last batch on 2+ replicas"
    verified_up_to = "3.15.1"
    targets = (STEP, SCALE, UNSCALE)
    probe_on_first_use = True

    def target_module(self) -> Any:
        return _compat.keras3_loss_module_root()

    def run_probe(self, module: ModuleType) -> ProbeResult:
        tf_ = tf()
        import keras

        strategy = mirrored_strategy(probe_devices())  # keys of its own: see mirrored_strategy
        with strategy.scope():
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
            model.compile(optimizer=keras.optimizers.SGD(_PROBE_RATE), loss="mse")
        x = tf_.constant([[1.0], [2.0], [3.0]])
        y = tf_.zeros((3, 1))
        _compat.symbolic_build(model, (x, y))
        step = self.original(STEP)
        batch = next(iter(strategy.experimental_distribute_dataset(tf_.data.Dataset.from_tensor_slices((x, y)).batch(3))))
        parts = [int(tf_.shape(part)[0]) for part in strategy.experimental_local_results(batch[0])]
        if sorted(parts) != [1, 2]:
            raise RuntimeError(f"the probe's batch of 3 was split {parts}, expected 2 and 1")

        train = tf_.function(lambda batch: strategy.run(lambda data: step(model, data), args=(batch,)))
        train(batch)
        weight = float(model.get_weights()[0].reshape(()))
        return ProbeResult({STEP: abs(weight - _PROBE_EXPECTED) > 1e-4, SCALE: True, UNSCALE: True})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        if target == STEP:
            return _weighted_train_step(original)
        if target == SCALE:
            return _scale(original, inverse=False)
        return _scale(original, inverse=True)


def _weighted_train_step(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def train_step(model: Model, data: object) -> object:
        tf_ = tf()
        context = tf_.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync < 2 or not fix_needed(model):
            return original(model, data)
        PATCH.acted()
        local = tf_.cast(local_batch_size(data), tf_.float64)
        # One all-reduce of (n, n**2): the shares are all equal exactly when replicas * sum(n**2) == sum(n)**2
        # (exact in float64 for any batch size), and then the step is Keras' own, bit for bit.
        total, squares = tf_.unstack(context.all_reduce(tf_.distribute.ReduceOp.SUM, tf_.stack([local, local * local])))
        uneven = tf_.not_equal(squares * context.num_replicas_in_sync, total * total)
        share = tf_.cast(tf_.math.divide_no_nan(local, total), tf_.float32)
        with _batch_share(_Share(share, uneven)):
            return original(model, data)

    return train_step


class _Share:
    """This replica's share of the global batch, and whether the replicas' shares differ (a bool tensor)."""

    def __init__(self, value: object, uneven: object) -> None:
        self.value = value
        self.uneven = uneven


def _scale(original: Callable[..., object], *, inverse: bool) -> Callable[..., object]:
    @functools.wraps(original)
    def scale(value: Any) -> object:
        share = getattr(_SHARE, "value", None)
        if share is None:
            return original(value)
        tf_ = tf()

        def weighted() -> object:
            factor = tf_.cast(share.value, value.dtype)
            # unscale(scale(v)) == v, and a replica with no example (share 0) reports 0 at weight 0.
            return tf_.math.divide_no_nan(value, factor) if inverse else value * factor

        # Even shares take Keras' own branch (not a multiplication by a share that equals 1/replicas only up
        # to rounding), so an even batch computes exactly what plain Keras computes.
        return tf_.cond(share.uneven, weighted, lambda: original(value))

    return scale


PATCH = UnevenBatchesPatch()
