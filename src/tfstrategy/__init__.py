"""tfstrategy: TensorFlow distribution strategies made correct, checked and fast."""

from tfstrategy._tf import ensure_tensorflow_installed

ensure_tensorflow_installed()

from tfstrategy.check import CheckReport, run_check  # noqa: E402
from tfstrategy.devices import Device, parse_devices, resolve_devices  # noqa: E402
from tfstrategy.env_report import EnvReport, collect_env_report, env_report_as_dict, format_env_report  # noqa: E402
from tfstrategy.errors import (  # noqa: E402
    ClusterConfigError,
    DeviceError,
    MissingDependencyError,
    RuntimeInitializedError,
    SettingsConflictError,
    StrategyError,
    TFStrategyError,
)
from tfstrategy.host import HostInfo  # noqa: E402
from tfstrategy.runtime import configure_cpu_replicas  # noqa: E402
from tfstrategy.selection import Choice, Selection, build, choose, select  # noqa: E402
from tfstrategy.settings import StrategyKind  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CheckReport",
    "Choice",
    "ClusterConfigError",
    "Device",
    "DeviceError",
    "EnvReport",
    "HostInfo",
    "MissingDependencyError",
    "RuntimeInitializedError",
    "Selection",
    "SettingsConflictError",
    "StrategyError",
    "StrategyKind",
    "TFStrategyError",
    "build",
    "choose",
    "collect_env_report",
    "configure_cpu_replicas",
    "env_report_as_dict",
    "format_env_report",
    "parse_devices",
    "resolve_devices",
    "run_check",
    "select",
]
