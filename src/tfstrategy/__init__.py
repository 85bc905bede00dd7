"""tfstrategy: TensorFlow distribution strategies made correct, checked and fast."""

from tfstrategy._tf import ensure_tensorflow_installed

ensure_tensorflow_installed()

from tfstrategy.audit import AuditReport, VariableRecord, audit_scope, guard_model, require_scope, scope_guard  # noqa: E402
from tfstrategy.check import CheckReport, run_check  # noqa: E402
from tfstrategy.devices import Device, parse_devices, resolve_devices  # noqa: E402
from tfstrategy.errors import (  # noqa: E402
    CheckpointError,
    ClusterConfigError,
    DeviceError,
    MissingDependencyError,
    RuntimeInitializedError,
    ScopeError,
    SettingsConflictError,
    StrategyError,
    TFStrategyError,
)
from tfstrategy.host import HostInfo  # noqa: E402
from tfstrategy.runtime import configure_cpu_replicas  # noqa: E402
from tfstrategy.selection import Choice, Selection, build, choose, select  # noqa: E402
from tfstrategy.settings import StrategyKind  # noqa: E402
from tfstrategy.sites import recording, start_recording  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AuditReport",
    "CheckpointError",
    "ScopeError",
    "VariableRecord",
    "audit_scope",
    "guard_model",
    "recording",
    "require_scope",
    "scope_guard",
    "start_recording",
    "CheckReport",
    "Choice",
    "ClusterConfigError",
    "Device",
    "DeviceError",
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
    "configure_cpu_replicas",
    "parse_devices",
    "resolve_devices",
    "run_check",
    "select",
]
