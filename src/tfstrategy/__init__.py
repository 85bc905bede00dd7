"""tfstrategy: TensorFlow distribution strategies made correct, checked and fast."""

from tfstrategy._tf import ensure_tensorflow_installed

ensure_tensorflow_installed()

from tfstrategy.check import CheckReport, run_check  # noqa: E402
from tfstrategy.cluster import (  # noqa: E402
    ClusterConfig,
    load_cluster_config,
    tf_config_from_hosts,
    tf_config_from_slurm,
    validate_tf_config,
)
from tfstrategy.devices import Device, parse_devices, resolve_devices  # noqa: E402
from tfstrategy.errors import (  # noqa: E402
    ClusterConfigError,
    DeviceError,
    LaunchError,
    MissingDependencyError,
    RuntimeInitializedError,
    SaveError,
    SettingsConflictError,
    StrategyError,
    TFStrategyError,
)
from tfstrategy.host import HostInfo  # noqa: E402
from tfstrategy.launcher import LaunchResult, launch  # noqa: E402
from tfstrategy.mwms_fix import apply_keras_mwms_fix  # noqa: E402
from tfstrategy.runtime import configure_cpu_replicas  # noqa: E402
from tfstrategy.saving import save_model  # noqa: E402
from tfstrategy.selection import Choice, Selection, build, choose, select  # noqa: E402
from tfstrategy.settings import StrategyKind  # noqa: E402
from tfstrategy.worker import backup_callbacks, signal_joined  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CheckReport",
    "Choice",
    "ClusterConfig",
    "ClusterConfigError",
    "Device",
    "DeviceError",
    "HostInfo",
    "LaunchError",
    "LaunchResult",
    "MissingDependencyError",
    "RuntimeInitializedError",
    "SaveError",
    "Selection",
    "SettingsConflictError",
    "StrategyError",
    "StrategyKind",
    "TFStrategyError",
    "apply_keras_mwms_fix",
    "backup_callbacks",
    "build",
    "choose",
    "configure_cpu_replicas",
    "launch",
    "load_cluster_config",
    "parse_devices",
    "resolve_devices",
    "run_check",
    "save_model",
    "select",
    "signal_joined",
    "tf_config_from_hosts",
    "tf_config_from_slurm",
    "validate_tf_config",
]
