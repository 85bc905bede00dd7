"""Supported TensorFlow/Keras versions: one rule, one clear refusal for anything older."""

from __future__ import annotations

import re

import pytest

from tfstrategy import _versions
from tfstrategy._versions import Versions
from tfstrategy.errors import UnsupportedVersionError


@pytest.mark.parametrize(
    ("versions", "problem"),
    [
        pytest.param(Versions(tensorflow="2.21.0", keras="3.15.1", keras_package="keras"), None, id="newest"),
        pytest.param(Versions(tensorflow="2.16.2", keras="3.10.0", keras_package="keras"), None, id="oldest"),
        pytest.param(Versions(tensorflow="2.22.0rc0", keras="3.16.0.dev2026", keras_package="keras"), None, id="pre-releases"),
        pytest.param(Versions(tensorflow="2.21.0", keras="2.21.0", keras_package="tf_keras"), None, id="tf-keras"),
        pytest.param(
            Versions(tensorflow="2.18.1", keras="3.8.0", keras_package="keras"),
            r"Received Keras 3\.8\.0; tfstrategy needs Keras 3\.10 or later: .*3\.8-3\.9 report wrong evaluation "
            r"metrics.*pip install 'keras>=3\.10'",
            id="keras-3.8-evaluates-wrongly",
        ),
        pytest.param(
            Versions(tensorflow="2.18.1", keras="3.5.0", keras_package="keras"),
            r"Received Keras 3\.5\.0;.*does not scale the loss across replicas",
            id="keras-3.5-unscaled-loss",
        ),
        pytest.param(
            Versions(tensorflow="2.15.1", keras="3.10.0", keras_package="keras"),
            r"Received TensorFlow 2\.15\.1; tfstrategy needs TensorFlow 2\.16 or later",
            id="old-tensorflow",
        ),
        pytest.param(
            Versions(tensorflow="2.21.0", keras="2.15.0", keras_package="tf_keras"),
            r"Received tf_keras 2\.15\.0; tfstrategy needs tf_keras 2\.16 or later",
            id="old-tf-keras",
        ),
        pytest.param(
            Versions(tensorflow="2.21.0", keras=None, keras_package="tf_keras"),
            r"TF_USE_LEGACY_KERAS=1.*tf_keras is not installed.*pip install 'tf-keras>=2\.16'",
            id="legacy-without-tf-keras",
        ),
    ],
)
def test_supported_range(versions, problem):
    if problem is None:
        assert versions.problem() is None
    else:
        assert versions.problem() is not None
        assert re.search(problem, versions.problem())


@pytest.mark.parametrize(
    ("version", "minimum", "expected"),
    [
        pytest.param("3.10.0", "3.10", True, id="equal"),
        pytest.param("3.9.2", "3.10", False, id="numeric-not-lexical"),
        pytest.param("3.16.0.dev2026", "3.16", True, id="dev-release-counts-as-its-release"),
        pytest.param("garbage", "3.10", False, id="unparsable-is-old"),
    ],
)
def test_at_least(version, minimum, expected):
    assert _versions.at_least(version, minimum) is expected


def test_this_environment_is_supported():
    versions = _versions.detect()
    assert versions.problem() is None, versions.describe()
    _versions.require_supported()


def test_legacy_keras_follows_tensorflow_own_rule():
    assert _versions.legacy_keras_requested({"TF_USE_LEGACY_KERAS": "1"})
    assert _versions.legacy_keras_requested({"TF_USE_LEGACY_KERAS": "True"})
    assert not _versions.legacy_keras_requested({"TF_USE_LEGACY_KERAS": "yes"})  # TensorFlow ignores it too
    assert _versions.detect({"TF_USE_LEGACY_KERAS": "1"}).keras_package == "tf_keras"


def test_select_refuses_an_unsupported_combination_with_one_clear_error(monkeypatch):
    monkeypatch.setattr(_versions, "installed", lambda *names: "3.8.0" if "keras" in names else "2.18.1")
    import tfstrategy

    with pytest.raises(UnsupportedVersionError, match=r"^Received Keras 3\.8\.0; tfstrategy needs Keras 3\.10"):
        tfstrategy.select(env={})
