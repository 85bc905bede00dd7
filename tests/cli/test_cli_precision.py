"""`--precision` (run, launch, check) and `launch --sentinel`: validated up front, handed on as variables."""

from __future__ import annotations

import sys

import pytest

from helpers import run_cli
from tfstrategy.cli import build_parser
from tfstrategy.cli.run import run_environment
from tfstrategy.errors import PrecisionError, TrainingError
from tfstrategy.training.precision import precision_environment
from tfstrategy.training.sentinel import sentinel_environment


def test_run_hands_the_precision_to_the_script(monkeypatch):
    monkeypatch.delenv("TFSTRATEGY_PRECISION", raising=False)
    args = build_parser().parse_args(["run", "--precision", "Mixed-Float16", "--", sys.executable, "-c", "pass"])
    _, env = run_environment(args)
    assert env["TFSTRATEGY_PRECISION"] == "mixed_float16"
    args = build_parser().parse_args(["run", "--", sys.executable, "-c", "pass"])
    assert "TFSTRATEGY_PRECISION" not in run_environment(args)[1]


def test_a_bad_precision_is_refused_before_running(monkeypatch):
    monkeypatch.delenv("TFSTRATEGY_PRECISION", raising=False)
    args = build_parser().parse_args(["run", "--precision", "half", "--", sys.executable, "-c", "pass"])
    with pytest.raises(PrecisionError, match="--precision half"):
        run_environment(args)


def test_launch_parses_precision_and_sentinel_defaulting_to_epoch():
    args = build_parser().parse_args(["launch", "-n", "2", "--", "python", "t.py"])
    assert args.sentinel == "epoch" and args.precision is None
    assert sentinel_environment(args.sentinel) == {"TFSTRATEGY_SENTINEL": "epoch"}
    assert sentinel_environment("off") == {"TFSTRATEGY_SENTINEL": "off"}
    assert precision_environment("mixed_bfloat16", env={}) == {"TFSTRATEGY_PRECISION": "mixed_bfloat16"}
    with pytest.raises(TrainingError, match="--sentinel often"):
        sentinel_environment("often")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["launch", "-n", "2", "--precision", "fp16", "--", sys.executable, "-c", "pass"],
                     "Received --precision fp16", id="launch-precision"),
        pytest.param(["launch", "-n", "2", "--sentinel", "often", "--", sys.executable, "-c", "pass"],
                     "Received --sentinel often", id="launch-sentinel"),
        pytest.param(["run", "--precision", "fp16", "--", sys.executable, "-c", "pass"],
                     "Received --precision fp16", id="run-precision"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args, message):
    done = run_cli(*args, timeout=120)
    assert done.returncode == 2, done.stderr
    first = done.stderr.strip().splitlines()[0]
    assert message in first


@pytest.mark.slow
def test_run_sets_the_policy_in_an_unchanged_script_and_the_audit_names_its_float16_output():
    done = run_cli("run", "--precision", "mixed_float16", "--", sys.executable, "tests/workers/precision_script.py")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "policy mixed_float16 float16" in done.stdout
    assert "hands the loss outputs in half precision: probs (Dense, float16, softmax)" in done.stderr
    # One replica: the loss-scale patch has nothing to fix, so the summary names only the policy.
    assert "Keras' dtype policy set to mixed_float16" in done.stderr.splitlines()[-1]
