"""What the report can conclude without its probes, from what costs nothing to watch (pure: no TensorFlow).

When the probes do not fit their budget (a short run), the step is timed but
not split. Three figures were gathered while training at no cost:

- ``sampled_input``: seconds per step the stack samples saw tf.data run the
  user's code (a ``from_generator`` generator): the input pipeline at work;
- ``sampled_py_function``: seconds per step they saw a ``tf.py_function`` of the
  user's run; in a pipeline with a ``map`` it counts as input (the stack cannot
  tell a ``map``'s from the step's, the pipeline's operations can);
- ``cpu_seconds``: the process's CPU seconds per step. Against the step's wall
  times the cores it may use: well below means the step waits (for input, or
  for the all-reduce), near means it computes. On an accelerator the compute
  burns no host CPU, so there this says nothing; on a machine crowded with other
  work (its load average well above its cores) the step may wait for a core, so
  an idle CPU concludes nothing.

:func:`infer` weighs them into a bottleneck with a certainty (``likely``,
``possibly``), or none ("cannot tell"). The samples come from the worker's
ledger under ``launch`` (the heartbeat's, :mod:`tfstrategy.runtime.ledger`), or
from the report's own sampler (:mod:`tfstrategy.performance.sampler`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The input pipeline ran at least this share of a step: it sets the pace (likely input-bound).
INPUT_LIKELY = 0.5
#: ... at least this share, with the CPU mostly idle: possibly input-bound.
INPUT_POSSIBLY = 0.2
#: CPU seconds at least this share of wall x cores: the step computes.
CPU_BUSY = 0.7
#: ... at most this share: the step waits.
CPU_IDLE = 0.35
#: A load average above this many times the cores: other work competes for them, and idle CPU may be a wait for a
#: core, not for input or the all-reduce.
CROWDED = 1.5
#: The verdict for a step that waits, for input or the all-reduce (only the probes tell which).
WAITING = "waiting"


@dataclass(frozen=True, kw_only=True)
class Inference:
    """A bottleneck concluded from the free samples, how sure, and the figures it rests on."""

    #: ``input``, ``compute``, :data:`WAITING`, or ``None``: cannot tell.
    bottleneck: str | None
    #: ``likely`` or ``possibly`` (``""`` when it cannot tell).
    certainty: str
    #: The figures, in words: "the input pipeline ran 20 ms of each 25 ms step; CPU 8% of 2 cores".
    evidence: str

    def headline(self) -> str:
        """``input-bound (from the stack samples and CPU time, not probed: likely)``, or why it cannot tell."""
        if self.bottleneck is None:
            return "cannot tell without the probes"
        name = ("waiting for input or the all-reduce" if self.bottleneck == WAITING
                else f"{self.bottleneck}-bound")
        return f"{name} (from the stack samples and CPU time, not probed: {self.certainty})"

    def as_dict(self) -> dict[str, str | None]:
        return {"bottleneck": self.bottleneck, "certainty": self.certainty or None, "evidence": self.evidence}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms"


def has_map(ops: Sequence[str]) -> bool:
    """Whether the pipeline maps its elements (where a ``tf.py_function`` of the user's would be input)."""
    return any("Map" in op for op in ops)


def infer(*, step: float, cores: int, cpu_seconds: float | None, sampled_input: float | None,
          sampled_py_function: float | None, pipeline_ops: Sequence[str] = (), replicas: int = 1, workers: int = 1,
          accelerators: bool = False, load_average: float | None = None) -> Inference:
    """The bottleneck the free samples point at, per step of ``step`` seconds (the median)."""
    if step <= 0:
        return Inference(bottleneck=None, certainty="", evidence="no step timed")
    said: list[str] = []
    input_share = 0.0
    if sampled_input is not None and sampled_input > 0:
        input_share = sampled_input / step
        said.append(f"the input pipeline ran {_ms(sampled_input)} of each {_ms(step)} step")
    if sampled_py_function is not None and sampled_py_function > 0:
        in_map = has_map(pipeline_ops)
        where = "in the pipeline's map" if in_map else "in the map or the step: the pipeline has no map"
        said.append(f"a tf.py_function ran {_ms(sampled_py_function)} of each {_ms(step)} step ({where})")
        if in_map:
            input_share = max(input_share, sampled_py_function / step)
    if sampled_input is not None and not said:
        said.append("the stack samples saw no input running")
    busy: float | None = None
    if cpu_seconds is not None:
        busy = cpu_seconds / (step * max(cores, 1))
        said.append(f"CPU {_ms(cpu_seconds)} a step, {busy:.0%} of {max(cores, 1)} core(s)"
                    + (" (the compute runs on the accelerators: it says nothing)" if accelerators else ""))
    crowded = load_average is not None and load_average > CROWDED * max(cores, 1)
    if crowded and busy is not None and busy < CPU_BUSY and input_share < INPUT_LIKELY:  # when the CPU would decide
        said.append(f"the machine is crowded (load average {load_average:.1f} on {max(cores, 1)} core(s)): "
                    "the step may wait for a core")
    evidence = "; ".join(said) or "no samples (no step timed while sampling)"
    if accelerators:
        busy = None
    idle = busy is not None and busy <= CPU_IDLE and not crowded
    if input_share >= INPUT_LIKELY:
        return Inference(bottleneck="input", certainty="likely", evidence=evidence)
    if input_share >= INPUT_POSSIBLY and idle:
        return Inference(bottleneck="input", certainty="possibly", evidence=evidence)
    if busy is not None and busy >= CPU_BUSY:
        return Inference(bottleneck="compute", certainty="likely" if input_share < INPUT_POSSIBLY else "possibly",
                         evidence=evidence)
    if idle:
        if replicas * workers > 1:
            return Inference(bottleneck=WAITING, certainty="possibly", evidence=evidence)
        return Inference(bottleneck="input", certainty="possibly", evidence=evidence)  # nothing else to wait for
    return Inference(bottleneck=None, certainty="", evidence=evidence)
