"""tfstrategy: TensorFlow distribution strategies made correct, checked and fast."""

from tfstrategy._tf import ensure_tensorflow_installed

ensure_tensorflow_installed()

from tfstrategy.audit import (  # noqa: E402
    AuditReport,
    VariableRecord,
    audit_scope,
    guard_model,
    require_scope,
    scope_guard,
)
from tfstrategy.batching import BatchPlan, plan_batch  # noqa: E402
from tfstrategy.build import BuildReport, build_in_scope  # noqa: E402
from tfstrategy.check import CheckReport, run_check  # noqa: E402
from tfstrategy.cluster import (  # noqa: E402
    ClusterConfig,
    load_cluster_config,
    tf_config_from_hosts,
    tf_config_from_slurm,
    validate_tf_config,
)
from tfstrategy.data import plan_dataset, prepare_dataset  # noqa: E402
from tfstrategy.devices import Device, parse_devices, resolve_devices  # noqa: E402
from tfstrategy.env_report import EnvReport, collect_env_report, env_report_as_dict, format_env_report  # noqa: E402
from tfstrategy.equivalence import EquivalenceReport, replica_equivalence  # noqa: E402
from tfstrategy.errors import (  # noqa: E402
    BatchError,
    BuildError,
    CheckpointError,
    ClusterConfigError,
    DeviceError,
    LaunchError,
    LossReductionError,
    MissingDependencyError,
    RuntimeInitializedError,
    SaveError,
    ScopeError,
    SettingsConflictError,
    StrategyError,
    TFStrategyError,
    TrainingError,
)
from tfstrategy.host import HostInfo  # noqa: E402
from tfstrategy.launcher import LaunchResult, launch  # noqa: E402
from tfstrategy.mwms_fix import apply_keras_mwms_fix  # noqa: E402
from tfstrategy.restore import RestoreReport, restore_checkpoint  # noqa: E402
from tfstrategy.runtime import configure_cpu_replicas  # noqa: E402
from tfstrategy.saving import save_model  # noqa: E402
from tfstrategy.selection import Choice, Selection, build, choose, select  # noqa: E402
from tfstrategy.settings import StrategyKind  # noqa: E402
from tfstrategy.sites import recording, start_recording  # noqa: E402
from tfstrategy.steps_per_execution import fix_steps_per_execution  # noqa: E402
from tfstrategy.training import TrainStep, make_train_step  # noqa: E402
from tfstrategy.worker import backup_callbacks, signal_joined  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AuditReport",
    "BatchError",
    "BatchPlan",
    "BuildError",
    "BuildReport",
    "CheckReport",
    "CheckpointError",
    "Choice",
    "ClusterConfig",
    "ClusterConfigError",
    "Device",
    "DeviceError",
    "EnvReport",
    "EquivalenceReport",
    "HostInfo",
    "LaunchError",
    "LaunchResult",
    "LossReductionError",
    "MissingDependencyError",
    "RestoreReport",
    "RuntimeInitializedError",
    "SaveError",
    "ScopeError",
    "Selection",
    "SettingsConflictError",
    "StrategyError",
    "StrategyKind",
    "TFStrategyError",
    "TrainStep",
    "TrainingError",
    "VariableRecord",
    "apply_keras_mwms_fix",
    "audit_scope",
    "backup_callbacks",
    "build",
    "build_in_scope",
    "choose",
    "collect_env_report",
    "configure_cpu_replicas",
    "env_report_as_dict",
    "fix_steps_per_execution",
    "format_env_report",
    "guard_model",
    "launch",
    "load_cluster_config",
    "make_train_step",
    "parse_devices",
    "plan_batch",
    "plan_dataset",
    "prepare_dataset",
    "recording",
    "replica_equivalence",
    "require_scope",
    "resolve_devices",
    "restore_checkpoint",
    "run_check",
    "save_model",
    "scope_guard",
    "select",
    "signal_joined",
    "start_recording",
    "tf_config_from_hosts",
    "tf_config_from_slurm",
    "validate_tf_config",
]
