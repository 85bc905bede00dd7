"""The start-up hook's own steps (``tfstrategy run`` and ``launch``), and the hook's plan.

Each step's work is a function of :mod:`~tfstrategy.runtime.hook_strategies`,
:mod:`~tfstrategy.runtime.hook_checkpoints`, :mod:`~tfstrategy.runtime.hook_datasets`,
:mod:`~tfstrategy.runtime.hook_keras` or :mod:`~tfstrategy.runtime.worker_watch`,
installed as undoable :class:`~tfstrategy.runtime.rewrites.Rewrite` objects.
"""

from __future__ import annotations

from tfstrategy.multiworker.cluster import ClusterConfig
from tfstrategy.runtime.inputs import PlanInputs
from tfstrategy.runtime.step import Step
from tfstrategy.runtime.steps import (
    ApplyPatches,
    KeepLedger,
    RecordCreationSites,
    SetPrecision,
    SetTFConfig,
    SplitCpu,
)
from tfstrategy.state.registry import RUNTIME

__all__ = ["HOOK_STEPS"]


def _multi(inputs: PlanInputs) -> ClusterConfig | None:
    return inputs.cluster if inputs.multi_worker else None


class _MultiWorkerStep(Step):
    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        return inputs.multi_worker


class PrepareCollectives(_MultiWorkerStep):
    name = "prepare_collectives"
    phase = "tensorflow"

    def detail(self) -> str:
        return (f"configure the multi-worker runtime of {self.inputs.cluster_tasks} workers before the script's first "
                "op, so ops before the strategy do not stop it joining; list_logical_devices() lists this worker's "
                "own devices until it joins, as in plain TensorFlow")

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_strategies import prepare_collectives

        return prepare_collectives(_multi(self.inputs))


class WatchStrategies(Step):
    name = "watch_strategies"
    phase = "tensorflow"
    rewrites = True

    def detail(self) -> str:
        return ("name every strategy created in the summary; MultiWorkerMirroredStrategy signals the launcher (and "
                "gets the collective timeout, if one is set)")

    def change(self) -> str | None:
        if not (self.inputs.multi_worker and RUNTIME.hook.joined):
            return None
        joined = f"{self.inputs.cluster_tasks} workers joined one MultiWorkerMirroredStrategy"
        if self.inputs.collective_timeout is None:
            return joined
        from tfstrategy.settings import collective_timeout_cost

        return f"{joined}; {collective_timeout_cost(self.inputs.collective_timeout)}"

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_strategies import watch_strategies

        return watch_strategies(self.inputs.collective_timeout, self.inputs.flags.get("--cpu-replicas"))


class MirroredDevices(Step):
    name = "mirrored_devices"
    phase = "tensorflow"
    rewrites = True

    def detail(self) -> str:
        if self.inputs.multi_worker:
            return ("MirroredStrategy() becomes a MultiWorkerMirroredStrategy over the workers; a device list joins "
                    "only if it names this worker's devices, else it is refused")
        chosen = []
        if self.inputs.devices is not None:
            chosen.append(f"devices {self.inputs.devices.text}")
        if self.inputs.cpu_replicas is not None:
            chosen.append(f"{self.inputs.cpu_replicas} CPU replicas")
        head = f"MirroredStrategy() without devices uses {' and '.join(chosen)}; " if chosen else ""
        overrides = "; a list that overrides these settings is reported" if chosen else ""
        return head + "an explicit device list must exist on this host (as in select(devices=...))" + overrides

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_strategies import mirrored_devices

        return mirrored_devices(self.inputs)


class RefuseUnjoinable(_MultiWorkerStep):
    name = "refuse_unjoinable"
    phase = "tensorflow"
    rewrites = True

    def detail(self) -> str:
        return ("OneDeviceStrategy, CentralStorageStrategy, ParameterServerStrategy, ClusterCoordinator and "
                "TPUStrategy stop at creation with one line; a worker that ran ops but never joined exits 1")

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_strategies import refuse_unjoinable

        return refuse_unjoinable(_multi(self.inputs))


class CheckpointFiles(_MultiWorkerStep):
    name = "checkpoint_files"
    phase = "tensorflow"
    rewrites = True

    def detail(self) -> str:
        return ("tf.train.Checkpoint and CheckpointManager files are written by the chief only (the other workers "
                "write a private copy and wait for the chief's)")

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_checkpoints import checkpoint_files

        return checkpoint_files()


class DataSharding(_MultiWorkerStep):
    name = "data_sharding"
    phase = "tensorflow"
    rewrites = True

    def detail(self) -> str:
        return ("a dataset reading fewer files than there are workers is sharded by element (AutoShardPolicy.DATA), "
                "where TensorFlow's sharding by file fails")

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_datasets import data_sharding

        return data_sharding()


class Keras2Aliases(Step):
    name = "keras2_aliases"
    phase = "keras"
    rewrites = True

    def detail(self) -> str:
        return "Metric.reset_states() calls reset_state() (the Keras 2 name TensorFlow's tutorials use)"

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_keras import keras2_aliases

        return keras2_aliases()


class Audit(Step):
    name = "audit"
    phase = "keras"
    rewrites = True

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        return inputs.audit != "off"

    def detail(self) -> str:
        return f"Model.fit and Model.evaluate audit the scope first ({self.inputs.audit})"

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_keras import audit

        return audit(self.inputs.audit)


class RefuseUnjoinedFit(_MultiWorkerStep):
    name = "refuse_unjoined_fit"
    phase = "keras"
    rewrites = True

    def detail(self) -> str:
        return "Model.fit() without any strategy, when none joined, stops before its first step"

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_strategies import refuse_unjoined_fit

        return refuse_unjoined_fit(_multi(self.inputs))


class CountBatches(Step):
    name = "count_batches"
    phase = "keras"
    rewrites = True

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        return inputs.under_launcher

    def detail(self) -> str:
        return ("Model.fit, evaluate and predict count their batches for the launcher's stall detection "
                "(tfstrategy.runtime.worker_watch)")

    def _take(self) -> str | None:
        from tfstrategy.runtime import worker_watch
        from tfstrategy.runtime.hook_strategies import keras_flavours

        return worker_watch.count_batches(keras_flavours())


class PerformanceReport(Step):
    name = "performance_report"
    phase = "keras"
    rewrites = True

    @classmethod
    def applies(cls, inputs: PlanInputs) -> bool:
        return inputs.profile is not None

    def detail(self) -> str:
        return f"Model.fit reports where each step's time goes (tfstrategy.performance), into {self.inputs.profile}"

    def _take(self) -> str | None:
        from tfstrategy.runtime.hook_keras import performance_report

        return performance_report()


#: The hook's steps, in the order it takes them (phase by phase).
HOOK_STEPS: tuple[type[Step], ...] = (
    SplitCpu, RecordCreationSites, SetTFConfig, PrepareCollectives, WatchStrategies, MirroredDevices,
    RefuseUnjoinable, CheckpointFiles, DataSharding, KeepLedger, ApplyPatches, Keras2Aliases, Audit, RefuseUnjoinedFit,
    CountBatches, SetPrecision, PerformanceReport,
)
