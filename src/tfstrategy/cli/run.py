"""``tfstrategy run``: rehearse an unchanged single-host script with N replicas, audited and patched."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from tfstrategy._tf import ensure_tensorflow_installed
from tfstrategy.cli._common import (
    add_program_arguments,
    check_device_flag,
    device_flag_error,
    program_from_args,
    tensorflow_log_environment,
    visible_gpus,
)
from tfstrategy.errors import LaunchError
from tfstrategy.selection.cpu_split import validate_cpu_replicas
from tfstrategy.training.precision import precision_setting
from tfstrategy.worker_contract import WorkerSettings, hook_environment

__all__ = ["DESCRIPTION", "EPILOG", "run_parser", "check_device_flag", "device_flag_error", "visible_gpus"]

DESCRIPTION = textwrap.dedent(
    """\
    Run COMMAND (one process) with tfstrategy's start-up hook, so a script that
    creates its own tf.distribute.MirroredStrategy() runs as tfstrategy would set it
    up, without changing a line:

      - --cpu-replicas N splits the CPU into N logical devices before the script's
        TensorFlow starts, and MirroredStrategy() without devices uses all N;
      - --devices SPEC restricts MirroredStrategy() to those devices (checked
        against this host before COMMAND starts: one line and exit 2 if absent);
      - the Keras workarounds the installed release needs are applied (e.g.
        compile(steps_per_execution=8) on 2+ replicas);
      - Model.fit/evaluate first audit that the model's variables were created in
        its strategy's scope: --audit warn (default) reports offenders once with
        their file:line and trains on; stop refuses to train; off skips it.

    At exit one line sums up, in the script's terms: the strategies and replicas,
    what changed for the script ("nothing changed" if nothing did), the scope
    audit; --debug adds the hook's steps and patches. An error of the script's
    own is shown from its frames (tfstrategy's wrappers only with --debug).
    The exit status is the command's."""
)

EPILOG = textwrap.dedent(
    """\
    examples:
      tfstrategy run --cpu-replicas 4 -- python strategy-demo.py     # prints replicas 4
      tfstrategy run --cpu-replicas 2 --audit stop -- python train.py
      tfstrategy run --devices gpu:0,gpu:1 -- python -m mypackage.train

    For several workers, use tfstrategy launch -n N (it installs the same hook)."""
)


def run_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``tfstrategy run``."""
    parser = subparsers.add_parser(
        "run",
        help="run an unchanged script with N CPU replicas, the Keras fixes and a scope audit",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cpu-replicas", metavar="N",
                        help="split the CPU into N logical devices; MirroredStrategy() then has N replicas")
    parser.add_argument("--devices", metavar="SPEC",
                        help="devices for MirroredStrategy() without devices: all, cpu, gpu, gpu:0,gpu:1, or GPU ids 0,1")
    add_program_arguments(parser, where="")
    parser.set_defaults(command=run_command)
    return parser


def run_environment(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The command line and environment ``run`` executes, validated.

    Raises:
        TFStrategyError: an invalid flag or a command that cannot be run.
    """
    program = program_from_args(args)
    example = "tfstrategy run --cpu-replicas 4 -- python train.py"
    if not program:
        raise LaunchError(f"Received no command to run; expected it after '--', e.g. {example}.")
    from tfstrategy.launch.supervisor import LaunchOptions, validate_launch_options

    replicas = validate_cpu_replicas(args.cpu_replicas, name="--cpu-replicas")
    if args.devices is not None:
        check_device_flag(args.devices, replicas)
    validate_launch_options(LaunchOptions(command=tuple(program), num_workers=1, audit=args.audit))
    env = hook_environment(run_settings(args, replicas))
    env.update(tensorflow_log_environment(args.debug, env))
    return program, env


def run_settings(args: argparse.Namespace, cpu_replicas: int | None) -> WorkerSettings:
    """The settings ``run`` hands the script, from its flags (``--audit`` checked by the launch options).

    Raises:
        PrecisionError, SettingsConflictError: a bad ``--precision``, or one ``TFSTRATEGY_PRECISION`` contradicts.
        TrainingError: a bad ``--profile-every``, ``--profile-dir`` or ``--profile-probes``.
    """
    from tfstrategy.performance.environment import profile_settings

    precision = precision_setting(args.precision, os.environ)
    profile_dir, every, probes = profile_settings(args.profile, args.profile_dir, args.profile_every,
                                                  args.profile_probes)
    return WorkerSettings(audit=args.audit, summary=True, debug=args.debug, precision=precision, profile_dir=profile_dir,
                          profile_every=every, profile_probes=probes, cpu_replicas=cpu_replicas, devices=args.devices)


def run_command(args: argparse.Namespace) -> int:
    """Replace this process by the command, with the hook; returns only on error."""
    program, env = run_environment(args)
    ensure_tensorflow_installed("this command")  # the hook and the script need it; after the flags are checked
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(program[0], program, env)
    return 1  # pragma: no cover - execvpe does not return
