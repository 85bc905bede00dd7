"""tfstrategy: TensorFlow distribution strategies made correct, checked and fast."""

from tfstrategy._tf import ensure_tensorflow_installed

ensure_tensorflow_installed()

from tfstrategy.batching import BatchPlan, plan_batch  # noqa: E402
from tfstrategy.check import CheckReport, run_check  # noqa: E402
from tfstrategy.data import plan_dataset, prepare_dataset  # noqa: E402
from tfstrategy.devices import Device, parse_devices, resolve_devices  # noqa: E402
from tfstrategy.equivalence import EquivalenceReport, replica_equivalence  # noqa: E402
from tfstrategy.errors import (  # noqa: E402
    BatchError,
    ClusterConfigError,
    DeviceError,
    LossReductionError,
    MissingDependencyError,
    RuntimeInitializedError,
    SettingsConflictError,
    StrategyError,
    TFStrategyError,
    TrainingError,
)
from tfstrategy.host import HostInfo  # noqa: E402
from tfstrategy.runtime import configure_cpu_replicas  # noqa: E402
from tfstrategy.selection import Choice, Selection, build, choose, select  # noqa: E402
from tfstrategy.settings import StrategyKind  # noqa: E402
from tfstrategy.steps_per_execution import fix_steps_per_execution  # noqa: E402
from tfstrategy.training import TrainStep, make_train_step  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BatchError",
    "BatchPlan",
    "CheckReport",
    "Choice",
    "ClusterConfigError",
    "Device",
    "DeviceError",
    "EquivalenceReport",
    "HostInfo",
    "LossReductionError",
    "MissingDependencyError",
    "RuntimeInitializedError",
    "Selection",
    "SettingsConflictError",
    "StrategyError",
    "StrategyKind",
    "TFStrategyError",
    "TrainStep",
    "TrainingError",
    "build",
    "choose",
    "configure_cpu_replicas",
    "fix_steps_per_execution",
    "make_train_step",
    "parse_devices",
    "plan_batch",
    "plan_dataset",
    "prepare_dataset",
    "replica_equivalence",
    "resolve_devices",
    "run_check",
    "select",
]
