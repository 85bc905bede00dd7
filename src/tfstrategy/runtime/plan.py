"""The one plan of process-wide steps that ``select()``, the start-up hook and ``tfstrategy env`` run or print.

What tfstrategy does to a process (split the CPU, set ``TF_CONFIG`` from a
cluster environment, record creation sites, prepare the multi-worker runtime,
rewrite ``MirroredStrategy``, refuse what cannot join, patch Keras, audit
``fit``) is a :class:`Step` object. :func:`plan_steps` picks, from plain
:class:`~tfstrategy.runtime.inputs.PlanInputs` and without touching
TensorFlow, the steps that apply, in their order; ``select()`` and the hook
take exactly those objects (:class:`Plan`), and ``tfstrategy env`` prints the
same objects, so the preview cannot disagree with what happens.

Every step has a ``phase`` (``tensorflow``: as soon as TensorFlow is imported,
before the script's first op or before ``select()`` chooses; ``strategy``:
around building the strategy; ``keras``: once Keras is importable), says whether
it ``rewrites`` TensorFlow's or Keras' code (each replacement registers with
:data:`~tfstrategy.state.registry.RUNTIME`), and can be undone.
"""

from __future__ import annotations

from collections.abc import Callable

from tfstrategy.errors import TFStrategyError
from tfstrategy.runtime.hook_steps import HOOK_STEPS
from tfstrategy.runtime.inputs import HOOK, SELECT, PlanInputs, resolved_kind
from tfstrategy.runtime.step import PHASES, Step
from tfstrategy.runtime.steps import SELECT_STEPS
from tfstrategy.state.registry import RUNTIME

__all__ = ["PHASES", "Plan", "PlanInputs", "Step", "current_plan", "plan_steps", "resolved_kind"]


def plan_steps(inputs: PlanInputs) -> tuple[Step, ...]:
    """The ordered steps ``inputs.consumer`` takes in this process (pure).

    Example:
        >>> from tfstrategy.runtime.inputs import PlanInputs
        >>> [s.name for s in plan_steps(PlanInputs(consumer="hook", cpu_replicas=2))][:2]
        ['split_cpu', 'record_creation_sites']
    """
    catalogue = {SELECT: SELECT_STEPS, HOOK: HOOK_STEPS}.get(inputs.consumer)
    if catalogue is None:
        raise ValueError(f"unknown consumer {inputs.consumer!r}")
    return tuple(step(inputs) for step in catalogue if step.applies(inputs))


OnError = Callable[[Step, Exception], None]


class Plan:
    """The steps of one consumer in this process, taken phase by phase."""

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.steps = plan_steps(inputs)
        RUNTIME.plans[inputs.consumer] = self

    def names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    def step(self, name: str) -> Step | None:
        return next((step for step in self.steps if step.name == name), None)

    def take(self, phase: str, *, on_error: OnError | None = None) -> list[tuple[str, str]]:
        """Take every planned step of ``phase``; return ``(name, what it did)`` of those that did something.

        Without ``on_error`` a failing step raises. With it, the error is handed to
        ``on_error`` and the next step runs, except a :class:`TFStrategyError` of a
        ``fatal`` step, which raises after ``on_error`` saw it.
        """
        taken = []
        for step in self.steps:
            if step.phase != phase or step.state != "planned":
                continue  # another phase, or taken meanwhile (a step's own import of keras runs the Keras phase)
            try:
                done = step.take()
            except Exception as error:
                if on_error is None:
                    raise
                on_error(step, error)
                if isinstance(error, TFStrategyError) and step.fatal:
                    raise
                continue
            if done:
                taken.append((step.name, done))
        return taken

    def undo(self) -> None:
        for step in reversed(self.steps):
            step.undo()

    def statuses(self) -> tuple[str, ...]:
        return tuple(step.status() for step in self.steps)


def current_plan(consumer: str) -> Plan | None:
    """The plan ``consumer`` (``"select"``, ``"hook"``) last derived in this process, if any since the last reset."""
    plan = RUNTIME.plans.get(consumer)
    return plan if isinstance(plan, Plan) else None
