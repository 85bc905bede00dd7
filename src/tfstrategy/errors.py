"""The exceptions tfstrategy raises.

Every error a user can cause derives from :class:`TFStrategyError`, so a script
can catch one class and the CLI can turn any of them into one clear line.
Each message says what was received, what was expected and how to fix it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING


class TFStrategyError(Exception):
    """Base class of every error tfstrategy raises on bad input or state."""

    # Autograph re-raises an error from a traced function as its own type only when that type's
    # __init__ is Exception's (else as a StagingError); the ValueError mixins of the subclasses would hide it.
    if TYPE_CHECKING:
        def __init__(self, *args: object) -> None: ...
    else:
        __init__ = Exception.__init__


class DeviceError(TFStrategyError, ValueError):
    """A device specification is malformed or names devices this host lacks."""


class StrategyError(TFStrategyError, ValueError):
    """A strategy kind is unknown, or cannot be built with these settings."""


class SettingsConflictError(TFStrategyError, ValueError):
    """Code and a ``TFSTRATEGY_*`` environment variable ask for different things."""


class RuntimeInitializedError(TFStrategyError, RuntimeError):
    """The TensorFlow runtime started before a setting that must precede it."""


class ClusterConfigError(TFStrategyError, ValueError):
    """``TF_CONFIG`` (or the values used to build it) is malformed."""


class MissingDependencyError(TFStrategyError, ImportError):
    """An optional dependency (TensorFlow itself, matplotlib, ...) is missing."""


class UnsupportedVersionError(TFStrategyError, RuntimeError):
    """The installed TensorFlow or Keras is older than tfstrategy supports."""


class PlatformError(TFStrategyError, RuntimeError):
    """This system lacks a tool or permission a feature needs (e.g. ``unshare`` for network isolation)."""


class PeerTimeoutError(TFStrategyError, TimeoutError):
    """Another task of the ``TF_CONFIG`` cluster did not start within the time allowed."""


class SaveError(TFStrategyError, ValueError):
    """A save path tfstrategy cannot write under a distribution strategy."""


class LaunchError(TFStrategyError, ValueError):
    """``tfstrategy launch`` received options or a command it cannot run."""


class ScopeError(TFStrategyError, RuntimeError):
    """Model, optimizer or metric variables were created outside the strategy's scope."""


class CheckpointError(TFStrategyError, ValueError):
    """A checkpoint to restore is missing, unreadable, or does not match the model."""


class BackupError(CheckpointError):
    """A coordinated backup is partial, truncated, unparsable, of another job, or cannot be resumed on every worker."""


class BackupLockedError(BackupError):
    """Another job (or process) holds the backup directory's lock."""


class UntrustedBackupError(BackupError):
    """A backup directory or file is owned by another user or writable by other users."""


class BuildError(TFStrategyError, ValueError):
    """``build_in_scope`` received something it cannot build a compiled model from."""


class BatchError(TFStrategyError, ValueError):
    """A batch size, dataset size or dataset shape cannot be split evenly across replicas."""


class TrainingError(TFStrategyError, ValueError):
    """A training helper was given a model, optimizer or step setting it cannot use."""


class LossReductionError(TrainingError):
    """A loss averages per replica, which scales gradients wrongly under a strategy."""


class PrecisionError(TFStrategyError, ValueError):
    """A precision (Keras dtype policy) setting is not one tfstrategy can set."""


class DivergenceError(TFStrategyError, RuntimeError):
    """Replicas or workers no longer hold the same weights, or weights or loss are not finite."""
