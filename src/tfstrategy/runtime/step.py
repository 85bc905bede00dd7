"""One process-wide step of a plan: whether it applies, what it would do, taking it, undoing it, its status."""

from __future__ import annotations

from typing import ClassVar

from tfstrategy.runtime.inputs import PlanInputs
from tfstrategy.state.registry import RUNTIME

__all__ = ["PHASES", "Step"]

PHASES = ("tensorflow", "strategy", "keras")


class Step:
    """One process-wide step: whether it applies, what it would do, taking it, undoing it, its status."""

    name: ClassVar[str]
    phase: ClassVar[str]
    #: It replaces something of TensorFlow's or Keras' (undone through the runtime).
    rewrites: ClassVar[bool] = False
    #: A TFStrategyError from it stops the hook too (a bad setting must not train on the wrong replicas).
    fatal: ClassVar[bool] = False

    def __init__(self, inputs: PlanInputs) -> None:
        self.inputs = inputs
        self.state = "planned"
        self.done: str | None = None

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        """Whether this step is part of the plan for ``inputs`` (pure)."""
        return True

    def detail(self) -> str:
        """What the step would do here, in one line."""
        raise NotImplementedError

    def _take(self) -> str | None:
        raise NotImplementedError

    def take(self) -> str | None:
        """Take the step once; return what it did in one line, or ``None`` if nothing was needed."""
        if self.state != "planned":
            return self.done
        self.state = "taking"
        try:
            with RUNTIME.taking(self.name):
                self.done = self._take()
        except BaseException as error:
            self.state = f"failed ({type(error).__name__}: {error})"
            raise
        self.state = "taken" if self.done else "nothing to do"
        return self.done

    def change(self) -> str | None:
        """What this step changed for the script, in the user's terms (``None``: it did not act on it).

        The exit summary's words. By default what the step's code recorded the moment it acted
        (:meth:`~tfstrategy.state.registry.HookState.changed`); a step that acts by being taken says so itself.
        """
        return RUNTIME.hook.changes.get(self.name)

    def after_build(self) -> str | None:
        """Called by ``select()`` once the strategy exists (steps of the ``strategy`` phase); else nothing."""
        return None

    def undo(self) -> None:
        """Put back what the step replaced (logical devices and the like cannot be: they stay)."""
        for replacement in reversed(RUNTIME.replacements(step=self.name)):
            replacement.remove()
        if self.state in ("taken", "nothing to do"):
            self.state = "undone"

    def status(self) -> str:
        """``name: state (what it did, or what it would do)``."""
        return f"{self.name}: {self.state} ({self.done or self.detail()})"

    def line(self) -> str:
        return f"{self.name}: {self.detail()}"
