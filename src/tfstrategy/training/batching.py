"""The batch plan: global batch, per-replica batch and steps, decided before any data moves.

Under a synchronous strategy every step consumes one *global* batch, split evenly
across the replicas. :func:`plan_batch` turns what the user knows (a global or a
per-replica batch, the replica count, maybe the dataset size) into a
:class:`BatchPlan`, refusing the combinations that break training. It is pure:
no TensorFlow, so every rule is testable in a table.

Why the rules, measured on TensorFlow 2.21 / Keras 3.15 under MirroredStrategy:

- a global batch that does not divide by the replicas makes the *first* batch
  uneven, and ``fit`` crashes ("Inputs to operation AddN ... must have the same
  size");
- an uneven *last* training batch trains, but the result differs from one
  replica (largest weight difference 6.3e-3 after 16 small steps, against
  1.2e-7 with even batches), so training drops the remainder by
  default. Validation keeps it: Keras weights each replica's loss and metrics
  by its batch size, so the averages stay exact. A validation set smaller than
  one global batch is one partial batch; if its size does not divide by the
  replicas, the batch shrinks to the largest multiple of them, so the first
  step leaves no replica empty.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfstrategy.errors import BatchError

__all__ = ["replicas_of", "BatchPlan", "plan_batch"]


#: tf.data takes sizes as int64.
_INT64_MAX = 2**63 - 1


def _whole(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BatchError(f"Received {name}={value!r}; expected a whole number of at least {minimum}, e.g. {name}=256.")
    if value < minimum:
        raise BatchError(f"Received {name}={value}; expected at least {minimum}.")
    if value > _INT64_MAX:
        raise BatchError(
            f"Received {name}={value}; expected at most 2**63-1, the largest size tf.data takes (int64). "
            f"Pass the {name.replace('_', ' ')} you mean, e.g. {name}=256."
        )
    return value


def replicas_of(strategy_or_replicas: object) -> int:
    """The replica count of a strategy, a :class:`~tfstrategy.Selection`, or an int.

    Raises:
        BatchError: it is none of those, or below 1.
    """
    value = strategy_or_replicas
    if hasattr(value, "num_replicas_in_sync"):
        value = value.num_replicas_in_sync
    elif hasattr(value, "strategy") and hasattr(value.strategy, "num_replicas_in_sync"):
        value = value.strategy.num_replicas_in_sync
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BatchError(
            f"Received replicas={strategy_or_replicas!r}; expected a tf.distribute strategy, a tfstrategy Selection "
            "or a whole number of replicas of at least 1, e.g. plan_batch(global_batch=256, replicas=selection)."
        )
    return value


@dataclass(frozen=True, kw_only=True)
class BatchPlan:
    """How one dataset is batched for one strategy.

    Attributes:
        global_batch: examples per step across all replicas (what ``batch()`` takes).
        per_replica_batch: examples each replica sees per step.
        replicas: replicas in sync (all workers).
        dataset_size: examples per epoch, when known.
        drop_remainder: whether the last, smaller batch is dropped.
        steps_per_epoch: steps one pass over the data takes, when the size is known.
        remainder: examples in the last partial batch (dropped when ``drop_remainder``).
    """

    global_batch: int
    per_replica_batch: int
    replicas: int
    dataset_size: int | None = None
    drop_remainder: bool = True
    steps_per_epoch: int | None = None
    remainder: int = 0

    def lines(self) -> list[str]:
        """``key value`` lines, the format of ``tfstrategy check``."""
        lines = [
            f"global_batch {self.global_batch}",
            f"replicas {self.replicas}",
            f"per_replica_batch {self.per_replica_batch}",
            f"drop_remainder {self.drop_remainder}",
        ]
        if self.dataset_size is not None:
            lines += [f"dataset_size {self.dataset_size}", f"steps_per_epoch {self.steps_per_epoch}"]
            what = "dropped_per_epoch" if self.drop_remainder else "last_batch"
            lines.append(f"{what} {self.remainder if self.drop_remainder else self.remainder or self.global_batch}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


def plan_batch(
    replicas: object,
    *,
    global_batch: int | None = None,
    per_replica_batch: int | None = None,
    dataset_size: int | None = None,
    drop_remainder: bool = True,
) -> BatchPlan:
    """Plan the batching of one dataset for a strategy.

    Give exactly one of ``global_batch`` (the how-to's 256) and
    ``per_replica_batch`` (scale the global batch with the replicas).

    Args:
        replicas: a strategy, a :class:`~tfstrategy.Selection` or a replica count.
        global_batch: examples per step across all replicas.
        per_replica_batch: examples per step on each replica.
        dataset_size: examples in one epoch, if known (``None``: unknown or infinite).
        drop_remainder: drop the last partial batch; keep ``True`` for training
            (see the module docstring), pass ``False`` for validation.

    Raises:
        BatchError: both or neither batch given; a global batch that does not
            divide by the replicas; a per-replica batch below 1; a training
            dataset smaller than one global batch, or a validation one smaller
            than the replicas.

    Example:
        >>> print(plan_batch(4, global_batch=256, dataset_size=10_000))
        global_batch 256
        replicas 4
        per_replica_batch 64
        drop_remainder True
        dataset_size 10000
        steps_per_epoch 39
        dropped_per_epoch 16
    """
    count = replicas_of(replicas)
    if (global_batch is None) == (per_replica_batch is None):
        raise BatchError(
            f"Received global_batch={global_batch!r} and per_replica_batch={per_replica_batch!r}; expected exactly "
            "one of them. Pass global_batch=256 (split across replicas) or per_replica_batch=64 (scaled by them)."
        )
    if per_replica_batch is not None:
        if isinstance(per_replica_batch, int) and not isinstance(per_replica_batch, bool) and per_replica_batch < 1:
            raise BatchError(
                f"Received per_replica_batch={per_replica_batch}; each replica needs at least 1 example per step. "
                "Pass per_replica_batch=1 or more."
            )
        per_replica = _whole("per_replica_batch", per_replica_batch, minimum=1)
        total = per_replica * count
    else:
        total = _whole("global_batch", global_batch, minimum=1)
        if total < count:
            raise BatchError(
                f"Received global_batch={total} for {count} replicas; that is a per-replica batch of "
                f"{total / count:g}, below 1. Pass global_batch={count} or more (a multiple of {count})."
            )
        if total % count:
            lower, upper = total - total % count, total - total % count + count
            raise BatchError(
                f"Received global_batch={total} for {count} replicas; it does not divide evenly, and an uneven "
                f"first batch crashes Keras fit under MirroredStrategy. Pass global_batch={lower} or {upper}, "
                f"or per_replica_batch={upper // count}."
            )
        per_replica = total // count

    steps, remainder = None, 0
    if dataset_size is not None:
        size = _whole("dataset_size", dataset_size, minimum=1)
        if size < total and not drop_remainder:
            # Evaluation: the one batch is partial. Its split must leave no replica
            # empty on this *first* step, or Keras' evaluate fails ("Inputs to
            # operation AddN ... must have the same size", measured on TF 2.21 with
            # 6 examples on 4 replicas). A batch that is a multiple of the replicas
            # splits evenly; later partial batches may leave replicas empty.
            if size < count:
                raise BatchError(
                    f"Received a dataset of {size} examples for {count} replicas; every replica needs at least one "
                    f"example on the first step. Evaluate on one replica (tfstrategy.select(strategy='one_device')) "
                    f"or with at least {count} examples."
                )
            if size % count:
                total = count * (size // count)
                per_replica = total // count
        if size < total and drop_remainder:
            raise BatchError(
                f"Received a dataset of {size} examples for a global batch of {total}; it is smaller than one "
                f"batch, so there would be no even step to train on. Pass global_batch={count * max(1, size // count)}"
                " or less, or use more data."
            )
        steps, remainder = divmod(size, total)
        if remainder and not drop_remainder:
            steps += 1
    return BatchPlan(
        global_batch=total,
        per_replica_batch=per_replica,
        replicas=count,
        dataset_size=dataset_size,
        drop_remainder=drop_remainder,
        steps_per_epoch=steps,
        remainder=remainder,
    )
