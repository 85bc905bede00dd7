"""The performance report of a running job: time its steps, probe at the report's time, print and write it.

Three pieces:

- :class:`StepTimes` times the job's own steps as it trains: each execution of
  the train function (K steps), the time between executions (Keras' loop,
  callbacks), and in a custom loop the time spent waiting for ``next()``.
  Two clock readings and an append per execution, nothing that touches
  TensorFlow (Keras 3 itself converts the logs at every step once any batch-end
  callback is present; measured free on the CPU: benchmarks/README.md).
- :func:`probe` runs, at the report's time, short measurements on a copy of
  the job's data (:mod:`tfstrategy.training.no_trace`), and puts back every
  state they changed, so training goes on exactly as it would have: a step on
  one cached batch (the step without its input), then the same step on the
  data, the input pipeline alone, an all-reduce of gradient-shaped tensors,
  and, on long jobs, a step at a larger ``steps_per_execution``. Across workers every worker runs the same probes,
  the same number of times (counts are agreed first).
- :class:`Tracker` decides when a report is due (a model's first ``fit``, then
  every ``every_minutes``; agreed across workers), builds it
  (:func:`tfstrategy.performance.verdict.verdict`), prints it and writes
  ``worker-<i>.json`` and ``worker-<i>.txt`` into its directory.

:func:`performance_report` is the Keras callback; ``make_train_step(...,
report=...)`` and :meth:`Tracker.steps` serve custom loops.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.performance.verdict import Measurements, Report, verdict
from tfstrategy.settings import ENV_PROFILE, ENV_PROFILE_EVERY
from tfstrategy.training.no_trace import dataset_copy, pipeline_ops, skip_build_peek, snapshot
from tfstrategy.training.steps_per_execution import job_mean

__all__ = ["StepTimes", "Tracker", "add_report", "performance_report", "probe", "profile_environment",
           "tracker_from_environment"]

#: A report every this many minutes on long jobs (at an epoch's end), besides the first fit's.
EVERY_MINUTES = 10.0
#: The larger-K probe traces a new train function; it runs only once this much has been trained.
LARGER_K_AFTER_SECONDS = 30.0
#: Each probe aims at this many seconds (within its counts' bounds).
PROBE_SECONDS = 0.25


@dataclass
class StepTimes:
    """The job's own steps since the last report: per execution, its call, the gap before it, its steps."""

    calls: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    _begun: float | None = None
    _last_end: float | None = None
    _warm_up: bool = True

    def new_run(self, warm_up: bool = True) -> None:
        """A new ``fit`` (or loop); with ``warm_up`` its first execution traces, so it is not timed."""
        self._warm_up, self._begun, self._last_end = warm_up, None, None

    def pause(self) -> None:
        """An epoch's end: the time until the next execution (validation, epoch callbacks) is not a step's."""
        self._begun, self._last_end = None, None

    def begin(self, at: float | None = None, *, after_wait: bool = False) -> None:
        """An execution begins (``at``: when); ``after_wait``: the time since the last one was a timed wait, no gap."""
        self._begun = time.perf_counter() if at is None else at
        if after_wait:
            self._last_end = self._begun

    def end(self, steps: int, wait: float | None = None) -> None:
        now = time.perf_counter()
        begun, last_end = self._begun, self._last_end
        self._begun, self._last_end = None, now
        if begun is None or steps < 1:
            return
        if self._warm_up:
            self._warm_up = False
            return
        self.calls.append(now - begun)
        self.gaps.append(begun - last_end if last_end is not None else 0.0)
        self.steps.append(steps)
        if wait is not None:
            self.waits.append(wait)

    def timed_steps(self) -> int:
        return sum(self.steps)

    def seconds(self) -> float:
        return sum(self.calls) + sum(self.gaps) + sum(self.waits)

    def clear(self) -> None:
        for timings in (self.calls, self.gaps, self.waits, self.steps):
            timings.clear()


def _count(seconds_each: float, low: int, high: int) -> int:
    if seconds_each <= 0:
        return high
    return max(low, min(high, math.ceil(PROBE_SECONDS / seconds_each)))


def _timed(call: Any, count: int) -> float:
    """The median seconds of ``count`` calls (after one untimed call)."""
    call()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _throughput(call: Any, count: int) -> float:
    """Mean seconds of ``count`` calls (after one untimed call): a rate, so what a prefetch buffer held when the
    timing began is spread over all of them instead of making the median. A count, not a duration: on several
    workers a distributed iterator's ``next`` can be a collective, which every worker must call as often."""
    call()
    start = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - start) / count


def _alternating(calls: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call's ``rounds`` calls, one of each per round, the order swapped each round."""
    for call in calls.values():
        call()  # a new function, or a new input signature, traces at its first call
    order = list(calls)
    timed: dict[str, list[float]] = {name: [] for name in order}
    for round_ in range(rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            calls[name]()
            timed[name].append(time.perf_counter() - start)
    return timed


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

    timed = _alternating({"reduce": call(True), "alone": call(False)}, count)
    return max(statistics.median(timed["reduce"]) - statistics.median(timed["alone"]), 0.0)


def probe(model: Any, dataset: Any, *, step: float, steps_per_execution: int, larger_k: int | None) -> dict[str, Any]:
    """Run the report's probes on ``model`` with a copy of ``dataset``; leave no trace. Returns Measurements' fields."""
    tf_ = tf()
    strategy = _compat.model_strategy(model) or tf_.distribute.get_strategy()
    started = time.perf_counter()
    found: dict[str, Any] = {"not_probed": {}}
    copy, no_copy = dataset_copy(dataset) if dataset is not None else (None, "no dataset given to the report")
    replicas = int(strategy.num_replicas_in_sync)
    # Every worker runs the same number of each probe's collectives: counts from the job's mean step.
    (step,) = job_mean(strategy, [step])
    executions = _count(step * steps_per_execution, 3, 20)
    saved = snapshot(model, metrics=True)
    function = getattr(model, "train_function", None)
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
            timed = _alternating(calls, executions)
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
            on_data = _alternating({"data": lambda: function(batches)}, executions)["data"]
            found["data_step"] = statistics.median(on_data) / steps_per_execution
            found["input_batch"] = _throughput(lambda: next(batches), _count(step, 10, 50))
            # Released here, so probe_seconds counts it: on 4 logical CPU replicas, releasing a distributed iterator
            # over a prefetched pipeline took 3-17 s (TensorFlow 2.21), more than the probes themselves.
            del synthetic, batches
        if replicas > 1:
            found["allreduce"] = _allreduce(strategy, model, _count(step, 3, 20))
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


def _worker(strategy: Any) -> tuple[int, int]:
    if not _compat.in_multi_worker_mode(strategy):
        return 0, 1
    resolver = strategy.cluster_resolver
    local = max(1, len(strategy.extended.worker_devices))
    return int(resolver.task_id or 0), max(1, int(strategy.num_replicas_in_sync) // local)


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else (os.cpu_count() or 1)


def _leading_dimension(batch: Any) -> int | None:
    leading = tf().nest.flatten(batch)[0].shape
    return int(leading[0]) if leading.rank else None


class Tracker:
    """When a report is due, and making it: one per model (kept on it), shared by each ``fit``'s callback."""

    def __init__(self, *, every_minutes: float | None = EVERY_MINUTES, directory: str | os.PathLike[str] | None = None,
                 larger_k: bool | None = None) -> None:
        if every_minutes is not None and (isinstance(every_minutes, bool) or not isinstance(every_minutes, (int, float))
                                          or not every_minutes > 0):
            raise TrainingError(f"Received every_minutes={every_minutes!r}; expected a number of minutes above 0, "
                                "or None for a report at the first fit's end only.")
        self.every_minutes = every_minutes
        self.directory = Path(directory) if directory is not None else None
        self.larger_k = larger_k
        self.times = StepTimes()
        self.reports: list[Report] = []
        self._trained = 0.0
        self._last_report = time.monotonic()
        #: The train function timed last (a new one traces at its first execution).
        self.function: Any = None
        #: A custom loop's last batch (:meth:`steps`), for its step without input.
        self.last_batch: Any = None

    def due(self, strategy: Any, *, final: bool) -> bool:
        """A model's first report at a fit's end, then once ``every_minutes`` passed; agreed by all workers.

        Any worker due makes all due (they run the probes' collectives together), once every worker has timed a step.
        """
        if self.every_minutes is None and self.reports:
            return False
        overdue = self.every_minutes is not None and time.monotonic() - self._last_report >= 60 * self.every_minutes
        first = final and not self.reports
        wanted, timed = job_mean(strategy, [float(first or overdue), float(self.times.timed_steps() > 0)])
        return wanted > 0 and timed == 1

    def report(self, model: Any, dataset: Any, *, global_batch: int | None = None,
               steps_per_execution: int | None = None, cap: int | None = None, step_function: Any = None) -> Report:
        """Probe, build the report from the steps timed since the last one, print it and write its files.

        ``step_function``: a custom loop's step; called on its last batch, again and again, it is the
        step without input.
        """
        tf_ = tf()
        strategy = _compat.model_strategy(model) or tf_.distribute.get_strategy()
        times = self.times
        if times.timed_steps() == 0:
            raise TrainingError("Received a report request with no step timed; expected due() to say it was due.")
        k = steps_per_execution or _compat.steps_per_execution(model)
        per_step = [call / steps for call, steps in zip(times.calls, times.steps)]
        (step,) = job_mean(strategy, [statistics.median(per_step)])
        self._trained += times.seconds()
        (trained,) = job_mean(strategy, [self._trained])
        larger = None
        wanted = self.larger_k if self.larger_k is not None else trained >= LARGER_K_AFTER_SECONDS
        if wanted and dataset is not None and getattr(model, "train_function", None) is not None:
            larger = min(4 * k, cap) if cap is not None else 4 * k
            larger = larger if larger > k else None
        probes = probe(model, None if times.waits else dataset, step=step, steps_per_execution=k, larger_k=larger)
        if times.waits:  # a custom loop: the wait for each batch was timed directly
            probes["waited"] = statistics.median(w / s for w, s in zip(times.waits, times.steps))
            probes["not_probed"].pop("synthetic and input", None)
            if step_function is not None and self.last_batch is not None:
                started, batch = time.perf_counter(), self.last_batch
                saved = snapshot(model, metrics=True)
                try:
                    probes["synthetic"] = _timed(lambda: step_function(batch), _count(step, 3, 20))
                finally:
                    saved.restore()
                probes["probe_seconds"] += time.perf_counter() - started
        seen_batch = probes.pop("global_batch", None)  # read from the probes' copy of the data
        worker, workers = _worker(strategy)
        total = [(c + g + w) / s for c, g, w, s in zip(times.calls, times.gaps, times.waits or [0.0] * len(times.calls),
                                                       times.steps)]
        measurements = Measurements(
            step_seconds=tuple(total), steps=times.timed_steps(), seconds=times.seconds(),
            global_batch=global_batch or seen_batch or 0,
            replicas=int(strategy.num_replicas_in_sync), workers=workers, worker=worker, steps_per_execution=k,
            outside=statistics.median(g / s for g, s in zip(times.gaps, times.steps)), cores=_cores(), **probes)
        result = verdict(measurements)
        self.reports.append(result)
        self.times.clear()
        self._last_report = time.monotonic()
        self._write(result)
        return result

    def _write(self, result: Report) -> None:
        text = result.text()
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f"worker-{result.measurements.worker}"
            (self.directory / f"{name}.json").write_text(result.json(), encoding="utf-8")
            (self.directory / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
            text += f"\n  written to {self.directory / name}.json (and .txt)"
        print(text, file=sys.stderr, flush=True)

    def steps(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Time a custom loop: ``for batch in tracker.steps(dataset): step(batch)``.

        The wait for each ``next()`` is input; the time until the loop asks for the next batch is the step.
        """
        self.times.new_run()
        iterator = iter(batches)
        while True:
            asked = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self.times.pause()
                return
            got = time.perf_counter()
            self.times.begin(got, after_wait=True)
            self.last_batch = batch
            yield batch
            self.times.end(1, wait=got - asked)


_ATTRIBUTE = "_tfstrategy_performance"


def tracker_for(model: Any, **settings: Any) -> Tracker:
    """The model's :class:`Tracker`, made at its first report callback (so one report covers several fits)."""
    found = getattr(model, _ATTRIBUTE, None)
    if found is None:
        found = Tracker(**settings)
        object.__setattr__(model, _ATTRIBUTE, found)  # not a tracked Keras attribute
    return found


@functools.lru_cache(maxsize=2)
def _callback_class(base: type) -> type:
    class PerformanceReport(base):  # type: ignore[misc,valid-type]
        """Keras callback: time each execution and report where a step's time goes (tfstrategy)."""

        # Never asks for the logs as numbers (tf_keras honours this; Keras 3.15 converts them anyway
        # once a batch-end hook exists); it counts the steps of each execution, so K > 1 is no
        # reason to cap steps_per_execution.
        _supports_tf_logs = True
        _tfstrategy_execution_aware = True

        def __init__(self, dataset: Any = None, *, every_minutes: float | None = EVERY_MINUTES,
                     directory: str | os.PathLike[str] | None = None, larger_k: bool | None = None,
                     global_batch: int | None = None) -> None:
            super().__init__()
            self.dataset, self.global_batch = dataset, global_batch
            self.settings = {"every_minutes": every_minutes, "directory": directory, "larger_k": larger_k}
            Tracker(**self.settings)  # validates now, where the user passed them
            self.tracker: Tracker | None = None
            self._first_batch = 0

        def set_model(self, model: Any) -> None:
            super().set_model(model)
            self.tracker = tracker_for(model, **self.settings)

        def _strategy(self) -> Any:
            return _compat.model_strategy(self.model) or tf().distribute.get_strategy()

        def on_train_begin(self, logs: Any = None) -> None:
            # A train function made for this fit traces at its first execution: that one is not timed.
            function = getattr(self.model, "train_function", None)
            self.tracker.times.new_run(warm_up=function is None or function is not self.tracker.function)
            self.tracker.function = function

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.tracker.times.pause()

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._first_batch = batch
            self.tracker.times.begin()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.tracker.times.end(batch - self._first_batch + 1)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.tracker.times.pause()
            if self.tracker.reports and self.tracker.due(self._strategy(), final=False):
                self._report()

        def on_train_end(self, logs: Any = None) -> None:
            if self.tracker.due(self._strategy(), final=True):
                self._report()

        def _report(self) -> None:
            cap = self.params.get("steps") if isinstance(getattr(self, "params", None), dict) else None
            self.tracker.report(self.model, self.dataset, global_batch=self.global_batch,
                                cap=int(cap) if cap else None)

    return PerformanceReport


def performance_report(dataset: Any = None, *, every_minutes: float | None = EVERY_MINUTES,
                       directory: str | os.PathLike[str] | None = None, larger_k: bool | None = None,
                       global_batch: int | None = None) -> Any:
    """A Keras callback that reports where each step's time goes: input, reduction, dispatch, compute.

    At the end of the model's first ``fit`` (and at an epoch's end every
    ``every_minutes`` after) it prints, per worker, examples/s, the step's
    median and p90, each part's share, the bottleneck and one or two
    recommendations with their expected gain; with ``directory``, it also
    writes ``worker-<i>.json`` and ``.txt`` there. Its probes run on a copy of
    ``dataset`` and leave the model and the data as they were.

    Args:
        dataset: the dataset ``fit`` trains on (for the probes of input and of a step without it);
            without it the report cannot split input from compute.
        every_minutes: minutes between reports on long jobs; ``None``: the first fit's only.
        directory: where to write the JSON and text; ``None``: print only.
        larger_k: probe a larger ``steps_per_execution`` (traces one more train function);
            default: once the job has trained 30 s.
        global_batch: the examples per step; default: read from the dataset's first batch.

    Example:
        >>> model.fit(train_ds, epochs=5, callbacks=[tfstrategy.performance_report(train_ds)])
    """
    return _callback_class(tf().keras.callbacks.Callback)(dataset, every_minutes=every_minutes, directory=directory,
                                                          larger_k=larger_k, global_batch=global_batch)


def profile_environment(profile: bool, directory: str | os.PathLike[str], every_minutes: float) -> dict[str, str]:
    """``TFSTRATEGY_PROFILE`` and ``TFSTRATEGY_PROFILE_EVERY`` for ``--profile`` (empty without it), validated.

    Raises:
        TrainingError: minutes not above 0, or a directory that is an existing file.
    """
    if not profile:
        return {}
    if isinstance(every_minutes, bool) or not isinstance(every_minutes, (int, float)) or not every_minutes > 0:
        raise TrainingError(f"Received --profile-every {every_minutes!r}; expected a number of minutes above 0, "
                            "e.g. --profile-every 10.")
    path = Path(directory).expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise TrainingError(f"Received --profile-dir {str(directory)!r}, which is a file; expected a directory "
                            "(made if missing) for the reports' worker-<i>.json. Name another one.")
    return {ENV_PROFILE: str(path), ENV_PROFILE_EVERY: f"{every_minutes:g}"}


def add_report(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], settings: dict[str, Any]) -> None:
    """Put a report callback, on fit's own data, into ``fit``'s keyword arguments (the hook's step)."""
    from tfstrategy.training.steps_per_execution import as_dataset

    callbacks = list(kwargs.get("callbacks") or [])
    if any(getattr(callback, "_tfstrategy_execution_aware", False) and type(callback).__name__ == "PerformanceReport"
           for callback in callbacks):
        return
    data = args[0] if args else kwargs.get("x")
    labels = args[1] if len(args) > 1 else kwargs.get("y")
    batch_size = args[2] if len(args) > 2 else kwargs.get("batch_size")
    keras = _compat.keras_for(model)
    callbacks.append(_callback_class(keras.callbacks.Callback)(as_dataset(data, labels, batch_size), **settings))
    kwargs["callbacks"] = callbacks


def tracker_from_environment(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The report's settings from ``TFSTRATEGY_PROFILE`` (its directory) and ``TFSTRATEGY_PROFILE_EVERY``, or None."""
    env = dict(os.environ if env is None else env)
    directory = (env.get(ENV_PROFILE) or "").strip()
    if not directory or directory.lower() == "off":
        return None
    every = (env.get(ENV_PROFILE_EVERY) or "").strip()
    try:
        minutes = float(every) if every else EVERY_MINUTES
    except ValueError:
        minutes = -1.0
    if not minutes > 0:
        raise TrainingError(f"Received {ENV_PROFILE_EVERY}={every!r}; expected a number of minutes above 0 "
                            "(tfstrategy run/launch --profile-every).")
    return {"directory": directory, "every_minutes": minutes}
