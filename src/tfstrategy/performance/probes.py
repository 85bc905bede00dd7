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
from typing import Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.performance.timing import alternating, mean_seconds, probe_count
from tfstrategy.training.no_trace import dataset_copy, pipeline_ops, skip_build_peek, snapshot
from tfstrategy.training.steps_per_execution import job_mean

#: The larger-K probe traces a new train function; it runs only once this much has been trained.
LARGER_K_AFTER_SECONDS = 30.0


def _allreduce(strategy: Any, model: Any, count: int) -> float:
    """Seconds an all-reduce of tensors shaped as the model's gradients adds to a call: one call with it minus one
    without. The first collective of a call absorbs the workers' skew in reaching it (measured: 20 ms against
    6 ms for the next one on a loaded machine), and a step pays it as well."""
    tf_ = tf()
    shapes = [(tuple(variable.shape), tf_.as_dtype(_compat.tf_variable(variable).dtype))
              for variable in model.trainable_variables]

    def call(reduce: bool) -> Any:
        def replica() -> Any:
            values = [tf_.zeros(shape, dtype) for shape, dtype in shapes]
            if reduce:
                values = tf_.distribute.get_replica_context().all_reduce(tf_.distribute.ReduceOp.SUM, values)
            return tf_.add_n([tf_.reduce_sum(tf_.cast(value, tf_.float32)) for value in values])

        return tf_.function(lambda: strategy.run(replica))

    timed = alternating({"reduce": call(True), "alone": call(False)}, count)
    return max(statistics.median(timed["reduce"]) - statistics.median(timed["alone"]), 0.0)


def probe(model: Any, dataset: Any, *, step: float, steps_per_execution: int, larger_k: int | None) -> dict[str, Any]:
    """Run the report's probes on ``model`` with a copy of ``dataset``; leave no trace. Returns Measurements' fields."""
    tf_ = tf()
    strategy = _compat.model_strategy(model) or tf_.distribute.get_strategy()
    started = time.perf_counter()
    found: dict[str, Any] = {"not_probed": {}}
    copy: Any = None
    no_copy: str | None = "no dataset given to the report"
    if dataset is not None:
        copy, no_copy = dataset_copy(dataset)
    replicas = int(strategy.num_replicas_in_sync)
    # Every worker runs the same number of each probe's collectives: counts from the job's mean step.
    (step,) = job_mean(strategy, [step])
    executions = probe_count(step * steps_per_execution, 3, 20)
    saved = snapshot(model, metrics=True)
    function: Any = getattr(model, "train_function", None)
    if function is None and no_copy is None:
        no_copy = "a custom loop: its input wait is timed directly"
    try:
        if no_copy is not None:
            found["not_probed"]["synthetic and input"] = no_copy
        else:
            found["pipeline_ops"] = pipeline_ops(copy)
            found["global_batch"] = _leading_dimension(next(iter(copy.take(1))))
            options = tf_.data.Options()
            options.experimental_distribute.auto_shard_policy = tf_.data.experimental.AutoShardPolicy.OFF
            single = copy.take(1).cache().repeat().with_options(options)
            synthetic = iter(strategy.experimental_distribute_dataset(single))
            calls = {"cached": lambda: function(synthetic)}
            if larger_k is not None:
                if not _compat.is_tf_keras_object(model):  # K > 1 on 2+ replicas needs tfstrategy's loop
                    from tfstrategy.patches import keras_steps_per_execution

                    keras_steps_per_execution.PATCH.apply()
                _compat.set_steps_per_execution(model, larger_k)
                model.make_train_function(force=True)
                larger = model.train_function
                calls["larger"] = lambda: larger(synthetic)
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
            batches = iter(strategy.experimental_distribute_dataset(copy.repeat().with_options(options)))
            on_data = alternating({"data": lambda: function(batches)}, executions)["data"]
            found["data_step"] = statistics.median(on_data) / steps_per_execution
            found["input_batch"] = mean_seconds(lambda: next(batches), probe_count(step, 10, 50))
            # Released here, so probe_seconds counts it: on 4 logical CPU replicas, releasing a distributed iterator
            # over a prefetched pipeline took 3-17 s (TensorFlow 2.21), more than the probes themselves.
            del synthetic, batches
        if replicas > 1:
            found["allreduce"] = _allreduce(strategy, model, probe_count(step, 3, 20))
    finally:
        if larger_k is not None:
            _compat.set_steps_per_execution(model, steps_per_execution)
        if function is not None:
            model.train_function = function
        saved.restore()
        skip_build_peek(model)
    if larger_k is None and no_copy is None:
        found["not_probed"]["larger K"] = (f"the job has trained under {LARGER_K_AFTER_SECONDS:.0f} s, or K is at its "
                                           "cap (a new train function would cost more than it tells)")
    if replicas == 1:
        found["not_probed"]["reduction"] = "one replica: nothing to reduce"
    found["probe_seconds"] = time.perf_counter() - started
    return found


def _leading_dimension(batch: Any) -> int | None:
    leading = tf().nest.flatten(batch)[0].shape
    return int(leading[0]) if leading.rank else None
