"""Make a Keras loss object called in a strategy's scope, outside ``strategy.run``, return one device's loss.

The bug (TensorFlow 2.21, Keras 3.15.1; no public report found): ``loss_fn = keras.losses.MeanSquaredError()``
called inside ``with strategy.scope():`` of a MirroredStrategy of 2 replicas, but not inside ``strategy.run``
(a validation loss computed on the whole data, as scripts that indent their training under the scope do),
returns the loss divided by 2: 2.0 for a squared error of 4. No error. Outside the scope it returns 4.0.

Root cause. Keras divides a reduced loss by the replica count (``losses.loss.reduce_values`` calls
``scale_loss_for_distribution``), so that inside ``strategy.run`` each replica's value is its share of
the global mean and the all-reduce, which sums the replicas' gradients, sums to the global mean's
gradient. It takes the replica count from ``tf.distribute.get_strategy()``, which in the scope's
cross-replica context is the strategy too, though no replica shares anything there: the call computes
the whole loss, and Keras divides it all the same. ``unscale_loss_for_distribution`` multiplies
back under the same test.

The fix. In a cross-replica context (``tf.distribute.in_cross_replica_context()``: a strategy's scope,
not one of its replicas) both return their value unchanged, as on one device. In a replica context,
Keras' own functions run: every step of ``fit``, ``evaluate``, a custom ``train_step`` and a loss
object inside ``strategy.run`` is Keras' own, bit for bit.

The probe. Keras' own ``scale_loss_for_distribution`` of 4.0 in the scope of a 2-replica
``MirroredStrategy`` over two devices of this host: the bug returns 2.0. It runs TensorFlow ops, so it
waits until a loss is first reduced in the scope of a strategy of 2+ replicas. The upstream canary
``test_upstream_keras_still_divides_a_cross_replica_loss`` fails once Keras fixes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy._tf import tf
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Strategy

SCALE = "losses.loss.scale_loss_for_distribution"
UNSCALE = "losses.loss.unscale_loss_for_distribution"


def shared_by_no_replica() -> Any:
    """The strategy of the current cross-replica context if it has 2+ replicas (the bug's condition), else ``None``."""
    distribute = tf().distribute
    if not distribute.has_strategy() or not distribute.in_cross_replica_context():
        return None
    strategy = distribute.get_strategy()
    return strategy if strategy.num_replicas_in_sync > 1 else None


class CrossReplicaLossPatch(TrainingApiPatch):
    """A loss reduced in a strategy's cross-replica context is not divided by the replica count."""

    name = "keras_cross_replica_loss"
    change_text = ("a loss object called in a strategy's scope outside strategy.run returns the loss, not the loss "
                   "divided by the replica count")
    upstream = ("no public report found: Keras 3 divides a loss computed in a strategy's scope, outside "
                "strategy.run, by the replica count")
    targets = (SCALE, UNSCALE)

    def probe_on(self, strategy: Strategy) -> ProbeResult:
        with strategy.scope():
            value = float(self.original(SCALE)(tf().constant(4.0)))
        if value not in (2.0, 4.0):
            raise RuntimeError(f"the probe's loss of 4.0 came back {value}, expected 2.0 or 4.0")
        return ProbeResult({target: value == 2.0 for target in self.targets})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def keep_outside_replicas(value: object) -> object:
            strategy = shared_by_no_replica()
            if strategy is None or not PATCH.acts_on(strategy):
                return original(value)
            PATCH.acted()
            return value

        return keep_outside_replicas


PATCH = CrossReplicaLossPatch()
