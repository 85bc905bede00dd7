"""Make Keras 3 ``predict_on_batch`` on 2+ replicas return one row per example, as on one device.

The bug (TensorFlow 2.21, Keras 3.15.1; no public report found): ``model.predict_on_batch(x)`` on a
batch of 16 under a MirroredStrategy of 2 replicas returns 32 rows: rows 16-31 repeat rows 0-15.
No error. ``predict`` on the same array is right.

Root cause. ``TensorFlowTrainer.predict_on_batch`` hands ``predict_function`` the batch as it came,
``[(x,)]``, undistributed: ``strategy.run`` then gives every replica the whole batch, and the
function concatenates the replicas' outputs (``reduce_per_replica(..., "concat")``), as it must for
the per-replica parts ``predict`` feeds it.

The fix. On 2+ replicas in sync, ``predict_on_batch`` hands Keras' own code the batch already split:
replica ``i`` (its global id, so across workers too) gets the ``i``-th of ``replicas`` contiguous
parts of the rows, the first ``rows % replicas`` parts one row longer, and the concatenation is the
batch's rows in order. Each row is computed by one replica whole, so the values are one device's.
One device, or a batch that is not dense or ragged arrays or tensors of at least one dimension (a
``SparseTensor``: Keras then does what it does), runs Keras' own function unchanged.

The probe. Keras' own ``predict_on_batch`` of a batch of 2 on a one-layer model under a 2-replica
``MirroredStrategy`` over two devices of this host: the bug returns 4 rows. It runs TensorFlow ops,
so it waits until a model first predicts a batch on 2+ replicas. The upstream canary
``test_upstream_keras_still_predicts_the_batch_on_every_replica`` fails once Keras fixes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.patches.keras_training_api import TrainingApiPatch
from tfstrategy.patches.mechanism import ProbeResult

if TYPE_CHECKING:
    from tfstrategy._protocols import Model, Strategy

TARGET = "backend.tensorflow.trainer.TensorFlowTrainer.predict_on_batch"


def split_rows(rows: int, replicas: int, replica: int) -> tuple[int, int]:
    """The ``[start, end)`` rows of ``replica`` when ``rows`` are cut into ``replicas`` contiguous parts in order."""
    base, extra = divmod(rows, replicas)
    start = replica * base + min(replica, extra)
    return start, start + base + (1 if replica < extra else 0)


def _rows(leaves: list[object]) -> int | None:
    """The batch's row count, if every leaf is an array or tensor with the same first dimension."""
    counts = set()
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        # A sparse tensor cannot be sliced by rows: Keras' own function takes such a batch.
        if shape is None or len(shape) == 0 or shape[0] is None or isinstance(leaf, tf().sparse.SparseTensor):
            return None
        counts.add(int(shape[0]))
    return counts.pop() if len(counts) == 1 else None


def distributed_batch(strategy: Strategy, x: object) -> object:
    """``x`` split by rows over ``strategy``'s replicas (a per-replica value), or ``None`` if it cannot be."""
    tree = _compat.keras3_tree()
    leaves = tree.flatten(x)
    rows = _rows(leaves) if leaves else None
    if rows is None:
        return None
    tf_ = tf()
    replicas = strategy.num_replicas_in_sync

    def part(context: Any) -> object:
        start, end = split_rows(rows, replicas, context.replica_id_in_sync_group)
        return tree.map_structure(lambda leaf: tf_.convert_to_tensor(leaf)[start:end], x)

    return strategy.experimental_distribute_values_from_function(part)


class PredictOnBatchPatch(TrainingApiPatch):
    """``predict_on_batch`` gives each replica its part of the batch, not the whole batch."""

    name = "keras_predict_on_batch"
    change_text = "predict_on_batch splits the batch over the replicas (one row per example, not one per replica)"
    upstream = "no public report found: Keras 3 predict_on_batch on 2+ replicas returns replicas x the rows"
    targets = (TARGET,)

    def probe_on(self, strategy: Strategy) -> ProbeResult:
        import keras
        import numpy as np

        with strategy.scope():
            model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        rows = len(np.asarray(self.original(TARGET)(model, np.ones((2, 1), "float32"))))
        if rows not in (2, 4):
            raise RuntimeError(f"the probe's batch of 2 gave {rows} rows, expected 2 or 4")
        return ProbeResult({TARGET: rows == 4})

    def replacement(self, target: str, original: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(original)
        def predict_on_batch(model: Model, x: object) -> object:
            strategy = model.distribute_strategy
            if strategy.num_replicas_in_sync < 2 or not PATCH.acts_on(strategy):
                return original(model, x)
            split = distributed_batch(strategy, x)
            if split is None:
                return original(model, x)
            PATCH.acted()
            return original(model, split)

        return predict_on_batch


PATCH = PredictOnBatchPatch()
