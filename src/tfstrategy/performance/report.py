"""The performance report of a running job: when it is due, making it, printing and writing it.

It rests on these modules:

- :mod:`~tfstrategy.performance.timing`: :class:`StepTimes` times the job's
  own steps as it trains, and the helpers that time the probes' calls.
- :mod:`~tfstrategy.performance.probes`: :func:`probe` runs, at the report's
  time, short measurements on a copy of the job's data and puts back every
  state they changed.
- :mod:`~tfstrategy.performance.verdict`: the shares, the bottleneck and the
  recommendations (pure).
- :mod:`~tfstrategy.performance.job`, :mod:`~tfstrategy.performance.picture`:
  every worker's figures made one job report, and its picture (pure).
- :mod:`~tfstrategy.performance.sampler`, :mod:`~tfstrategy.performance.evidence`:
  free gauges read around each timed step (CPU time; stack samples of the
  user's input and ``tf.py_function`` s, the ledger's under ``launch``), and
  what they conclude when the probes do not fit their budget (pure).

:class:`Tracker` decides when a report is due (a model's first ``fit``, then
every ``every_minutes``; agreed across workers), plans the probes within
``probe_share`` of the time trained, builds the worker's report, gathers every
worker's figures (one all-gather, at the report's time) into the job's report;
worker 0 prints it and writes ``report.txt``, ``report.json`` and
``report.html`` into its directory, and each worker its ``worker-<i>.json``.
:func:`performance_report` is the Keras callback; ``make_train_step(...,
report=...)`` and :meth:`Tracker.steps` serve custom loops. The ``--profile``
variables are read and made in :mod:`~tfstrategy.performance.environment`,
which imports none of the rest, so a process without ``--profile`` loads none of this.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from tfstrategy import _compat
from tfstrategy._tf import tf
from tfstrategy.errors import TrainingError
from tfstrategy.performance.environment import (
    EVERY_MINUTES,
    PROBE_SHARE,
    profile_environment,
    tracker_from_environment,
    valid_probe_share,
)
from tfstrategy.performance.job import JobReport, combine, figures_of, figures_row, from_row
from tfstrategy.performance.picture import html
from tfstrategy.performance.probes import LARGER_K_AFTER_SECONDS, probe
from tfstrategy.performance.sampler import StackSampler, ledger_gauges
from tfstrategy.performance.timing import ProbePlan, StepTimes, median_seconds, plan_probes
from tfstrategy.performance.verdict import Measurements, Report, verdict
from tfstrategy.settings import PROFILE_PROBES
from tfstrategy.state.registry import RUNTIME, Attachments
from tfstrategy.training.no_trace import snapshot
from tfstrategy.training.steps_per_execution import job_mean

if TYPE_CHECKING:
    from tfstrategy._protocols import Dataset, Logs, Model, Strategy

__all__ = ["StepTimes", "Tracker", "add_report", "performance_report", "probe", "profile_environment",
           "tracker_from_environment"]


def _worker(strategy: Strategy) -> tuple[int, int]:
    if not _compat.in_multi_worker_mode(strategy):
        return 0, 1
    resolver = strategy.cluster_resolver
    local = max(1, len(strategy.extended.worker_devices))
    return int(resolver.task_id or 0), max(1, int(strategy.num_replicas_in_sync) // local)


def _local_replicas(strategy: Strategy) -> int:
    return max(1, len(strategy.extended.worker_devices))


def gather_rows(strategy: Strategy, row: list[float]) -> list[list[float]]:
    """Every worker's ``row``, in worker order (an all-gather: one all-reduce of a table where each worker fills
    its own line; NaN travels as a mask). One process: its own row."""
    if not _compat.in_multi_worker_mode(strategy):
        return [row]
    tf_ = tf()
    worker, workers = _worker(strategy)
    local, width = _local_replicas(strategy), len(row)
    table = [0.0] * (workers * 2 * width)
    line = [0.0 if value != value else value for value in row] + [float(value != value) for value in row]
    table[worker * 2 * width:(worker + 1) * 2 * width] = line
    mine, nothing = tf_.constant(table, tf_.float64), tf_.zeros([len(table)], tf_.float64)
    per_replica = strategy.experimental_distribute_values_from_function(
        lambda context: mine if context.replica_id_in_sync_group % local == 0 else nothing)
    summed = [float(value) for value in strategy.reduce(tf_.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()]
    rows = []
    for index in range(workers):
        values, missing = (summed[(2 * index + half) * width:(2 * index + half + 1) * width] for half in (0, 1))
        rows.append([float("nan") if gone else value for value, gone in zip(values, missing)])
    return rows


def _accelerators(strategy: Strategy) -> bool:
    """Whether the replicas are GPUs or TPUs (device names)."""
    devices = getattr(strategy.extended, "worker_devices", ()) or ()
    return any(kind in str(device).upper() for device in devices for kind in ("GPU", "TPU"))


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else (os.cpu_count() or 1)


def _probe_share(given: float | None) -> float:
    """The argument, else ``TFSTRATEGY_PROFILE_PROBES``, else :data:`PROBE_SHARE` (checked)."""
    if given is not None:
        return valid_probe_share(given)
    variable = PROFILE_PROBES.text(os.environ)
    return valid_probe_share(variable, PROFILE_PROBES.name) if variable else PROBE_SHARE


class Tracker:
    """When a report is due, and making it: one per model (kept for it by the process runtime), shared by each ``fit``'s callback."""

    def __init__(self, *, every_minutes: float | None = EVERY_MINUTES, directory: str | os.PathLike[str] | None = None,
                 larger_k: bool | None = None, probe_share: float | None = None) -> None:
        self.probe_share = _probe_share(probe_share)
        if every_minutes is not None and (isinstance(every_minutes, bool) or not isinstance(every_minutes, (int, float))
                                          or not every_minutes > 0):
            raise TrainingError(f"Received every_minutes={every_minutes!r}; expected a number of minutes above 0, "
                                "or None for a report at the first fit's end only.")
        self.every_minutes = every_minutes
        self.directory = Path(directory) if directory is not None else None
        self.larger_k = larger_k
        self.times = StepTimes()
        #: This worker's reports, and the job's (every worker has them; worker 0 prints and writes them).
        self.reports: list[Report] = []
        self.job_reports: list[JobReport] = []
        self._trained = 0.0
        self._last_report = time.monotonic()
        #: The train function timed last (a new one traces at its first execution).
        self.function: Any = None
        #: A custom loop's last batch (:meth:`steps`), for its step without input.
        self.last_batch: Any = None
        #: The report's own stack samples, while a fit runs in a process that keeps no ledger.
        self.sampler: StackSampler | None = None

    def start_gauges(self) -> None:
        """Read the free gauges at each timed step: the ledger's samples if this worker keeps one, else our own."""
        gauges = ledger_gauges()
        if gauges is None:
            self.sampler = self.sampler or StackSampler()
            self.sampler.start()
            gauges = self.sampler.gauges
        self.times.gauges = gauges

    def stop_gauges(self) -> None:
        """Stop the report's own sampling (the sums read so far stay with the step times)."""
        if self.sampler is not None:
            self.sampler.stop()

    def due(self, strategy: Strategy, *, final: bool) -> bool:
        """A model's first report at a fit's end, then once ``every_minutes`` passed; agreed by all workers.

        Any worker due makes all due (they run the probes' collectives together), once every worker has timed a step.
        """
        if self.every_minutes is None and self.reports:
            return False
        overdue = self.every_minutes is not None and time.monotonic() - self._last_report >= 60 * self.every_minutes
        first = final and not self.reports
        wanted, timed = job_mean(strategy, [float(first or overdue), float(self.times.timed_steps() > 0)])
        return wanted > 0 and timed == 1

    def report(self, model: Model, dataset: Dataset | None, *, global_batch: int | None = None,
               steps_per_execution: int | None = None, cap: int | None = None, step_function: object = None) -> Report:
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
        self._trained += times.seconds()
        # Every worker plans the same probes (their collectives must match): from figures they all agreed on.
        step, trained, since, warm_up = job_mean(strategy, [statistics.median(per_step), self._trained,
                                                            times.seconds(), times.warm_up_seconds])
        larger = None
        wanted = self.larger_k if self.larger_k is not None else trained >= LARGER_K_AFTER_SECONDS
        if wanted and dataset is not None and getattr(model, "train_function", None) is not None:
            larger = min(4 * k, cap) if cap is not None else 4 * k
            larger = larger if larger > k else None
        custom = bool(times.waits)  # a custom loop: the wait for each batch was timed directly
        plan = plan_probes(trained=since, share=self.probe_share, step=step, steps_per_execution=k, setup=warm_up,
                           input_setups=0 if custom else 3,
                           input_wanted=step_function is not None if custom else dataset is not None,
                           reduction_wanted=int(strategy.num_replicas_in_sync) > 1, larger_k_wanted=larger is not None)
        probes = probe(model, None if custom else dataset, plan=plan, steps_per_execution=k, larger_k=larger)
        if custom:
            self._probe_custom_loop(model, probes, plan, step_function)
        seen_batch = probes.pop("global_batch", None)  # read from the probes' copy of the data
        worker, workers = _worker(strategy)
        cpu, sampled_input, sampled_py_function = times.per_step()
        total = [(c + g + w) / s for c, g, w, s in zip(times.calls, times.gaps, times.waits or [0.0] * len(times.calls),
                                                       times.steps)]
        measurements = Measurements(
            step_seconds=tuple(total), steps=times.timed_steps(), seconds=times.seconds(),
            global_batch=global_batch or seen_batch or 0,
            replicas=int(strategy.num_replicas_in_sync), workers=workers, worker=worker, steps_per_execution=k,
            outside=statistics.median(g / s for g, s in zip(times.gaps, times.steps)), cores=_cores(),
            probes_need_share=plan.needed_share, cpu_seconds=cpu, sampled_input=sampled_input,
            sampled_py_function=sampled_py_function, accelerators=_accelerators(strategy),
            load_average=_load_average(),
            epoch_seconds=times.epoch_seconds or None, epoch_steps=times.epoch_steps or None, **probes)
        result = verdict(measurements)
        rows = gather_rows(strategy, figures_row(figures_of(result, _local_replicas(strategy))))
        job = combine([from_row(row, measurements) for row in rows], probe_share=self.probe_share)
        self.reports.append(result)
        self.job_reports.append(job)
        self.times.clear()
        self._last_report = time.monotonic()
        self._write(result, job)
        return result

    def _probe_custom_loop(self, model: Model, probes: dict[str, Any], plan: ProbePlan, step_function: Any) -> None:
        """A custom loop's probes: its timed wait, and its step on its last batch, again and again (no input)."""
        times = self.times
        probes["waited"] = statistics.median(w / s for w, s in zip(times.waits, times.steps))
        probes["not_probed"].pop("synthetic and input", None)
        if step_function is None or self.last_batch is None:
            return
        if not plan.input:
            probes["not_probed"]["step without input"] = plan.skipped.get("input", "left out")
            return
        started, batch = time.perf_counter(), self.last_batch
        saved = snapshot(model, metrics=True)
        try:
            probes["synthetic"] = median_seconds(lambda: step_function(batch), plan.executions)
        finally:
            saved.restore()
        probes["probe_seconds"] += time.perf_counter() - started

    def _write(self, result: Report, job: JobReport) -> None:
        """Worker 0 prints the job's report and writes report.txt, .json and .html; each worker its worker-<i>.json."""
        worker = result.measurements.worker
        text = job.text()
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            own = result.as_dict() | {"job_examples_per_second": job.examples_per_second}
            (self.directory / f"worker-{worker}.json").write_text(json.dumps(own, indent=2) + "\n", encoding="utf-8")
            if worker == 0:
                (self.directory / "report.json").write_text(job.json(), encoding="utf-8")
                (self.directory / "report.txt").write_text(text + "\n", encoding="utf-8")
                (self.directory / "report.html").write_text(html(job), encoding="utf-8")
                text += (f"\n  written to {self.directory / 'report.html'} (a picture; report.txt, report.json, "
                         "and each worker's worker-<i>.json beside it)")
        if worker == 0:
            print(text, file=sys.stderr, flush=True)

    def steps(self, batches: Iterable[object]) -> Iterator[object]:
        """Time a custom loop: ``for batch in tracker.steps(dataset): step(batch)``.

        The wait for each ``next()`` is input; the time until the loop asks for the next batch is the step.
        """
        self.times.new_run()
        self.times.epoch_begins()
        self.start_gauges()
        iterator = iter(batches)
        try:
            while True:
                asked = time.perf_counter()
                try:
                    batch = next(iterator)
                except StopIteration:
                    self.times.pause()
                    self.times.epoch_ends()
                    return
                got = time.perf_counter()
                self.times.begin(got, after_wait=True)
                self.last_batch = batch
                yield batch
                self.times.end(1, wait=got - asked)
        finally:
            self.stop_gauges()


#: Each model's tracker, held by the process runtime (``tfstrategy.reset()`` forgets it), not on the model.
TRACKERS: Attachments[Tracker] = RUNTIME.attachments("performance_tracker")


class _Settings(TypedDict):
    """A :class:`Tracker`'s keyword arguments, as a report callback keeps them."""

    every_minutes: float | None
    directory: str | os.PathLike[str] | None
    larger_k: bool | None
    probe_share: float | None


def tracker_for(model: Model, **settings: Any) -> Tracker:
    """The model's :class:`Tracker`, made at its first report callback (so one report covers several fits)."""
    found = TRACKERS.get(model)
    if found is None:
        found = Tracker(**settings)
        TRACKERS.set(model, found)
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

        def __init__(self, dataset: Dataset | None = None, *, every_minutes: float | None = EVERY_MINUTES,
                     directory: str | os.PathLike[str] | None = None, larger_k: bool | None = None,
                     global_batch: int | None = None, probe_share: float | None = None) -> None:
            super().__init__()
            self.dataset, self.global_batch = dataset, global_batch
            self.settings = _Settings(every_minutes=every_minutes, directory=directory, larger_k=larger_k,
                                      probe_share=probe_share)
            # Made now to validate the settings where the user passed them; the model's own replaces it.
            self.tracker = Tracker(**self.settings)
            self._first_batch = 0

        def set_model(self, model: Model) -> None:
            super().set_model(model)
            self.tracker = tracker_for(model, **self.settings)

        def _strategy(self) -> Any:
            return _compat.model_strategy(self.model) or tf().distribute.get_strategy()

        def on_train_begin(self, logs: Logs = None) -> None:
            # A train function made for this fit traces at its first execution: that one is not timed.
            function = getattr(self.model, "train_function", None)
            self.tracker.times.new_run(warm_up=function is None or function is not self.tracker.function)
            self.tracker.function = function
            self.tracker.start_gauges()

        def on_epoch_begin(self, epoch: int, logs: Logs = None) -> None:
            self.tracker.times.pause()
            self.tracker.times.epoch_begins()

        def on_train_batch_begin(self, batch: int, logs: Logs = None) -> None:
            self._first_batch = batch
            self.tracker.times.begin()

        def on_train_batch_end(self, batch: int, logs: Logs = None) -> None:
            self.tracker.times.end(batch - self._first_batch + 1)

        def on_epoch_end(self, epoch: int, logs: Logs = None) -> None:
            self.tracker.times.pause()
            self.tracker.times.epoch_ends()
            if self.tracker.reports and self.tracker.due(self._strategy(), final=False):
                self._report()

        def on_train_end(self, logs: Logs = None) -> None:
            self.tracker.stop_gauges()
            if self.tracker.due(self._strategy(), final=True):
                self._report()

        def _report(self) -> None:
            cap = self.params.get("steps") if isinstance(getattr(self, "params", None), dict) else None
            self.tracker.report(self.model, self.dataset, global_batch=self.global_batch,
                                cap=int(cap) if cap else None)

    return PerformanceReport


def performance_report(dataset: Dataset | None = None, *, every_minutes: float | None = EVERY_MINUTES,
                       directory: str | os.PathLike[str] | None = None, larger_k: bool | None = None,
                       global_batch: int | None = None, probe_share: float | None = None) -> Any:
    """A Keras callback that reports where each step's time goes: input, reduction, dispatch, compute.

    At the end of the model's first ``fit`` (and at an epoch's end every
    ``every_minutes`` after) worker 0 prints one report for the job: its
    examples/s, the step's median and p90, each part's share, each worker's
    share, the bottleneck and one or two recommendations (the bottleneck's
    first) with their expected gain, and what the probes cost; with
    ``directory``, it writes ``report.txt``, ``report.json`` and
    ``report.html`` (a picture of each worker's step) there, and each worker
    its ``worker-<i>.json``. Its probes run on a copy of ``dataset``, within
    ``probe_share`` of the time trained, and leave the model and the data as
    they were.

    Args:
        dataset: the dataset ``fit`` trains on (for the probes of input and of a step without it);
            without it the report cannot split input from compute.
        every_minutes: minutes between reports on long jobs; ``None``: the first fit's only.
        directory: where to write the JSON and text; ``None``: print only.
        larger_k: probe a larger ``steps_per_execution`` (traces one more train function);
            default: once the job has trained 30 s.
        global_batch: the examples per step; default: read from the dataset's first batch.
        probe_share: the share of the time trained since the last report the probes may take (a probe that
            would go past it does not run, and the report says so); default: ``TFSTRATEGY_PROFILE_PROBES``, else 0.1.

    Example:
        >>> model.fit(train_ds, epochs=5, callbacks=[tfstrategy.performance_report(train_ds)])
    """
    return _callback_class(tf().keras.callbacks.Callback)(dataset, every_minutes=every_minutes, directory=directory,
                                                          larger_k=larger_k, global_batch=global_batch,
                                                          probe_share=probe_share)




def add_report(model: Model, args: tuple[Any, ...], kwargs: dict[str, Any], settings: dict[str, Any]) -> None:
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
