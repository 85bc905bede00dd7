"""What every subcommand shares: the strategy flags and quieting TensorFlow's logs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from tfstrategy.native_log import log_level, native_start_up_held
from tfstrategy.settings import AUDIT_MODES, ENV_CPU_REPLICAS, ENV_DEVICES, ENV_STRATEGY, StrategyKind

__all__ = ["add_program_arguments", "program_from_args", "add_strategy_arguments", "add_output_arguments", "quiet_tensorflow", "import_tensorflow_quietly",
           "tensorflow_log_environment"]

STRATEGY_CHOICES = [kind.value for kind in StrategyKind]


def add_strategy_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--strategy``, ``--devices`` and ``--cpu-replicas``."""
    group = parser.add_argument_group("strategy selection (flag > TFSTRATEGY_* variable > default)")
    group.add_argument(
        "--strategy",
        metavar="KIND",
        help=f"one of {', '.join(STRATEGY_CHOICES)} (default: auto; env {ENV_STRATEGY})",
    )
    group.add_argument(
        "--devices",
        metavar="SPEC",
        help="devices for mirrored/one_device: all, cpu, gpu, gpu:0,gpu:1, /device:GPU:1 or GPU ids 0,1 "
        f"(default: every GPU, else the CPU; env {ENV_DEVICES})",
    )
    group.add_argument(
        "--cpu-replicas",
        metavar="N",
        help=f"split the CPU into N logical devices to rehearse N replicas without GPUs (env {ENV_CPU_REPLICAS})",
    )


def add_output_arguments(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    """Add ``--json`` and ``--debug``."""
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("--debug", action="store_true", help="show tracebacks and TensorFlow's own log lines")


def tensorflow_log_environment(debug: bool, env: Mapping[str, str]) -> dict[str, str]:
    """The ``TF_CPP_MIN_LOG_LEVEL`` a command's TensorFlow gets: its C++ start-up lines only under ``--debug``.

    By default level 2 (errors only: no ``I0000 ...`` info lines, no absl warnings) unless the user set
    the variable; ``--debug`` shows everything, over the variable too (a flag beats the environment).
    """
    if debug:
        return {"TF_CPP_MIN_LOG_LEVEL": "0"}
    if env.get("TF_CPP_MIN_LOG_LEVEL", "").strip():
        return {}
    return {"TF_CPP_MIN_LOG_LEVEL": "2"}


def quiet_tensorflow(debug: bool) -> None:
    """Set this process's TensorFlow logging (and its children's) by :func:`tensorflow_log_environment`.

    Only effective before TensorFlow loads.
    """
    os.environ.update(tensorflow_log_environment(debug, os.environ))


def import_tensorflow_quietly(debug: bool) -> None:
    """Import TensorFlow with its C++ start-up lines held to the log level, unless debugging.

    Those lines come before TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL``
    (:mod:`tfstrategy.native_log`), and would precede the command's own first line.
    A failed import is left for the command to report with its fix.
    """
    quiet_tensorflow(debug)
    if debug or "tensorflow" in sys.modules:
        return
    with native_start_up_held(log_level(os.environ)):
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            pass  # tfstrategy._tf says which extra to install when the command needs TensorFlow


def add_program_arguments(parser: argparse.ArgumentParser, *, where: str) -> None:
    """Add ``--audit``, ``--debug`` and the program after ``--`` (``run`` and ``launch``)."""
    parser.add_argument("--audit", default="warn", choices=AUDIT_MODES,
                        help="before fit/evaluate, variables made outside the strategy's scope: warn (default) "
                        "reports them once, stop refuses to train, off skips the audit")
    parser.add_argument("--precision", metavar="POLICY",
                        help="Keras global dtype policy set before the script builds its model: float32, "
                        "mixed_float16 or mixed_bfloat16 (env TFSTRATEGY_PRECISION)")
    parser.add_argument("--profile", action="store_true",
                        help="report where each training step's time goes (input, reduction, dispatch, compute), "
                        "with recommendations: at the end of each model's first fit and every --profile-every "
                        "minutes, one report for the job (worker 0's stderr) and a picture in --profile-dir; the probes take at most "
                        "a tenth of the time trained (env TFSTRATEGY_PROFILE, TFSTRATEGY_PROFILE_PROBES)")
    parser.add_argument("--profile-dir", default="tfstrategy-profile", metavar="DIR",
                        help="where --profile writes report.txt, report.json, report.html and worker-<i>.json "
                        "(default: ./tfstrategy-profile)")
    parser.add_argument("--profile-every", type=float, default=10.0, metavar="MIN",
                        help="minutes between --profile reports on long jobs, at an epoch's end (default: 10)")
    parser.add_argument("--debug", action="store_true",
                        help="show TensorFlow's own log lines, the hook's steps in the exit summary and tfstrategy's "
                        "frames in tracebacks (env TFSTRATEGY_DEBUG for the workers)")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help=f"the program to run{where}, after '--'")


def program_from_args(args: argparse.Namespace) -> list[str]:
    """The command after ``--``."""
    program = list(args.program)
    return program[1:] if program and program[0] == "--" else program
