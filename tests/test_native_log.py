"""TensorFlow's C++ start-up lines held to ``TF_CPP_MIN_LOG_LEVEL`` (tfstrategy.native_log), without TensorFlow."""

from __future__ import annotations

import os

import pytest

from tfstrategy.native_log import ABSL_NOTICE, log_level, native_start_up_held, shown_lines

#: As TF 2.21 writes them during ``import tensorflow`` (on a CPU with oneDNN's fast paths).
ONEDNN = ("I0000 00:00:1796542949.442244   15525 port.cc:153] oneDNN custom operations are on. You may see slightly "
          "different numerical results due to floating-point round-off errors from different computation orders.")
WARNING = "W0000 00:00:1796542949.442244   15525 cpu_feature_guard.cc:210] This TensorFlow binary is optimized to use ..."
ERROR = "E0000 00:00:1796542949.442244   15525 cuda_dnn.cc:8310] Unable to register cuDNN factory"
USER = "DeprecationWarning: the user's own line, written while TensorFlow imports"
LINES = [ABSL_NOTICE, ONEDNN, USER, WARNING, ERROR]


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        pytest.param(0, LINES, id="0-everything"),
        pytest.param(1, [USER, WARNING, ERROR], id="1-no-info-no-notice"),
        pytest.param(2, [USER, ERROR], id="2-errors-only"),
        pytest.param(3, [USER], id="3-none"),
    ],
)
def test_the_level_hides_what_tensorflow_would_hide_and_never_the_users_lines(level, shown):
    text = "".join(line + "\n" for line in LINES)
    assert shown_lines(text, level) == "".join(line + "\n" for line in shown)


@pytest.mark.parametrize(
    ("value", "level"),
    [pytest.param(None, 0, id="unset"), pytest.param("2", 2, id="two"), pytest.param(" 3 ", 3, id="spaces"),
     pytest.param("loud", 0, id="not-a-number")],
)
def test_log_level_reads_the_variable_as_tensorflow_does(value, level):
    assert log_level({} if value is None else {"TF_CPP_MIN_LOG_LEVEL": value}) == level


def test_descriptor_2_is_held_for_the_block_then_written_back_filtered(capfd):
    with native_start_up_held(2):
        os.write(2, f"{ABSL_NOTICE}\n{ONEDNN}\n{USER}\n".encode())
        assert capfd.readouterr().err == ""  # held, not yet shown
    assert capfd.readouterr().err == f"{USER}\n"
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"  # descriptor 2 is the console's again


def test_what_was_held_is_written_back_when_the_block_raises(capfd):
    with pytest.raises(ImportError), native_start_up_held(2):
        os.write(2, f"{ONEDNN}\n{USER}\n".encode())
        raise ImportError("no tensorflow")
    assert capfd.readouterr().err == f"{USER}\n"
