"""The steps ``select()`` takes (most of which the start-up hook takes too), and ``select()``'s plan.

Each is a :class:`~tfstrategy.runtime.plan.Step`; the hook's own steps are in
:mod:`tfstrategy.runtime.hook_steps`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tfstrategy.runtime.inputs import SELECT, PlanInputs, resolved_kind
from tfstrategy.runtime.step import Step
from tfstrategy.settings import StrategyKind
from tfstrategy.state.registry import RUNTIME

if TYPE_CHECKING:
    from tfstrategy.patches.mechanism import PatchStatus

__all__ = ["SELECT_STEPS"]

#: ``select()`` splits the CPU only for the kinds that replicate over local devices.
_SPLITTING_KINDS = (StrategyKind.MIRRORED, StrategyKind.ONE_DEVICE)


def _select_kind(inputs: PlanInputs) -> StrategyKind:
    return resolved_kind(inputs.kind or StrategyKind.AUTO, inputs.cluster_tasks)


class SplitCpu(Step):
    name = "split_cpu"
    phase = "tensorflow"
    fatal = True

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        if inputs.cpu_replicas is None:
            return False
        if inputs.consumer == SELECT:
            return _select_kind(inputs) in _SPLITTING_KINDS
        return not inputs.multi_worker

    def detail(self) -> str:
        return f"split the CPU into {self.inputs.cpu_replicas} logical devices"

    def change(self) -> str | None:
        if self.state != "taken" or self.inputs.consumer == SELECT:
            return None
        return f"the CPU split into {self.inputs.cpu_replicas} logical devices"

    def _take(self) -> str | None:
        from tfstrategy.selection.cpu_split import configure_cpu_replicas

        if self.inputs.cpu_replicas is None:
            return None
        return f"{configure_cpu_replicas(self.inputs.cpu_replicas)} logical CPU devices"


class SetTFConfig(Step):
    """``TF_CONFIG`` from an environment that derives the cluster (a Slurm step, ...).

    The environment variable, not a cluster resolver passed to the strategy, because
    Keras, ``save_model``, ``backup_callbacks`` and user code read the task and the chief from it.
    """

    name = "set_tf_config"
    phase = "tensorflow"

    def __init__(self, inputs: PlanInputs) -> None:
        super().__init__(inputs)
        self._previous: str | None = None

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        if not inputs.sets_tf_config:
            return False
        return inputs.consumer != SELECT or _select_kind(inputs) is StrategyKind.MULTI_WORKER

    def detail(self) -> str:
        return f"set TF_CONFIG from the {self.inputs.cluster_source}'s cluster"

    def change(self) -> str | None:
        return self.done if self.state == "taken" and self.inputs.consumer != SELECT else None

    def _take(self) -> str | None:
        if self.inputs.cluster is None or self.inputs.environment is None:
            return None
        self._previous = os.environ.get("TF_CONFIG")
        os.environ["TF_CONFIG"] = self.inputs.cluster.to_json()
        return f"set TF_CONFIG from {self.inputs.environment.describe()}"

    def undo(self) -> None:
        if self.state == "taken":
            if self._previous is None:
                os.environ.pop("TF_CONFIG", None)
            else:
                os.environ["TF_CONFIG"] = self._previous
        super().undo()


class RecordCreationSites(Step):
    name = "record_creation_sites"
    phase = "tensorflow"

    def detail(self) -> str:
        return "record where variables are created, for the scope audit"

    def _take(self) -> str | None:
        from tfstrategy.scope.creation_sites import start_recording

        return "on in this thread, for the scope audit" if start_recording() else None


class KeepLedger(Step):
    """Under ``tfstrategy launch``: the worker's ledger beside its progress file (:mod:`tfstrategy.runtime.ledger`).

    The start-up hook takes it (and ``select()`` in a worker the hook already serves finds it taken).
    """

    name = "ledger"
    phase = "tensorflow"
    rewrites = True

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        return inputs.under_launcher

    def detail(self) -> str:
        return ("keep the worker's ledger for the launcher: per-epoch batches and steps, end of data, the user's "
                "frame, step, input and py_function times, a fingerprint of each traced train/eval function")

    def _take(self) -> str | None:
        from tfstrategy.runtime.ledger import keep_ledger
        from tfstrategy.runtime.ledger_traces import fingerprint_traces

        return keep_ledger(fingerprint_traces)

    def undo(self) -> None:
        if self.state == "taken":
            from tfstrategy.runtime.ledger import stop_ledger

            stop_ledger()
        super().undo()


class SignalLauncher(Step):
    """Under ``tfstrategy launch``: "creating" before the strategy, "joined" after (select() only)."""

    name = "signal_launcher"
    phase = "strategy"

    def __init__(self, inputs: PlanInputs) -> None:
        super().__init__(inputs)
        self._starting = False

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        return inputs.under_launcher

    def detail(self) -> str:
        return "tell tfstrategy launch 'creating' before the strategy and 'joined' after"

    def _take(self) -> str | None:
        from tfstrategy.multiworker.worker_protocol import signal_starting

        self._starting = signal_starting()
        return None

    def after_build(self) -> str | None:
        from tfstrategy.multiworker.worker_protocol import signal_joined

        if signal_joined() or self._starting:
            self.state, self.done = "taken", "told tfstrategy launch this worker joined"
            return self.done
        return None


class ApplyPatches(Step):
    name = "apply_patches"
    phase = "keras"
    rewrites = True

    def __init__(self, inputs: PlanInputs) -> None:
        super().__init__(inputs)
        #: What each Keras workaround found and installed, once taken.
        self.statuses: tuple[PatchStatus, ...] = ()

    def detail(self) -> str:
        return "the Keras workarounds the installed release needs"

    def change(self) -> str | None:
        """What each workaround fixed in this script (installed ones that never acted say nothing)."""
        from tfstrategy.patches import PATCHES

        fixed = [text for text in (patch.change() for patch in PATCHES.values()) if text]
        return "; ".join(fixed) or None

    def change_in_short(self) -> str | None:
        """The exit summary's words without ``--debug``: which workarounds acted, by name (their upstream rows in
        docs/reference/upstream-bugs.md), not what each did."""
        from tfstrategy.patches import PATCHES

        acted = [name for name, patch in PATCHES.items() if patch.change()]
        if not acted:
            return None
        return f"Keras workarounds acted: {', '.join(acted)} (--debug says what each changed)"

    def _take(self) -> str | None:
        from tfstrategy.patches import apply_patches

        self.statuses = apply_patches()
        installed = [status.name for status in self.statuses if status.installed]
        if self.inputs.consumer != SELECT:
            RUNTIME.hook.patches = installed
        return ", ".join(installed) or None


class SetPrecision(Step):
    name = "set_precision"
    phase = "keras"
    fatal = True

    def __init__(self, inputs: PlanInputs) -> None:
        super().__init__(inputs)
        self._previous: str | None = None

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        return inputs.precision is not None

    def detail(self) -> str:
        return f"set the Keras global dtype policy to {self.inputs.precision} before the model is built"

    def change(self) -> str | None:
        if self.state != "taken" or self.inputs.consumer == SELECT:
            return None
        return f"Keras' dtype policy set to {self.inputs.precision}"

    def _take(self) -> str | None:
        from tfstrategy.training.precision import global_policy, set_precision

        if self.inputs.precision is None:
            return None
        self._previous = global_policy()
        return set_precision(self.inputs.precision)

    def undo(self) -> None:
        if self.state == "taken" and self._previous is not None:
            from tfstrategy.errors import TFStrategyError
            from tfstrategy.training.precision import set_precision

            try:
                set_precision(self._previous)
            except TFStrategyError:  # a policy of the script's own (e.g. float64): leave it to the script
                pass
        super().undo()


#: ``select()``'s steps, in the order it takes them.
SELECT_STEPS: tuple[type[Step], ...] = (SplitCpu, SetTFConfig, RecordCreationSites, KeepLedger, SignalLauncher,
                                        ApplyPatches, SetPrecision)

