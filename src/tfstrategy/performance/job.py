"""One report for the whole job from every worker's measurements (pure: no TensorFlow).

Each worker times its own steps and runs the same probes (:mod:`~tfstrategy.performance.report`).
Its figures travel to the others as one row of numbers (:func:`figures_row`, :func:`from_row`: an
all-gather at the report's time, no collective while training), and :func:`combine` makes of them
one :class:`JobReport`:

- **the job's throughput, once**: the global batch times the steps, over the least time any worker
  spent in them. Workers step together, so a worker that took longer waited inside a step for
  another's work outside the steps (the chief's epoch end, say); that wait is stated per worker;
- **each worker's share**: its replicas' part of the examples, its step, and where its step goes;
- **one verdict**: the mean of the workers' shares names the bottleneck, and the recommendations
  address it first (each carries the ``part`` it addresses);
- **what the probes cost**: the slowest worker's probe seconds against the time trained, and the
  share they were allowed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfstrategy.performance.environment import PROBE_SHARE
from tfstrategy.performance.evidence import Inference
from tfstrategy.performance.verdict import (
    PARTS,
    UNSPLIT,
    Measurements,
    Recommendation,
    Report,
    epoch_note,
    epoch_rate,
    free_samples,
    infer_from,
    recommendations,
    split_text,
    unsplit_advice,
)

#: The measurements' numbers a worker sends (in this order), after its replicas, median, p90, split flag and shares.
NUMBERS = ("steps", "seconds", "global_batch", "replicas", "workers", "worker", "steps_per_execution", "outside",
           "waited", "synthetic", "data_step", "input_batch", "allreduce", "synthetic_fastest", "cores",
           "probe_seconds", "cpu_seconds", "sampled_input", "sampled_py_function", "epoch_seconds", "epoch_steps", "load_average")
#: Fields that are whole numbers.
_INTEGERS = {"steps", "global_batch", "replicas", "workers", "worker", "steps_per_execution", "cores", "epoch_steps"}
#: The length of one worker's row (:func:`figures_row`).
ROW = 4 + len(PARTS) + len(NUMBERS) + 2


@dataclass(frozen=True, kw_only=True)
class WorkerFigures:
    """One worker's part of the job report: its replicas, its step, where its step goes."""

    worker: int
    #: Replicas on this worker (its share of each global batch).
    replicas: int
    median: float
    p90: float
    shares: dict[str, float]
    #: Whether its probes split the step (else only the step was timed).
    split: bool
    measurements: Measurements

    @property
    def bottleneck(self) -> str:
        return max(PARTS, key=lambda part: self.shares[part]) if self.split else UNSPLIT


def figures_of(report: Report, replicas: int) -> WorkerFigures:
    """A worker's own report as its figures; ``replicas``: the replicas on this worker."""
    m = report.measurements
    return WorkerFigures(worker=m.worker, replicas=replicas, median=report.median, p90=report.p90,
                         shares=dict(report.shares), split=report.bottleneck != UNSPLIT, measurements=m)


def figures_row(figures: WorkerFigures) -> list[float]:
    """The figures as :data:`ROW` numbers (NaN for a probe that did not run), for the all-gather."""
    m = figures.measurements
    numbers = [math.nan if getattr(m, name) is None else float(getattr(m, name)) for name in NUMBERS]
    larger = [float(m.larger_k[0]), m.larger_k[1]] if m.larger_k else [math.nan, math.nan]
    return [float(figures.replicas), figures.median, figures.p90, float(figures.split),
            *(figures.shares[part] for part in PARTS), *numbers, *larger]


def from_row(row: Sequence[float], template: Measurements) -> WorkerFigures:
    """A worker's figures from its row; what a row does not carry (the pipeline's operations, why a probe did not
    run, each execution's time) comes from ``template``, this worker's own measurements."""
    if len(row) != ROW:
        raise ValueError(f"Received a row of {len(row)} numbers; expected {ROW} (figures_row).")
    replicas, median, p90, split = row[:4]
    shares = dict(zip(PARTS, row[4:4 + len(PARTS)]))
    numbers = row[4 + len(PARTS):4 + len(PARTS) + len(NUMBERS)]
    fields: dict[str, Any] = {}
    for name, value in zip(NUMBERS, numbers):
        fields[name] = None if math.isnan(value) else (round(value) if name in _INTEGERS else value)
    k, seconds = row[-2:]
    fields["larger_k"] = None if math.isnan(k) else (round(k), seconds)
    fields["step_seconds"] = (median, p90)
    m = dataclasses.replace(template, **fields)
    return WorkerFigures(worker=m.worker, replicas=round(replicas), median=median, p90=p90, shares=shares,
                         split=bool(split), measurements=m)


@dataclass(frozen=True, kw_only=True)
class JobReport:
    """The job's one report: its throughput, each worker's share, one verdict and what the probes cost."""

    workers: tuple[WorkerFigures, ...]
    examples_per_second: float
    #: Steps timed, and the least seconds any worker spent in them (the job's time in its steps).
    steps: int
    seconds: float
    global_batch: int
    replicas: int
    steps_per_execution: int
    median: float
    p90: float
    shares: dict[str, float]
    bottleneck: str
    recommendations: tuple[Recommendation, ...]
    #: The slowest worker's probe seconds, and the share of the time trained the probes were allowed.
    probe_seconds: float
    probe_share: float
    not_probed: dict[str, str]
    #: When the probes did not split the step: what the free samples point at.
    inferred: Inference | None = None
    #: The job's examples per second over the epochs' wall time (the traced first step, validation, epoch ends), if timed.
    epoch_examples_per_second: float | None = None

    def worker_examples_per_second(self, figures: WorkerFigures) -> float:
        """A worker's share of the job's throughput: its replicas' part of each global batch."""
        return self.examples_per_second * figures.replicas / max(self.replicas, 1)

    def waited(self, figures: WorkerFigures) -> float:
        """Seconds this worker spent in its steps beyond the job's: waiting for another worker's work."""
        return max(figures.measurements.seconds - self.seconds, 0.0)

    def probe_cost(self) -> float | None:
        """The probes' seconds as a share of the seconds trained, or None when nothing was timed."""
        return self.probe_seconds / self.seconds if self.seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "workers": len(self.workers), "replicas": self.replicas, "global_batch": self.global_batch,
            "steps_per_execution": self.steps_per_execution, "steps": self.steps, "seconds": self.seconds,
            "examples_per_second": self.examples_per_second,
            "epoch_examples_per_second": self.epoch_examples_per_second,
            "step_seconds": {"median": self.median, "p90": self.p90},
            "shares": self.shares, "bottleneck": self.bottleneck,
            "inferred": self.inferred.as_dict() if self.inferred else None,
            "recommendations": [dataclasses.asdict(r) for r in self.recommendations],
            "per_worker": [_worker_dict(self, figures) for figures in self.workers],
            "cost": {"probe_seconds": self.probe_seconds, "share_of_training": self.probe_cost(),
                     "allowed_share": self.probe_share, "not_probed": self.not_probed},
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def text(self) -> str:
        """The report as the console and ``report.txt`` show it."""
        count = len(self.workers)
        who = f"{count} workers" if count > 1 else "one worker"
        lines = [
            f"tfstrategy performance report ({who}, {self.replicas} replica{'s' if self.replicas != 1 else ''} in "
            f"sync, steps_per_execution={self.steps_per_execution}): {self.steps} steps in {self.seconds:.1f} s",
            f"  the job: {self.examples_per_second:,.0f} in-step examples/s{self._epoch_text()}; "
            f"step {self.median * 1000:.3g} ms median, {self.p90 * 1000:.3g} ms p90 (global batch {self.global_batch})",
            "  where a step goes: " + split_text(self.shares, self.bottleneck, self.inferred),
        ]
        if count > 1:
            lines += [_worker_line(self, figures) for figures in self.workers]
        lines += [f"  recommendation ({r.part}): {r.line()}" for r in self.recommendations]
        lines.append(_cost_line(self))
        return "\n".join(lines)

    def _epoch_text(self) -> str:
        return epoch_note(self.epoch_examples_per_second)


def _worker_line(job: JobReport, figures: WorkerFigures) -> str:
    share = figures.replicas / max(job.replicas, 1)
    line = (f"  worker {figures.worker}: {figures.replicas} replica{'s' if figures.replicas != 1 else ''}, "
            f"{share:.0%} of the examples ({job.worker_examples_per_second(figures):,.0f} examples/s); "
            f"step {figures.median * 1000:.3g} ms median"
            + (f"; {split_text(figures.shares, figures.bottleneck, None)}" if figures.split
               else f"; not probed: {infer_from(figures.measurements, figures.median).headline()}"))
    waited = job.waited(figures)
    if waited >= 0.05 * job.seconds:
        line += f"; {waited:.1f} s more in its steps than the job (waiting for another worker)"
    return line


def _cost_line(job: JobReport) -> str:
    cost = f"  report cost: probes {job.probe_seconds:.2f} s"
    share = job.probe_cost()
    if share is not None:
        cost += f" ({share:.1%} of the {job.seconds:.1f} s trained; allowed {job.probe_share:.0%})"
    skipped = "; ".join(f"{name}: {why}" for name, why in job.not_probed.items())
    return cost + (f"; not probed: {skipped}" if skipped else "")


def _worker_dict(job: JobReport, figures: WorkerFigures) -> dict[str, Any]:
    m = figures.measurements
    return {"worker": figures.worker, "replicas": figures.replicas,
            "share_of_examples": figures.replicas / max(job.replicas, 1),
            "examples_per_second": job.worker_examples_per_second(figures),
            "step_seconds": {"median": figures.median, "p90": figures.p90}, "seconds": m.seconds,
            "waited_seconds": job.waited(figures), "shares": figures.shares, "bottleneck": figures.bottleneck,
            "free_samples": free_samples(m), "probe_seconds": m.probe_seconds}


def _mean(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.fmean(known) if known else None


def _job_measurements(workers: Sequence[WorkerFigures], steps: int, seconds: float, median: float) -> Measurements:
    """What the recommendations read, for the job: each probe's mean over the workers that ran it."""
    ms = [figures.measurements for figures in workers]
    first = ms[0]
    means = {name: _mean([getattr(m, name) for m in ms])
             for name in ("outside", "waited", "synthetic", "data_step", "input_batch", "allreduce",
                          "synthetic_fastest", "cpu_seconds", "sampled_input", "sampled_py_function",
                          "load_average")}
    epochs = [(m.epoch_seconds, m.epoch_steps) for m in ms if m.epoch_seconds is not None and m.epoch_steps]
    larger = [m.larger_k for m in ms if m.larger_k is not None]
    return dataclasses.replace(
        first, step_seconds=(median,), steps=steps, seconds=seconds, workers=len(workers),
        replicas=sum(figures.replicas for figures in workers), cores=min(m.cores for m in ms),
        outside=means["outside"] or 0.0, waited=means["waited"], synthetic=means["synthetic"],
        data_step=means["data_step"], input_batch=means["input_batch"], allreduce=means["allreduce"],
        synthetic_fastest=means["synthetic_fastest"], cpu_seconds=means["cpu_seconds"],
        sampled_input=means["sampled_input"], sampled_py_function=means["sampled_py_function"],
        load_average=means["load_average"],
        # Workers step together: the job's epochs took the least wall time any worker measured.
        epoch_seconds=min(e[0] for e in epochs) if len(epochs) == len(ms) else None,
        epoch_steps=min(e[1] for e in epochs) if len(epochs) == len(ms) else None,
        larger_k=(larger[0][0], statistics.fmean(k[1] for k in larger)) if larger else None,
        probe_seconds=max(m.probe_seconds for m in ms))


def combine(workers: Sequence[WorkerFigures], *, probe_share: float = PROBE_SHARE) -> JobReport:
    """The job's one report from every worker's figures (in any order; worker 0's strings lead)."""
    if not workers:
        raise ValueError("Received no worker's figures; expected one per worker of the job.")
    ordered = tuple(sorted(workers, key=lambda figures: figures.worker))
    steps = min(figures.measurements.steps for figures in ordered)
    seconds = min(figures.measurements.seconds for figures in ordered)
    global_batch = ordered[0].measurements.global_batch
    median = max(figures.median for figures in ordered)  # workers step together: the slowest sets the step
    p90 = max(figures.p90 for figures in ordered)
    split = [figures for figures in ordered if figures.split]
    m = _job_measurements(ordered, steps, seconds, median)
    if split:
        shares = {part: statistics.fmean(figures.shares[part] for figures in split) for part in PARTS}
        bottleneck = max(PARTS, key=lambda part: shares[part])
        advice = recommendations(shares, m, median, bottleneck)
        inferred = None
    else:
        shares = dict(ordered[0].shares)
        inferred = infer_from(m, median)
        bottleneck, advice = UNSPLIT, unsplit_advice(m, inferred)
    return JobReport(workers=ordered, examples_per_second=steps * global_batch / seconds if seconds > 0 else 0.0,
                     steps=steps, seconds=seconds, global_batch=global_batch, replicas=m.replicas,
                     steps_per_execution=m.steps_per_execution, median=median, p90=p90, shares=shares,
                     bottleneck=bottleneck, recommendations=advice, probe_seconds=m.probe_seconds,
                     probe_share=probe_share, not_probed=dict(ordered[0].measurements.not_probed),
                     inferred=inferred, epoch_examples_per_second=epoch_rate(m))
