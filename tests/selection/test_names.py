"""One name per strategy: TensorFlow's internal class names never reach a user (issue 35)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tensorflow as tf

from tfstrategy.selection.names import DEFAULT_STRATEGY, strategy_name

SOURCES = Path(__file__).resolve().parents[2] / "src" / "tfstrategy"


@pytest.mark.parametrize(
    ("strategy_class", "name"),
    [
        pytest.param(tf.distribute.MultiWorkerMirroredStrategy, "MultiWorkerMirroredStrategy", id="mwms"),
        pytest.param(tf.distribute.experimental.MultiWorkerMirroredStrategy, "MultiWorkerMirroredStrategy",
                     id="experimental-mwms"),
        pytest.param(tf.distribute.MirroredStrategy, "MirroredStrategy", id="mirrored"),
        pytest.param(tf.distribute.OneDeviceStrategy, "OneDeviceStrategy", id="one-device"),
        pytest.param(tf.distribute.experimental.ParameterServerStrategy, "ParameterServerStrategy", id="ps"),
        pytest.param(tf.distribute.TPUStrategy, "TPUStrategy", id="tpu"),
        pytest.param(type(tf.distribute.get_strategy()), DEFAULT_STRATEGY, id="default"),
    ],
)
def test_each_strategy_class_has_the_name_users_create_it_by(strategy_class, name):
    assert strategy_name(strategy_class) == name


def test_instances_are_named_like_their_class():
    assert strategy_name(tf.distribute.get_strategy()) == "the default strategy"
    assert strategy_name(tf.distribute.MirroredStrategy(["/cpu:0"])) == "MirroredStrategy"
    assert strategy_name(None) == "the default strategy"


def test_a_users_own_subclass_keeps_its_name():
    class TrackedMirroredStrategy(tf.distribute.MirroredStrategy):
        pass

    assert strategy_name(TrackedMirroredStrategy) == "TrackedMirroredStrategy"


#: A strategy's class name formatted directly (it would print CollectiveAllReduceStrategy for MWMS).
_DIRECT = re.compile(r"type\((?:self\.|selection\.)?strategy\)\.__name__|strategy\.__class__\.__name__")


def test_no_user_facing_message_names_a_strategy_by_its_class():
    # _compat reads class names to recognise TensorFlow's classes, never to show them.
    offenders = [f"{path.relative_to(SOURCES)}:{number}: {line.strip()}"
                 for path in sorted(SOURCES.rglob("*.py")) if path.parent.name != "_compat"
                 and path.name != "names.py"
                 for number, line in enumerate(path.read_text().splitlines(), 1) if _DIRECT.search(line)]
    assert offenders == [], "name strategies with tfstrategy.selection.names.strategy_name:\n" + "\n".join(offenders)
