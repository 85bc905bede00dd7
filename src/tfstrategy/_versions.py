"""Which TensorFlow and Keras are installed, and whether tfstrategy supports them.

Every version comparison in tfstrategy goes through :func:`parse` and
:func:`at_least`; nothing else parses a version string. Versions are read from
package metadata, never by importing TensorFlow or Keras (seconds each, and
TensorFlow must not start before ``cpu_replicas`` splits the CPU).

Supported (each measured; see CONTRIBUTING.md for the version table):

- TensorFlow 2.16 and later (``tensorflow`` or ``tensorflow-cpu``).
- Keras 3.10 and later. Keras 3.0-3.7 do not scale the loss for distribution
  (``fit`` on 4 replicas differs from 1 replica by 0.6 on the equivalence check);
  3.8 and 3.9 train correctly but ``evaluate`` on 2+ replicas reports wrong loss
  and metrics (4 replicas: loss 17.04 where 1 replica gives 16.62, measured on
  TF 2.16 and 2.20). 3.10 is the first release where both match one replica.
- tf_keras 2.16 and later when ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras`` tf_keras.

Which of the two ``tf.keras`` is comes from :func:`keras_package`: what it
resolved to once TensorFlow is imported and used, else the variable.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

# Which Keras tf.keras is reads TensorFlow's lazy loader, a private name: _compat owns it, and these names
# stay importable here.
from tfstrategy._compat.keras_flavour import LEGACY_KERAS_TRUE as LEGACY_KERAS_TRUE
from tfstrategy._compat.keras_flavour import keras_package as keras_package
from tfstrategy._compat.keras_flavour import legacy_keras_requested as legacy_keras_requested
from tfstrategy.errors import UnsupportedVersionError

MIN_TENSORFLOW = "2.16"
MIN_KERAS = "3.10"
MIN_TF_KERAS = "2.16"

_TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-macos", "tensorflow-intel", "tf-nightly")


def parse(text: str) -> Version:
    """A comparable version; an unparsable string counts as ``0``."""
    try:
        return Version(str(text))
    except InvalidVersion:
        return Version("0")


def at_least(version: str, minimum: str) -> bool:
    """Whether ``version`` is ``minimum`` or newer, ignoring pre-release tags of the same release."""
    return parse(version).release >= parse(minimum).release


def newer_than(version: str, reference: str) -> bool:
    """Whether ``version`` is a later release than ``reference``."""
    return parse(version).release > parse(reference).release


def installed(*distributions: str) -> str | None:
    """The version of the first of ``distributions`` that is installed, else ``None``."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True, kw_only=True)
class Versions:
    """The installed TensorFlow and the Keras that ``tf.keras`` resolves to."""

    tensorflow: str | None
    keras: str | None
    #: ``"keras"`` (Keras 3) or ``"tf_keras"`` (legacy Keras 2 under TF_USE_LEGACY_KERAS).
    keras_package: str

    @property
    def legacy_keras(self) -> bool:
        return self.keras_package == "tf_keras"

    def describe(self) -> str:
        return f"tensorflow {self.tensorflow or 'missing'}, {self.keras_package} {self.keras or 'missing'}"

    def problem(self) -> str | None:
        """Why this combination is unsupported, with the fix; ``None`` when it is supported."""
        if self.tensorflow is None:
            return None  # reported by _tf.tf() (MissingDependencyError) with its own install hint
        if not at_least(self.tensorflow, MIN_TENSORFLOW):
            return (
                f"Received TensorFlow {self.tensorflow}; tfstrategy needs TensorFlow {MIN_TENSORFLOW} or later. "
                f"Upgrade with pip install 'tensorflow-cpu>={MIN_TENSORFLOW}' (or 'tensorflow>={MIN_TENSORFLOW}')."
            )
        if self.legacy_keras:
            if self.keras is None:
                return (
                    "Received TF_USE_LEGACY_KERAS=1, which makes tf.keras load tf_keras, but tf_keras is not "
                    "installed. Install it with pip install 'tf-keras>=2.16', or unset TF_USE_LEGACY_KERAS."
                )
            if not at_least(self.keras, MIN_TF_KERAS):
                return (
                    f"Received tf_keras {self.keras}; tfstrategy needs tf_keras {MIN_TF_KERAS} or later. "
                    f"Upgrade with pip install 'tf-keras>={MIN_TF_KERAS}'."
                )
            return None
        if self.keras is None:
            return f"Received no keras package; tf.keras needs it. Install it with pip install 'keras>={MIN_KERAS}'."
        if not at_least(self.keras, MIN_KERAS):
            return (
                f"Received Keras {self.keras}; tfstrategy needs Keras {MIN_KERAS} or later: before 3.8 Keras does "
                "not scale the loss across replicas (distributed fit trains a different model than one device), "
                "and 3.8-3.9 report wrong evaluation metrics on 2+ replicas. Upgrade with pip install "
                f"'keras>={MIN_KERAS}', or use tf_keras (pip install tf-keras; TF_USE_LEGACY_KERAS=1)."
            )
        return None


def detect(env: Mapping[str, str] | None = None) -> Versions:
    """Read the installed versions from package metadata (no import); the flavour from :func:`keras_package`."""
    return _detect(keras_package(env))


def _detect(package: str) -> Versions:
    legacy = package == "tf_keras"
    return Versions(
        tensorflow=installed(*_TENSORFLOW_DISTRIBUTIONS),
        keras=installed("tf-keras", "tf_keras") if legacy else installed("keras"),
        keras_package=package,
    )


@functools.cache
def _cached_problem(package: str) -> str | None:
    return _detect(package).problem()


def require_supported(env: Mapping[str, str] | None = None) -> None:
    """Raise :class:`UnsupportedVersionError` on a TensorFlow/Keras tfstrategy does not support.

    Raises:
        UnsupportedVersionError: names the installed version, the minimum and the upgrade.
    """
    problem = _cached_problem(keras_package()) if env is None else detect(env).problem()
    if problem is not None:
        raise UnsupportedVersionError(problem)
