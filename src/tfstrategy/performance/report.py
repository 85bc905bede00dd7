"""The performance report of a running job: when it is due, making it, printing and writing it.

It rests on three modules:

- :mod:`~tfstrategy.performance.timing`: :class:`StepTimes` times the job's
  own steps as it trains, and the helpers that time the probes' calls.
- :mod:`~tfstrategy.performance.probes`: :func:`probe` runs, at the report's
  time, short measurements on a copy of the job's data and puts back every
  state they changed.
- :mod:`~tfstrategy.performance.verdict`: the shares, the bottleneck and the
  recommendations (pure).

:class:`Tracker` decides when a report is due (a model's first ``fit``, then
every ``every_minutes``; agreed across workers), builds it, prints it and
writes ``worker-<i>.json`` and ``worker-<i>.txt`` into its directory.
:func:`performance_report` is the Keras callback; ``make_train_step(...,
report=...)`` and :meth:`Tracker.steps` serve custom loops. The ``--profile``
variables are read and made in :mod:`~tfstrategy.performance.environment`,
which imports none of the rest, so a process without ``--profile`` loads none of this.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypedDict

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.performance.environment import EVERY_MINUTES, profile_environment, tracker_from_environment
from tfstrategy.performance.probes import LARGER_K_AFTER_SECONDS, probe
from tfstrategy.performance.timing import StepTimes, median_seconds, probe_count
from tfstrategy.performance.verdict import Measurements, Report, verdict
from tfstrategy.training.no_trace import snapshot
from tfstrategy.training.steps_per_execution import job_mean

__all__ = ["StepTimes", "Tracker", "add_report", "performance_report", "probe", "profile_environment",
           "tracker_from_environment"]


def _worker(strategy: Any) -> tuple[int, int]:
    if not _compat.in_multi_worker_mode(strategy):
        return 0, 1
    resolver = strategy.cluster_resolver
    local = max(1, len(strategy.extended.worker_devices))
    return int(resolver.task_id or 0), max(1, int(strategy.num_replicas_in_sync) // local)


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else (os.cpu_count() or 1)


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
                    probes["synthetic"] = median_seconds(lambda: step_function(batch), probe_count(step, 3, 20))
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


class _Settings(TypedDict):
    """A :class:`Tracker`'s keyword arguments, as a report callback keeps them."""

    every_minutes: float | None
    directory: str | os.PathLike[str] | None
    larger_k: bool | None


def tracker_for(model: Any, **settings: Any) -> Tracker:
    """The model's :class:`Tracker`, made at its first report callback (so one report covers several fits)."""
    found = getattr(model, _ATTRIBUTE, None)
    if found is None:
        found = Tracker(**settings)
        object.__setattr__(model, _ATTRIBUTE, found)  # not a tracked Keras attribute
    return found


@functools.lru_cache(maxsize=2)
def _callback_class(base: type) -> type:
    class PerformanceReport(base):
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
            self.settings = _Settings(every_minutes=every_minutes, directory=directory, larger_k=larger_k)
            # Made now to validate the settings where the user passed them; the model's own replaces it.
            self.tracker = Tracker(**self.settings)
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
