"""Where a step's time goes, what to change, and the report's text and JSON (pure: no TensorFlow).

The measurements (:class:`Measurements`) come from two places
(:mod:`tfstrategy.performance.report`): the job's own steps, timed while it
trains, and short probes run on a copy of its data at the report's time:

- ``synthetic``: a step on one cached batch, repeated: the job's step without
  its input pipeline (the TensorFlow performance guide's "synthetic data" test);
- ``data_step``: the same step on a copy of the job's data, timed right after
  ``synthetic``, so both see about the same load on the machine;
- ``input_batch``: the input pipeline alone, producing one batch;
- ``allreduce``: what one all-reduce of tensors shaped as the model's gradients,
  across every replica of the job (workers included), adds to a call;
- ``larger_k``: a synthetic step at a larger ``steps_per_execution``, when probed.

From these :func:`shares` splits a step into four parts that sum to 1:

- **input**: the step minus the synthetic step: the time a step waits for data,
  its pipeline competing for the cores included. The probes are scaled to the
  job's step by the ratio of the step to ``data_step`` (the probes run after the
  steps, under another load); when ``data_step`` was not probed, they are
  scaled only when a step is longer than the synthetic step plus the input alone;
- **dispatch**: the per-call cost a larger K saves (the synthetic step at K minus
  at the larger K, scaled to the whole dispatch), when probed;
- **reduction**: the all-reduce of the gradients, the workers' skew in reaching
  it included;
- **compute**: the rest: the model's own work.

:func:`verdict` names the largest as the bottleneck and gives at most two
recommendations, each with the gain it expects and why.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from tfstrategy.performance.evidence import WAITING, Inference, infer

#: A share at least this large makes a recommendation worth giving.
WORTH_FIXING = 0.2
#: Input pipeline operations that run one element at a time, and the fix for each.
SEQUENTIAL_OPS = {
    "MapDataset": "map(..., num_parallel_calls=tf.data.AUTOTUNE)",
    "InterleaveDataset": "interleave(..., num_parallel_calls=tf.data.AUTOTUNE)",
    "FlatMapDataset": "interleave(..., num_parallel_calls=tf.data.AUTOTUNE) in place of flat_map",
}
PREFETCH_OPS = ("PrefetchDataset",)
PARTS = ("input", "reduction", "dispatch", "compute")


@dataclass(frozen=True, kw_only=True)
class Measurements:
    """What one worker measured: its steps, and the probes' seconds per step."""

    #: Seconds per step of each timed execution (its duration / its steps), warm-up excluded.
    step_seconds: tuple[float, ...]
    #: Steps timed, and the wall seconds they took (executions and the gaps between them).
    steps: int
    seconds: float
    global_batch: int
    replicas: int
    workers: int = 1
    worker: int = 0
    steps_per_execution: int = 1
    #: Seconds per step outside the train function's call (Keras' loop, other callbacks: per-call costs).
    outside: float = 0.0
    #: Seconds per step waiting for the next batch, timed directly (a custom loop's ``next()``): the
    #: input share is at least this, and more when input work slows the step (``synthetic``).
    waited: float | None = None
    synthetic: float | None = None
    #: Seconds per step on a copy of the data, timed right after ``synthetic``.
    data_step: float | None = None
    input_batch: float | None = None
    allreduce: float | None = None
    #: (K, seconds per synthetic step at K: the fastest) of the larger-K probe, and the fastest at this K.
    larger_k: tuple[int, float] | None = None
    synthetic_fastest: float | None = None
    #: Cores this process may use (what a parallel input pipeline could use at most).
    cores: int = 1
    #: The input pipeline's operation types (``MapDataset``, ``PrefetchDataset``, ...), if known.
    pipeline_ops: tuple[str, ...] = ()
    probe_seconds: float = 0.0
    #: Why a probe did not run, by probe name.
    not_probed: dict[str, str] = field(default_factory=dict)
    #: The share of the time trained every wanted probe would need (when some did not fit), from the plan.
    probes_need_share: float | None = None
    #: Free figures, per step, gathered while training (:mod:`~tfstrategy.performance.evidence`): the process's CPU
    #: seconds, and the seconds the stack samples saw the input pipeline and a ``tf.py_function`` of the user's run.
    cpu_seconds: float | None = None
    sampled_input: float | None = None
    sampled_py_function: float | None = None
    #: Whether the replicas are GPUs or TPUs (their compute burns no host CPU).
    accelerators: bool = False
    #: The machine's 1-minute load average at the report (other work competing for the cores), if known.
    load_average: float | None = None
    #: Wall seconds of the epochs (the traced first step, validation, epoch ends; not the probes), and their steps.
    epoch_seconds: float | None = None
    epoch_steps: int | None = None


#: The verdict when the probes did not run: the step is timed but not split.
UNSPLIT = "unsplit"


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    #: The part of a step it addresses: one of :data:`PARTS`, or :data:`UNSPLIT` (let the probes run).
    part: str
    action: str
    why: str
    #: Expected speed-up of examples per second (an upper bound where it says "up to").
    expected_gain: float | None = None

    def line(self) -> str:
        gain = f" (expected {self.expected_gain:.2f}x)" if self.expected_gain else ""
        return f"{self.action}{gain}: {self.why}"


@dataclass(frozen=True, kw_only=True)
class Report:
    measurements: Measurements
    median: float
    p90: float
    examples_per_second: float
    shares: dict[str, float]
    bottleneck: str
    recommendations: tuple[Recommendation, ...]
    #: When the probes did not split the step: what the free samples point at.
    inferred: Inference | None = None

    def as_dict(self) -> dict[str, object]:
        m = self.measurements
        return {
            "worker": m.worker, "workers": m.workers, "replicas": m.replicas, "global_batch": m.global_batch,
            "steps_per_execution": m.steps_per_execution, "steps": m.steps, "seconds": m.seconds,
            # This worker's steps times the global batch over its own seconds in them: the job's throughput,
            # once, is in the job's report (performance.job).
            "timed_examples_per_second": self.examples_per_second,
            "epoch_examples_per_second": epoch_rate(m),
            "step_seconds": {"median": self.median, "p90": self.p90},
            "shares": self.shares, "bottleneck": self.bottleneck,
            "inferred": self.inferred.as_dict() if self.inferred else None,
            "free_samples": free_samples(m),
            "recommendations": [asdict(r) for r in self.recommendations],
            "probes": {"synthetic_step": m.synthetic, "data_step": m.data_step, "input_batch": m.input_batch,
                       "allreduce": m.allreduce,
                       "larger_k": list(m.larger_k) if m.larger_k else None, "not_probed": m.not_probed,
                       "pipeline_ops": list(m.pipeline_ops)},
            "cost": {"probe_seconds": m.probe_seconds,
                     "share_of_training": m.probe_seconds / m.seconds if m.seconds > 0 else None},
        }

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"

    def text(self) -> str:
        m = self.measurements
        who = f"worker {m.worker} of {m.workers}" if m.workers > 1 else "one worker"
        lines = [
            f"tfstrategy performance report ({who}, {m.replicas} replica{'s' if m.replicas != 1 else ''} in sync, "
            f"steps_per_execution={m.steps_per_execution}): {m.steps} steps in {m.seconds:.1f} s",
            f"  {self.examples_per_second:,.0f} in-step examples/s"
            + (" as this worker timed its steps" if m.workers > 1 else "")
            + epoch_text(m)
            + f"; step {self.median * 1000:.3g} ms median, {self.p90 * 1000:.3g} ms p90 "
            f"(global batch {m.global_batch})",
            "  where a step goes: " + split_text(self.shares, self.bottleneck, self.inferred),
        ]
        lines += [f"  recommendation ({r.part}): {r.line()}" for r in self.recommendations]
        skipped = "; ".join(f"{name}: {why}" for name, why in m.not_probed.items())
        cost = f"  report cost: probes {m.probe_seconds:.2f} s"
        if m.seconds > 0:
            cost += f" ({m.probe_seconds / m.seconds:.1%} of the {m.seconds:.1f} s trained)"
        lines.append(cost + (f"; not probed: {skipped}" if skipped else ""))
        return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between the nearest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("Received no values; expected at least one timed step.")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def shares(step: float, m: Measurements) -> dict[str, float]:
    """Split a step of ``step`` seconds into input, reduction, dispatch and compute (summing to 1)."""
    if step <= 0:
        return {part: (1.0 if part == "compute" else 0.0) for part in PARTS}
    outside = min(m.outside, step)
    call = step - outside
    scale = 1.0  # probe seconds -> seconds of this step
    if m.waited is not None:  # a custom loop: its wait timed, and its step on one batch if probed
        waited = min(max(m.waited, call - (m.synthetic if m.synthetic is not None else call)), call)
        synthetic = call - waited
    elif m.synthetic is not None and m.synthetic > 0:
        if m.data_step is not None and m.data_step > 0:
            # The step on the data and on one cached batch, one right after the other under about one load: the
            # probes scale to this step by the ratio of the step to its probed twin.
            scale = call / m.data_step
        else:
            # Without the twin, a step longer than the cached step plus the input alone means the probes ran
            # faster than the steps did (a neighbour's load, or input and step sharing the cores): every probe is
            # scaled to the step, so the difference is shared in the probes' proportions instead of all landing
            # on compute (which the cached step bounds).
            explained = m.synthetic + (m.input_batch if m.input_batch is not None else float("inf"))
            scale = call / explained if call > explained else 1.0
        synthetic = min(m.synthetic * scale, call)
        waited = call - synthetic  # what the step on the data took beyond the step on one cached batch
    else:
        synthetic, waited = call, 0.0
    dispatch = outside  # Keras' loop and other callbacks between calls: a per-call cost a larger K divides
    if m.larger_k is not None and m.synthetic_fastest is not None:
        k, larger = m.larger_k
        saved = max(m.synthetic_fastest - larger, 0.0) * scale  # d/K - d/k' of the dispatch d per execution
        ratio = 1 - m.steps_per_execution / k
        dispatch += min(saved / ratio, synthetic) if ratio > 0 else 0.0
    reduction = min((m.allreduce or 0.0) * scale, max(step - waited - dispatch, 0.0))
    compute = max(step - waited - dispatch - reduction, 0.0)
    total = waited + dispatch + reduction + compute
    return {"input": waited / total, "reduction": reduction / total, "dispatch": dispatch / total,
            "compute": compute / total}


def _input_fix(ops: Sequence[str]) -> str:
    fixes = [fix for op, fix in SEQUENTIAL_OPS.items() if op in ops]
    if ops and not any(op in ops for op in PREFETCH_OPS):
        fixes.append("end the pipeline with .prefetch(tf.data.AUTOTUNE)")
    if fixes:
        return "; ".join(fixes)
    return "cache() the data after its expensive steps if it fits in memory, or give the input more CPU"


def recommendations(split: dict[str, float], m: Measurements, step: float,
                    bottleneck: str | None = None) -> tuple[Recommendation, ...]:
    """At most two, each with its expected gain: the bottleneck's first, then the largest other share."""
    bottleneck = bottleneck or max(PARTS, key=lambda part: split[part])
    found: list[tuple[float, Recommendation]] = []
    if split["input"] >= WORTH_FIXING or bottleneck == "input":
        rest = step * (1 - split["input"])
        # Input spread over every core and overlapped with the step: the step then takes the longer of the two.
        floor = max(rest, (m.input_batch or 0.0) / max(m.cores, 1))
        found.append((split["input"], Recommendation(
            part="input", action=_input_fix(m.pipeline_ops),
            why=f"each step waits {split['input']:.0%} of its time for input"
                + (f" (the pipeline alone takes {m.input_batch * 1000:.3g} ms a batch)"
                   if m.input_batch else "")
                + f"; run in parallel on the {m.cores} core(s) and overlapped with the step, at best",
            expected_gain=step / floor if floor > 0 else None)))
    if split["dispatch"] >= WORTH_FIXING / 2 or bottleneck == "dispatch":
        k = m.larger_k[0] if m.larger_k else 4 * m.steps_per_execution
        saved = m.outside * (1 - m.steps_per_execution / k)
        evidence = f"{m.outside * 1000:.3g} ms a step go between calls (Keras' loop and callbacks)"
        if m.larger_k is not None and m.synthetic_fastest is not None:
            saved += max(m.synthetic_fastest - m.larger_k[1], 0.0)
            evidence += (f"; a step on one cached batch took {m.synthetic_fastest * 1000:.3g} ms at "
                         f"K={m.steps_per_execution} and {m.larger_k[1] * 1000:.3g} ms at K={k}")
        found.append((split["dispatch"], Recommendation(
            part="dispatch", action=f"compile with steps_per_execution={k}",
            why=f"per-call costs are {split['dispatch']:.0%} of a step at K={m.steps_per_execution}: {evidence}",
            expected_gain=step / (step - saved) if 0 < saved < step else None)))
    if split["reduction"] >= WORTH_FIXING and (m.replicas > 1 or m.workers > 1) or bottleneck == "reduction":
        found += _reduction_fixes(split, m, step)
    if bottleneck == "compute" or not found and split["compute"] >= 0.5:
        others = [part for part, _ in found]
        found.append((split["compute"], Recommendation(
            part="compute",
            action=("the model's own work is the largest part: " if others else
                    "nothing in the input or the reduction to fix: ")
            + "more replicas or workers at the same per-replica batch, a faster device, or mixed precision on "
              "GPUs (--precision mixed_float16)",
            why=f"compute is {split['compute']:.0%} of a step")))
    # The bottleneck's recommendations first (the verdict names it), then the others by the share they address.
    found.sort(key=lambda pair: (pair[1].part != bottleneck, -pair[0]))
    return tuple(recommendation for _, recommendation in found[:2])


def _reduction_fixes(split: dict[str, float], m: Measurements, step: float) -> list[tuple[float, Recommendation]]:
    """Fewer workers when the all-reduce outweighs the compute it splits; a larger batch, always."""
    r, c = split["reduction"] * step, split["compute"] * step
    found: list[tuple[float, Recommendation]] = []
    if m.workers > 1 and r > (m.workers - 1) * c:
        found.append((split["reduction"], Recommendation(
            part="reduction",
            action=f"train on fewer workers (one worker with the same global batch: {m.workers}x its compute, "
                   "no cross-worker reduction)",
            why=f"the model is latency-bound: the all-reduce ({r * 1000:.3g} ms) outweighs {m.workers - 1}x the "
                f"compute of a step ({c * 1000:.3g} ms)",
            expected_gain=(r + c) / (m.workers * c) if c > 0 else None)))
    found.append((split["reduction"] * 0.99, Recommendation(
        part="reduction", action="double the per-replica batch (and the global batch with it)",
        why=f"the all-reduce of the gradients is {split['reduction']:.0%} of a step and costs the same at any "
            "batch, so twice the examples per step pay it half as often",
        expected_gain=2 * (r + c) / (r + 2 * c) if r + 2 * c > 0 else None)))
    return found


def is_split(m: Measurements) -> bool:
    """Whether the probes split the step: a step on one cached batch, or a custom loop's timed wait."""
    return m.synthetic is not None or m.waited is not None


def suggested_share(need: float | None) -> float:
    """A round probe share a little above ``need`` (1, 2, 3 or 5 x 10^n): what to pass to let every probe run."""
    if need is None or not need > 0:
        return 1.0
    aim = need * 1.25  # the probes' cost is an estimate
    power = 10.0 ** math.floor(math.log10(aim))
    return next(round(step * power, 6) for step in (1, 2, 3, 5, 10) if step * power >= aim)


def unsplit_recommendation(m: Measurements) -> Recommendation:
    """What to do when the probes did not run: let them, with the option that does it."""
    budget = [reason for reason in m.not_probed.values() if "budget" in reason]
    share = suggested_share(m.probes_need_share)
    if budget and m.probes_need_share is not None:
        need = m.probes_need_share
        why = ("the probes would have cost about " + (f"{need:.1f}x" if need >= 1 else f"{need:.0%} of")
               + " the time trained, more than they may take")
    elif budget:
        why = "the probes would have cost more than they may"
    else:
        why = "the probes did not run"
    return Recommendation(
        part=UNSPLIT,
        action=f"to split the step, let the probes run: pass --profile-probes {share:g} to tfstrategy run or launch "
               f"(in code, performance_report(probe_share={share:g}); or set TFSTRATEGY_PROFILE_PROBES={share:g}), "
               "or train longer before the report",
        why=f"the step was timed but not split: {why} (the report's cost line, its last, names each probe left "
            "out and what it would have cost)")


def infer_from(m: Measurements, step: float) -> Inference:
    """What the free samples of ``m`` point at, for a step of ``step`` seconds."""
    return infer(step=step, cores=m.cores, cpu_seconds=m.cpu_seconds, sampled_input=m.sampled_input,
                 sampled_py_function=m.sampled_py_function, pipeline_ops=m.pipeline_ops, replicas=m.replicas,
                 workers=m.workers, accelerators=m.accelerators, load_average=m.load_average)


def unsplit_advice(m: Measurements, inferred: Inference) -> tuple[Recommendation, ...]:
    """The recommendations of a step the probes did not split: the inferred bottleneck's fix (its gain not
    measured), then how to let the probes run."""
    probes = unsplit_recommendation(m)
    sure = f"the free samples point at {inferred.bottleneck} ({inferred.certainty}); not probed, so no gain is measured"
    if inferred.bottleneck == "input":
        return (Recommendation(part="input", action=_input_fix(m.pipeline_ops), why=sure), probes)
    if inferred.bottleneck == "compute":
        return (Recommendation(part="compute", action="nothing in the input to fix: more replicas or workers at the "
                               "same per-replica batch, a faster device, or mixed precision on GPUs "
                               "(--precision mixed_float16)", why=sure), probes)
    if inferred.bottleneck == WAITING:
        return (Recommendation(part=UNSPLIT, action=probes.action,
                               why=f"{inferred.evidence}: the step waits, for input or for the all-reduce, and only "
                                   "the probes tell which (its cost line, the report's last, names each probe left out)"),)
    return (probes,)


def epoch_rate(m: Measurements) -> float | None:
    """Examples per second over the epochs' wall time (tracing, epoch ends, validation included), if timed."""
    if m.epoch_seconds is None or m.epoch_steps is None or not m.epoch_seconds > 0:
        return None
    return m.epoch_steps * m.global_batch / m.epoch_seconds


def epoch_note(rate: float | None) -> str:
    """The epochs' rate beside the in-step one, saying what its time includes (``""`` if not timed)."""
    if rate is None:
        return ""
    return f" ({rate:,.0f}/s over the epochs' wall time: the traced first step, validation and epoch ends included)"


def epoch_text(m: Measurements) -> str:
    return epoch_note(epoch_rate(m))


def free_samples(m: Measurements) -> dict[str, float | None]:
    """The free figures per step, for the JSON."""
    return {"cpu_seconds": m.cpu_seconds, "input_seconds": m.sampled_input,
            "py_function_seconds": m.sampled_py_function}


def split_text(shares: dict[str, float], bottleneck: str, inferred: Inference | None) -> str:
    """The "where a step goes" line: the probes' split, else what the free samples point at, and on what."""
    if bottleneck != UNSPLIT:
        return ", ".join(f"{part} {shares[part]:.0%}" for part in PARTS) + f" -> {bottleneck}-bound"
    if inferred is None:
        return "not split (the probes did not run)"
    return f"not split by the probes; {inferred.headline()}: {inferred.evidence}"


def verdict(m: Measurements) -> Report:
    """The report: step statistics, shares, the bottleneck and the recommendations."""
    median = statistics.median(m.step_seconds)
    split = shares(median, m)
    per_second = m.steps * m.global_batch / m.seconds if m.seconds > 0 else 0.0
    inferred = None
    if is_split(m):
        bottleneck = max(PARTS, key=lambda part: split[part])
        advice = recommendations(split, m, median, bottleneck)
    else:
        inferred = infer_from(m, median)
        bottleneck, advice = UNSPLIT, unsplit_advice(m, inferred)
    return Report(measurements=m, median=median, p90=percentile(m.step_seconds, 90), examples_per_second=per_second,
                  shares=split, bottleneck=bottleneck, recommendations=advice, inferred=inferred)
