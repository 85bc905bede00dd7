"""The report's probes: short measurements at the report's time that leave training as it was.

:func:`probe` runs, on a copy of the job's data, a step on one cached batch
(the step without its input), then the same step on the data, the input
pipeline alone, an all-reduce of gradient-shaped tensors, and, on long jobs, a
step at a larger ``steps_per_execution``. Across workers every worker runs the
same probes, the same number of times (counts are agreed first).

The probes run real training steps, so they use
:mod:`tfstrategy.training.no_trace`: a snapshot of every state a step changes
(put back after), a copy of the dataset whose iteration leaves the original's
shuffle order alone, and, on the probed model, the skipped build peek (the
upstream crash after a dropped probe iterator: ``docs/reference/upstream-bugs.md``).
The report is opt-in (``--profile`` or the callback), and so is this.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.performance.timing import ProbePlan, alternating, mean_seconds
from tfstrategy.training.no_trace import dataset_copy, pipeline_batch, pipeline_ops, skip_build_peek, snapshot

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset, Model, Strategy

#: The larger-K probe traces a new train function; it runs only once this much has been trained.
LARGER_K_AFTER_SECONDS = 30.0


def _allreduce(strategy: Strategy, model: Model, count: int) -> float:
    """Seconds an all-reduce of tensors shaped as the model's gradients adds to a call: one call with it minus one
    without. The first collective of a call absorbs the workers' skew in reaching it (measured: 20 ms against
    6 ms for the next one on a loaded machine), and a step pays it as well."""
    tf_ = tf()
    shapes = [(tuple(variable.shape), tf_.as_dtype(_compat.tf_variable(variable).dtype))
              for variable in model.trainable_variables]

    def call(reduce: bool) -> Any:
        def replica() -> object:
            values = [tf_.zeros(shape, dtype) for shape, dtype in shapes]
            if reduce:
                values = tf_.distribute.get_replica_context().all_reduce(tf_.distribute.ReduceOp.SUM, values)
            return tf_.add_n([tf_.reduce_sum(tf_.cast(value, tf_.float32)) for value in values])

        return tf_.function(lambda: strategy.run(replica))

    timed = alternating({"reduce": call(True), "alone": call(False)}, count)
    return max(statistics.median(timed["reduce"]) - statistics.median(timed["alone"]), 0.0)


def probe(model: Model, dataset: Dataset | None, *, plan: ProbePlan, steps_per_execution: int,
          larger_k: int | None) -> dict[str, Any]:
    """Run the probes ``plan`` chose on ``model`` with a copy of ``dataset``; leave no trace.

    Returns Measurements' fields. ``plan`` was made from figures every worker agreed on, so every worker runs
    the same probes, the same number of times (their collectives match).
    """
    tf_ = tf()
    strategy = _compat.model_strategy(model) or tf_.distribute.get_strategy()
    started = time.perf_counter()
    found: dict[str, Any] = {"not_probed": {}}
    copy: Any = None
    no_copy: str | None = "no dataset given to the report"
    if dataset is not None:
        copy, no_copy = dataset_copy(dataset)
    function: Any = getattr(model, "train_function", None)
    if function is None and no_copy is None:
        no_copy = "a custom loop: its input wait is timed directly"
    if no_copy is None:  # cheap: read from the pipeline's graph
        found["pipeline_ops"] = pipeline_ops(copy)
        found["global_batch"] = pipeline_batch(copy)
    replicas = int(strategy.num_replicas_in_sync)
    run_input, run_reduction = no_copy is None and plan.input, replicas > 1 and plan.reduction
    larger_k = larger_k if plan.larger_k and run_input else None
    if run_input or run_reduction:
        saved = snapshot(model, metrics=True)
        try:
            if run_input:
                _input_probes(model, strategy, function, copy, plan, steps_per_execution, larger_k, found)
            if run_reduction:
                found["allreduce"] = _allreduce(strategy, model, plan.reduce_rounds)
        finally:
            if larger_k is not None:
                _compat.set_steps_per_execution(model, steps_per_execution)
            if function is not None:
                model.train_function = function
            saved.restore()
            skip_build_peek(model)
    _say_not_probed(found["not_probed"], plan, no_copy, replicas, larger_k)
    found["probe_seconds"] = time.perf_counter() - started
    return found


def _say_not_probed(not_probed: dict[str, str], plan: ProbePlan, no_copy: str | None, replicas: int,
                    larger_k: int | None) -> None:
    """Why each probe that did not run did not."""
    if no_copy is not None:
        not_probed["synthetic and input"] = no_copy
    elif not plan.input:
        not_probed["synthetic and input"] = plan.skipped.get("input", "left out")
    if "larger K" in plan.skipped:
        not_probed["larger K"] = plan.skipped["larger K"]
    elif larger_k is None and no_copy is None and plan.input:
        not_probed["larger K"] = (f"the job has trained under {LARGER_K_AFTER_SECONDS:.0f} s, or K is at its "
                                  "cap (a new train function would cost more than it tells)")
    if replicas == 1:
        not_probed["reduction"] = "one replica: nothing to reduce"
    elif not plan.reduction:
        not_probed["reduction"] = plan.skipped.get("reduction", "left out")


def _input_probes(model: Model, strategy: Strategy, function: Any, copy: Any, plan: ProbePlan, steps_per_execution: int,
                  larger_k: int | None, found: dict[str, Any]) -> None:
    """The step on one cached batch (and at the larger K), then on the data, then the input alone."""
    tf_ = tf()
    if found.get("global_batch") is None:  # not in the graph: one batch tells
        found["global_batch"] = _leading_dimension(next(iter(copy.take(1))))
    executions = plan.executions
    options = tf_.data.Options()
    options.experimental_distribute.auto_shard_policy = tf_.data.experimental.AutoShardPolicy.OFF
    single = copy.take(1).cache().repeat().with_options(options)
    # Held here and cleared at the end, so the probes' time counts their release.
    iterators = {"cached": iter(strategy.experimental_distribute_dataset(single))}
    calls = {"cached": lambda: function(iterators["cached"])}
    if larger_k is not None:
        if not _compat.is_tf_keras_object(model):  # K > 1 on 2+ replicas needs tfstrategy's loop
            from tfstrategy.patches import apply_patches, keras_steps_per_execution

            apply_patches(keras_steps_per_execution.PATCH.name)
        _compat.set_steps_per_execution(model, larger_k)
        model.make_train_function(force=True)
        larger = model.train_function
        calls["larger"] = lambda: larger(iterators["cached"])
    timed = alternating(calls, executions)
    found["synthetic"] = statistics.median(timed["cached"]) / steps_per_execution
    if larger_k is not None:
        # The fastest of each K for the dispatch: a neighbour's load only ever adds time.
        found["larger_k"] = (larger_k, min(timed["larger"]) / larger_k)
        found["synthetic_fastest"] = min(timed["cached"]) / steps_per_execution
    # Then the same step on the data, right after (the pipeline had not started, so the cached step ran
    # alone): the two see about the same load, and their difference is the time a step waits for input,
    # its pipeline competing with the step for the cores included.
    # With the cached copy's options, the data copy has its type: the train function traced for one runs
    # the other (a new trace on one worker only would shift the collectives' keys between workers).
    iterators["data"] = iter(strategy.experimental_distribute_dataset(copy.repeat().with_options(options)))
    on_data = alternating({"data": lambda: function(iterators["data"])}, executions)["data"]
    found["data_step"] = statistics.median(on_data) / steps_per_execution
    found["input_batch"] = mean_seconds(lambda: next(iterators["data"]), plan.input_batches)
    # Released here, so probe_seconds counts it: on 4 logical CPU replicas, releasing a distributed iterator
    # over a prefetched pipeline took 3-17 s (TensorFlow 2.21), more than the probes themselves.
    iterators.clear()


def _leading_dimension(batch: object) -> int | None:
    leading = tf().nest.flatten(batch)[0].shape
    return int(leading[0]) if leading.rank else None
