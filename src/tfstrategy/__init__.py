"""tfstrategy: TensorFlow distribution strategies made correct, checked and fast.

The public API is the names in ``__all__``; errors live in :mod:`tfstrategy.errors`.
Names from earlier releases that moved still resolve, with a DeprecationWarning
that gives their new home.

Importing the package needs no TensorFlow (``tfstrategy k8s`` and ``tfstrategy env``
work without it); the first call that does raises
:class:`~tfstrategy.errors.MissingDependencyError` with the extra to install.
"""

import importlib as _importlib
import typing as _typing
import warnings as _warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names, for type checkers and the API docs; imported on first use
    from tfstrategy.diagnostics.check import run_check
    from tfstrategy.diagnostics.equivalence import replica_equivalence
    from tfstrategy.errors import TFStrategyError
    from tfstrategy.launch.library import launch
    from tfstrategy.multiworker.chief_files import is_chief
    from tfstrategy.multiworker.cluster import tf_config_from_hosts
    from tfstrategy.multiworker.preemption import preemption_callbacks
    from tfstrategy.multiworker.saving import save_model
    from tfstrategy.multiworker.worker_protocol import backup_callbacks
    from tfstrategy.patches import patch_status
    from tfstrategy.performance.report import performance_report
    from tfstrategy.runtime.select import Selection, select
    from tfstrategy.scope.audit import audit_scope, require_scope, scope_guard
    from tfstrategy.scope.build import build_in_scope
    from tfstrategy.scope.restore import restore_checkpoint
    from tfstrategy.state.registry import reset
    from tfstrategy.training.batching import plan_batch
    from tfstrategy.training.custom_loop import make_train_step
    from tfstrategy.training.datasets import plan_dataset, prepare_dataset
    from tfstrategy.training.sentinel import divergence_sentinel
    from tfstrategy.training.steps_per_execution import tune_steps_per_execution

from tfstrategy._release import __version__ as __version__

__all__ = [
    # Select the strategy (how-to steps 2 and 5).
    "select",
    "Selection",
    # Build in scope and audit (step 2).
    "build_in_scope",
    "audit_scope",
    "require_scope",
    "scope_guard",
    "restore_checkpoint",
    # Batching, input pipelines, training (steps 3 and 4).
    "plan_batch",
    "plan_dataset",
    "prepare_dataset",
    "make_train_step",
    "divergence_sentinel",
    "tune_steps_per_execution",
    "performance_report",
    # Keras workarounds.
    "patch_status",
    "reset",
    # Diagnostics (steps 1 and 6).
    "run_check",
    "replica_equivalence",
    # Multi-worker.
    "launch",
    "backup_callbacks",
    "preemption_callbacks",
    "save_model",
    "is_chief",
    "tf_config_from_hosts",
    # Errors: the base class; every error class is in tfstrategy.errors.
    "TFStrategyError",
]

# The subpackage tfstrategy.launch, loaded now: its first import would set the package's attribute
# `launch` to it, hiding the public function of that name (which then loads on first use).
_importlib.import_module("tfstrategy.launch")
globals().pop("launch")

#: Each public name -> the module it lives in; imported on first use, so ``tfstrategy check`` and
#: ``import tfstrategy`` pay only for what they touch.
_PUBLIC = {
    "run_check": "tfstrategy.diagnostics.check",
    "replica_equivalence": "tfstrategy.diagnostics.equivalence",
    "TFStrategyError": "tfstrategy.errors",
    "launch": "tfstrategy.launch.library",
    "is_chief": "tfstrategy.multiworker.chief_files",
    "tf_config_from_hosts": "tfstrategy.multiworker.cluster",
    "preemption_callbacks": "tfstrategy.multiworker.preemption",
    "save_model": "tfstrategy.multiworker.saving",
    "backup_callbacks": "tfstrategy.multiworker.worker_protocol",
    "patch_status": "tfstrategy.patches",
    "performance_report": "tfstrategy.performance.report",
    "reset": "tfstrategy.state.registry",
    "audit_scope": "tfstrategy.scope.audit",
    "require_scope": "tfstrategy.scope.audit",
    "scope_guard": "tfstrategy.scope.audit",
    "build_in_scope": "tfstrategy.scope.build",
    "restore_checkpoint": "tfstrategy.scope.restore",
    "Selection": "tfstrategy.runtime.select",
    "select": "tfstrategy.runtime.select",
    "plan_batch": "tfstrategy.training.batching",
    "make_train_step": "tfstrategy.training.custom_loop",
    "plan_dataset": "tfstrategy.training.datasets",
    "prepare_dataset": "tfstrategy.training.datasets",
    "divergence_sentinel": "tfstrategy.training.sentinel",
    "tune_steps_per_execution": "tfstrategy.training.steps_per_execution",
}

#: The release that removes the 0.1 names below (each still resolves with a DeprecationWarning until then).
_ALIASES_REMOVED_IN = "0.4"
#: Names exported by tfstrategy 0.1 (or 0.2's top level) that moved: name -> module that has it now.
_MOVED = {
    "AuditReport": "tfstrategy.scope.audit",
    "VariableRecord": "tfstrategy.scope.audit",
    "guard_model": "tfstrategy.scope.audit",
    "BatchPlan": "tfstrategy.training.batching",
    "BuildReport": "tfstrategy.scope.build",
    "CheckReport": "tfstrategy.diagnostics.check",
    "Choice": "tfstrategy.selection.choose",
    "ClusterConfig": "tfstrategy.multiworker.cluster",
    "load_cluster_config": "tfstrategy.multiworker.cluster",
    "validate_tf_config": "tfstrategy.multiworker.cluster",
    "Device": "tfstrategy.selection.devices",
    "parse_devices": "tfstrategy.selection.devices",
    "resolve_devices": "tfstrategy.selection.devices",
    "EnvReport": "tfstrategy.diagnostics.env_report",
    "env_report_as_dict": "tfstrategy.diagnostics.env_report",
    "format_env_report": "tfstrategy.diagnostics.env_report",
    "EquivalenceReport": "tfstrategy.diagnostics.equivalence",
    "LaunchResult": "tfstrategy.launch.supervisor",
    "RestoreReport": "tfstrategy.scope.restore",
    "TrainStep": "tfstrategy.training.custom_loop",
    "apply_keras_mwms_fix": "tfstrategy.patches.keras_mwms",
    "recording": "tfstrategy.scope.creation_sites",
    "start_recording": "tfstrategy.scope.creation_sites",
    # Top-level in 0.2, not what a training script calls (the pure choice and build that select() runs, the
    # CPU split, the patches and the join signal that select() and the hook take as steps, the env report
    # that `tfstrategy env` prints, the Slurm TF_CONFIG that select() derives): their modules keep them.
    "StrategyKind": "tfstrategy.settings",
    "choose": "tfstrategy.selection.choose",
    "build": "tfstrategy.selection.strategies",
    "HostInfo": "tfstrategy.selection.host",
    "configure_cpu_replicas": "tfstrategy.selection.cpu_split",
    "fix_steps_per_execution": "tfstrategy.patches.keras_steps_per_execution",
    "apply_patches": "tfstrategy.patches",
    "collect_env_report": "tfstrategy.diagnostics.env_report",
    "signal_joined": "tfstrategy.multiworker.worker_protocol",
    "tf_config_from_slurm": "tfstrategy.environments.slurm",
    **{
        name: "tfstrategy.errors"
        for name in (
            "BatchError", "BuildError", "CheckpointError", "ClusterConfigError", "DeviceError", "LaunchError",
            "LossReductionError", "MissingDependencyError", "RuntimeInitializedError", "SaveError", "ScopeError",
            "SettingsConflictError", "StrategyError", "TrainingError",
        )
    },
}


def __getattr__(name: str) -> _typing.Any:
    home = _PUBLIC.get(name)
    if home is not None:
        value = getattr(_importlib.import_module(home), name)
        globals()[name] = value  # later lookups are plain attribute reads
        return value
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module 'tfstrategy' has no attribute {name!r}")
    _warnings.warn(
        f"tfstrategy.{name} moved out of the top-level API; import it from {module} "
        f"(from {module} import {name}). The old name is removed in tfstrategy {_ALIASES_REMOVED_IN}.",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(_importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
