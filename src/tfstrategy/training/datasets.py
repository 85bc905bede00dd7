"""Dataset preparation: the how-to's step 3, with the batch plan enforced.

One call batches with the global batch (dropping the remainder when training),
sets the auto-shard policy explicitly for the strategy and prefetches with
``AUTOTUNE``. It accepts a ``tf.data.Dataset`` or, for per-worker pipelines, a
function ``fn(input_context) -> Dataset`` (``distribute_datasets_from_function``).

Why the explicit shard policy: left at ``AUTO``, a multi-worker job over an
in-memory dataset logs "AUTO sharding policy will apply DATA sharding policy as
it failed to apply FILE sharding policy", and the reader cannot tell whether
that is what they wanted. One worker has one input pipeline, so there is
nothing to shard (``OFF``); several workers shard ``DATA`` (every worker reads
and keeps its share of elements) unless the source reads files, where ``FILE``
(each worker reads its own files) saves the reads.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import BatchError
from tfstrategy.training.batching import BatchPlan, plan_batch, replicas_of

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset, Strategy

__all__ = ["auto_shard_policy", "dataset_size", "plan_dataset", "prepare_dataset", "refuse_endless_fit"]

#: tf.data classes that read files; their pipelines can be sharded by file.
_FILE_SOURCES = ("tfrecord", "textline", "fixedlengthrecord")
AUTO_SHARD_POLICIES = ("off", "data", "file", "auto")


def _dataset_chain(dataset: Dataset) -> list[Any]:
    """The dataset and every dataset it reads from, outermost first."""
    seen, order, stack = set(), [], [dataset]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        order.append(current)
        stack.extend(reversed(_compat.dataset_inputs(current)))
    return order


def batched_by(dataset: Dataset) -> str | None:
    """The name of the batching transformation whose batches ``dataset`` yields, or ``None``.

    Walks the pipeline from the output towards the source; an ``unbatch``
    met before any ``batch`` means elements are single examples again.
    """

    def visit(current: Any) -> str | None:
        name = type(current).__name__.lstrip("_")
        lowered = name.lower()
        if "unbatch" in lowered:
            return None
        if "batch" in lowered:
            return name
        # interleave/flat_map/group_by_window yield the elements of the datasets
        # their functions return: batching there (bucket_by_sequence_length's
        # padded_batch) batches the output just the same.
        for output in _compat.dataset_function_outputs(current):
            found = visit_op(output.op, set())
            if found:
                return f"{found} inside {name}"
        for captured in _compat.dataset_function_captures(current):
            found = visit(captured)
            if found:
                return f"{found} captured by {name}'s function"
        for source in _compat.dataset_inputs(current):
            found = visit(source)
            if found:
                return found
        return None

    def visit_op(op: Any, seen: set[tuple[int, str]]) -> str | None:
        key = (id(op.graph), op.name)  # names repeat across function graphs
        if key in seen:
            return None
        seen.add(key)
        lowered = op.type.lower()
        if "unbatch" in lowered:
            return None
        if "batch" in lowered and "dataset" in lowered:
            return str(op.type)
        variant = tf().variant
        sources = [*_compat.op_function_outputs(op), *(tensor for tensor in op.inputs if tensor.dtype == variant)]
        for tensor in sources:
            found = visit_op(tensor.op, seen)
            if found:
                return found
        return None

    return visit(dataset)


def reads_files(dataset: Dataset) -> bool:
    """Whether the pipeline's source reads TFRecord, text-line or fixed-length files."""
    return any(
        any(marker in type(part).__name__.lower() for marker in _FILE_SOURCES) for part in _dataset_chain(dataset)
    )


def is_multi_worker(strategy: Strategy) -> bool:
    """Whether the strategy has more than one input pipeline's worth of workers."""
    distribute = tf().distribute
    if not isinstance(strategy, distribute.MultiWorkerMirroredStrategy):
        return False
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return False
    spec = resolver.cluster_spec().as_dict()
    return sum(len(spec.get(role) or []) for role in ("chief", "worker")) > 1


def auto_shard_policy(
    strategy: Strategy, dataset: Dataset | None = None, requested: str | None = None, *, keeps_partial_batch: bool = False
) -> object:
    """The ``tf.data.experimental.AutoShardPolicy`` to set for this strategy and dataset.

    On one worker there is nothing to shard. Training batches are all full and
    get ``OFF``. A pipeline that keeps a partial last batch (validation) gets
    ``DATA``, a no-op shard on one worker that makes TensorFlow split a partial
    batch evenly: under ``OFF`` it fills the replicas in order, so 16 examples on
    4 replicas become [16, 0, 0, 0] (and a first step with empty replicas fails),
    under ``DATA`` [4, 4, 4, 4], as plain ``.batch()`` does (measured on TF 2.21).

    Args:
        strategy: the strategy the dataset feeds.
        dataset: the unbatched source, inspected for file readers.
        requested: ``off``, ``data``, ``file`` or ``auto`` to override.
        keeps_partial_batch: the pipeline keeps its last partial batch.

    Raises:
        BatchError: ``requested`` is not a policy name.
    """
    policy = tf().data.experimental.AutoShardPolicy
    if requested is not None:
        text = str(requested).strip().lower()
        if text not in AUTO_SHARD_POLICIES:
            raise BatchError(
                f"Received auto_shard={requested!r}; expected one of {', '.join(AUTO_SHARD_POLICIES)}, or None to "
                "let tfstrategy choose (off on one worker, data or file on several)."
            )
        return getattr(policy, text.upper())
    if not is_multi_worker(strategy):
        return policy.DATA if keeps_partial_batch else policy.OFF
    return policy.FILE if dataset is not None and reads_files(dataset) else policy.DATA


def _refuse_batched(dataset: Dataset) -> None:
    name = batched_by(dataset)
    if name:
        raise BatchError(
            f"Received a dataset already batched by {name}; expected single examples, because tfstrategy batches "
            "with the global batch itself. Remove the .batch(...) call from the dataset (or .unbatch() it first)."
        )


#: Where ``steps_per_epoch`` sits among Keras ``Model.fit``'s positional arguments.
_FIT_STEPS_POSITION = 12


def _cardinality(data: object) -> int | None:
    distribute = tf().distribute
    if isinstance(data, tf().data.Dataset):
        return int(data.cardinality())
    if isinstance(data, distribute.DistributedDataset):
        try:
            return int(data.cardinality)
        except (AttributeError, TypeError, ValueError):
            return None
    return None


def refuse_endless_fit(args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    """Refuse ``fit(dataset)`` on an infinite dataset without ``steps_per_epoch``: its first epoch never ends.

    Args:
        args: ``fit``'s positional arguments (after the model).
        kwargs: its keyword arguments.

    Raises:
        BatchError: the data repeats forever and no ``steps_per_epoch`` bounds an epoch.
    """
    data = kwargs.get("x", args[0] if args else None)
    steps = kwargs.get("steps_per_epoch", args[_FIT_STEPS_POSITION] if len(args) > _FIT_STEPS_POSITION else None)
    if steps is not None or data is None:
        return
    if _cardinality(data) == int(tf().data.INFINITE_CARDINALITY):
        raise BatchError(
            "Received fit() on an infinite dataset (it .repeat()s without a count) and no steps_per_epoch; expected "
            "a size or a bound, because the first epoch would never end. Pass steps_per_epoch=plan.steps_per_epoch "
            "(tfstrategy.plan_dataset on the dataset before .repeat()), or drop .repeat()."
        )


def dataset_size(dataset: Dataset) -> int | None:
    """Examples in one pass over an unbatched dataset; ``None`` when infinite or unknown."""
    cardinality = int(dataset.cardinality())
    return cardinality if cardinality >= 0 else None


def plan_dataset(
    dataset: Dataset,
    strategy: Strategy,
    *,
    global_batch: int | None = None,
    per_replica_batch: int | None = None,
    training: bool = True,
) -> BatchPlan:
    """The :class:`BatchPlan` for an unbatched dataset, its size read from its cardinality.

    Raises:
        BatchError: the dataset is already batched, or the plan is invalid
            (see :func:`~tfstrategy.plan_batch`).

    Example:
        >>> plan_dataset(tf.data.Dataset.range(1000), selection, global_batch=256).steps_per_epoch
        3
    """
    if not isinstance(dataset, tf().data.Dataset):
        raise BatchError(
            f"Received {type(dataset).__name__}; expected a tf.data.Dataset of single examples. "
            "Wrap arrays with tf.data.Dataset.from_tensor_slices((x, y))."
        )
    _refuse_batched(dataset)
    return plan_batch(
        strategy,
        global_batch=global_batch,
        per_replica_batch=per_replica_batch,
        dataset_size=dataset_size(dataset),
        drop_remainder=training,
    )


def prepare_dataset(
    data: Any | Callable[[Any], Any],
    strategy: Strategy,
    *,
    global_batch: int | None = None,
    per_replica_batch: int | None = None,
    plan: BatchPlan | None = None,
    training: bool = True,
    auto_shard: str | None = None,
) -> Any:
    """Batch, shard and prefetch a dataset for ``strategy``: the how-to's step 3.

    Args:
        data: a ``tf.data.Dataset`` of single examples, or a function taking a
            ``tf.distribute.InputContext`` and returning one (for per-worker
            pipelines; it should shard by ``input_context.input_pipeline_id``).
        strategy: a strategy or a :class:`~tfstrategy.Selection`.
        global_batch: examples per step across all replicas.
        per_replica_batch: or, examples per step on each replica.
        plan: a plan from :func:`plan_dataset` instead of the two above.
        training: drop the last partial batch (``True``), or keep it for
            validation. With ``plan=``, the plan's ``drop_remainder`` decides.
        auto_shard: override the shard policy: ``off``, ``data``, ``file`` or ``auto``.

    Returns:
        For a dataset, a ``tf.data.Dataset`` of global batches to pass to
        ``fit``. For a function, a distributed dataset of per-replica batches.

    Raises:
        BatchError: the data is already batched, or the batch plan is invalid.

    Example:
        >>> train_ds = prepare_dataset(make_train_dataset(), selection, global_batch=256)
        >>> val_ds = prepare_dataset(make_validation_dataset(), selection, global_batch=256, training=False)
    """
    strategy = getattr(strategy, "strategy", strategy)
    if callable(data) and not isinstance(data, tf().data.Dataset):
        return _prepare_from_function(data, strategy, global_batch, per_replica_batch, plan, training)
    if plan is None:
        plan = plan_dataset(data, strategy, global_batch=global_batch, per_replica_batch=per_replica_batch, training=training)
    else:
        _check_plan(plan, strategy, global_batch, per_replica_batch)
        _refuse_batched(data)
    options = tf().data.Options()
    options.experimental_distribute.auto_shard_policy = auto_shard_policy(
        strategy, data, auto_shard, keeps_partial_batch=not plan.drop_remainder
    )
    batched = data.batch(plan.global_batch, drop_remainder=plan.drop_remainder)
    return batched.with_options(options).prefetch(tf().data.AUTOTUNE)


def _check_plan(plan: BatchPlan, strategy: Strategy, global_batch: int | None, per_replica_batch: int | None) -> None:
    if global_batch is not None or per_replica_batch is not None:
        raise BatchError(
            f"Received plan= and global_batch={global_batch!r}/per_replica_batch={per_replica_batch!r}; expected "
            "one way of giving the batch. Pass either plan= or a batch size."
        )
    replicas = replicas_of(strategy)
    if plan.replicas != replicas:
        raise BatchError(
            f"Received a plan for {plan.replicas} replicas with a strategy of {replicas}; expected the same. "
            "Make the plan with this strategy: plan_dataset(dataset, strategy, global_batch=...)."
        )


def _require_one_argument(dataset_fn: Callable[..., object]) -> None:
    try:
        signature = inspect.signature(dataset_fn)
    except (TypeError, ValueError):  # a builtin or C function: let the call decide
        return
    try:
        signature.bind(None)
    except TypeError:
        name = getattr(dataset_fn, "__name__", type(dataset_fn).__name__)
        raise BatchError(
            f"Received a dataset function {name}{signature}; expected a function taking one argument, the "
            "tf.distribute.InputContext, e.g. def make_dataset(input_context): ... (or pass the tf.data.Dataset itself)."
        ) from None


def _prepare_from_function(
    dataset_fn: Callable[[Any], Any],
    strategy: Strategy,
    global_batch: int | None,
    per_replica_batch: int | None,
    plan: BatchPlan | None,
    training: bool,
) -> object:
    _require_one_argument(dataset_fn)
    if plan is None:
        plan = plan_batch(strategy, global_batch=global_batch, per_replica_batch=per_replica_batch, drop_remainder=training)
    else:
        _check_plan(plan, strategy, global_batch, per_replica_batch)

    def batched_fn(input_context: Any) -> Any:
        dataset = dataset_fn(input_context)
        if not isinstance(dataset, tf().data.Dataset):
            raise BatchError(
                f"Received a dataset function returning {type(dataset).__name__}; expected a tf.data.Dataset "
                "of single examples."
            )
        _refuse_batched(dataset)
        # Batch this pipeline's share of one global step first, so a partial
        # step is dropped as a whole, then split it into per-replica batches:
        # distribute_datasets_from_function hands each replica one element.
        replicas_here = input_context.num_replicas_in_sync // input_context.num_input_pipelines
        pipeline_batch = plan.per_replica_batch * replicas_here
        dataset = dataset.batch(pipeline_batch, drop_remainder=plan.drop_remainder)
        if replicas_here > 1:
            # With one replica per pipeline the batch already is the replica's:
            # a rebatch stage would change nothing and halved a small model's steps/s.
            dataset = dataset.rebatch(plan.per_replica_batch, drop_remainder=plan.drop_remainder)
        return dataset.prefetch(tf().data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(batched_fn)
