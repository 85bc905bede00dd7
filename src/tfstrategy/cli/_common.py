"""What every subcommand shares: the strategy flags and quieting TensorFlow's logs."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tfstrategy.errors import DeviceError, StrategyError
from tfstrategy.native_log import log_level, native_start_up_held
from tfstrategy.selection.cpu_split import validate_cpu_replicas
from tfstrategy.selection.devices import DeviceRequest, parse_devices
from tfstrategy.selection.host import HostInfo
from tfstrategy.settings import AUDIT_MODES, CPU_REPLICAS, ENV_CPU_REPLICAS, ENV_DEVICES, ENV_STRATEGY, StrategyKind

__all__ = ["add_program_arguments", "program_from_args", "add_strategy_arguments", "add_output_arguments", "quiet_tensorflow", "import_tensorflow_quietly",
           "tensorflow_log_environment", "StrategyFlags", "strategy_flags", "check_device_flag", "device_flag_error", "names_gpus",
           "visible_gpus"]

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
    parser.add_argument("--profile-probes", metavar="SHARE",
                        help="with --profile: the share of the time trained the report's probes, which split a step "
                        "into its parts, may take: 0.1 by default (a tenth); on a run of a few seconds none fits, so "
                        "the report names a bottleneck only from free samples: 2 lets them take twice the training "
                        "(env TFSTRATEGY_PROFILE_PROBES)")
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
                        "a tenth of the time trained, --profile-probes for another share (env TFSTRATEGY_PROFILE)")
    parser.add_argument("--profile-dir", default="tfstrategy-profile", metavar="DIR",
                        help="where --profile writes report.txt, report.json, report.html and worker-<i>.json "
                        "(default: ./tfstrategy-profile)")
    parser.add_argument("--profile-every", type=float, default=10.0, metavar="MIN",
                        help="minutes between --profile reports on long jobs, at an epoch's end (default: 10)")
    parser.add_argument("--profile-probes", metavar="SHARE",
                        help="with --profile: the share of the time trained the report's probes, which split a step "
                        "into its parts, may take: 0.1 by default (a tenth); on a run of a few seconds none fits, so "
                        "the report names a bottleneck only from free samples: 2 lets them take twice the training "
                        "(env TFSTRATEGY_PROFILE_PROBES)")
    parser.add_argument("--debug", action="store_true",
                        help="show TensorFlow's own log lines, the hook's steps in the exit summary and tfstrategy's "
                        "frames in tracebacks (env TFSTRATEGY_DEBUG for the workers)")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help=f"the program to run{where}, after '--'")


def program_from_args(args: argparse.Namespace) -> list[str]:
    """The command after ``--``."""
    program = list(args.program)
    return program[1:] if program and program[0] == "--" else program


@dataclass(frozen=True, kw_only=True)
class StrategyFlags:
    """``--strategy``, ``--devices`` and ``--cpu-replicas`` as given, each checked on its own (``None``: not given)."""

    strategy: StrategyKind | None = None
    devices: DeviceRequest | None = None
    cpu_replicas: int | None = None


def strategy_flags(strategy: str | None, devices: str | None, cpu_replicas: str | None,
                   env: Mapping[str, str] | None = None) -> StrategyFlags:
    """The strategy flags, checked before TensorFlow loads, with errors that name the flags.

    What needs no TensorFlow is refused here in a fraction of a second: a misspelt kind or device, a
    ``--cpu-replicas`` that is not a count, flags that exclude each other, and CPU devices beyond the
    split (the CPU has ``--cpu-replicas`` logical devices, else one). GPUs need TensorFlow to be counted;
    settings from ``TFSTRATEGY_*`` variables are left to ``select()``, whose errors name the variable.

    Raises:
        TFStrategyError: a flag's value is invalid, or the flags cannot go together.
    """
    env = os.environ if env is None else env
    kind = None if strategy is None else StrategyKind.parse(strategy, name="--strategy")
    request = parse_devices(devices, name="--devices")
    replicas = validate_cpu_replicas(cpu_replicas, name="--cpu-replicas")
    if request is not None and kind in (StrategyKind.DEFAULT, StrategyKind.MULTI_WORKER, StrategyKind.TPU):
        raise StrategyError(f"Received --devices {devices} with --strategy {kind.value}, which takes no devices. "
                            "Drop --devices, or pass --strategy mirrored (or one_device) to choose devices.")
    if replicas is not None and replicas > 1 and kind in _NO_CPU_REPLICAS:
        raise StrategyError(f"Received --cpu-replicas {replicas} with --strategy {kind.value}; {_NO_CPU_REPLICAS[kind]}")
    if replicas is not None and request is not None and names_gpus(request):
        raise StrategyError(f"Received --cpu-replicas {replicas} with --devices {devices}; CPU replicas and GPU devices "
                            "exclude each other. Drop --cpu-replicas to train on GPUs, or pass --devices cpu.")
    split, split_by = replicas, "--cpu-replicas"
    if replicas is None and (text := CPU_REPLICAS.text(env)):
        split, split_by = validate_cpu_replicas(text, name=ENV_CPU_REPLICAS), ENV_CPU_REPLICAS
    if request is not None and devices is not None and not names_gpus(request):
        host = HostInfo(cpus=split or 1, cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"))
        error = device_flag_error(devices, request, host, cpu_replicas=split, split_by=split_by)
        if error is not None:
            raise DeviceError(error)
    return StrategyFlags(strategy=kind, devices=request, cpu_replicas=replicas)


#: The kinds that take no --cpu-replicas above 1, and why.
_NO_CPU_REPLICAS = {
    StrategyKind.DEFAULT: "the default strategy has one replica. Drop --cpu-replicas, or pass --strategy mirrored.",
    StrategyKind.TPU: "TPUs are not simulated on the CPU. Drop --cpu-replicas, or pass --strategy mirrored.",
    StrategyKind.MULTI_WORKER: "each worker uses its own GPUs or one CPU. Use tfstrategy launch -n N to rehearse N "
                               "workers.",
}


def names_gpus(request: DeviceRequest) -> bool:
    """Whether a parsed ``--devices`` names GPUs (``gpu`` or ``gpu:N``)."""
    return request.keyword == "gpu" or any(device.kind == "GPU" for device in request.devices)


#: What the device check's child prints: the GPUs TensorFlow sees, without running the script.
_COUNT_GPUS = "import tensorflow as tf; print('gpus', len(tf.config.list_physical_devices('GPU')))"


def visible_gpus(environ: Mapping[str, str] | None = None) -> int | None:
    """The GPUs TensorFlow sees here, from a ``python -c`` child (``None`` if it cannot tell).

    A child, because importing TensorFlow in this process would start nothing the script
    needs and costs seconds only when ``--devices`` names GPUs.
    """
    env = {**(os.environ if environ is None else environ), "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        done = subprocess.run([sys.executable, "-c", _COUNT_GPUS], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, check=False)
    except OSError:
        return None
    answer = [line.split() for line in done.stdout.splitlines() if line.startswith("gpus ")]
    return int(answer[-1][1]) if done.returncode == 0 and answer and answer[-1][1].isdigit() else None


def device_flag_error(spec: str, request: DeviceRequest, host: HostInfo, *, cpu_replicas: int | None = None,
                      split_by: str = "--cpu-replicas") -> str | None:
    """Why ``--devices spec`` cannot be honoured on ``host`` (one line: received, what the host has, the fix), or ``None``.

    Args:
        cpu_replicas: the CPU split asked for, which ``host.cpus`` is; ``None`` when not asked for.
        split_by: where that split came from: ``--cpu-replicas``, or ``TFSTRATEGY_CPU_REPLICAS``.
    """
    if request.keyword in ("all", "cpu"):
        return None
    wanted = request.devices or ()
    missing_gpu = (request.keyword == "gpu" and not host.gpus) or any(
        device.kind == "GPU" and device.index >= host.gpus for device in wanted)
    missing_cpu = [device for device in wanted if device.kind == "CPU" and device.index >= host.cpus]
    if missing_gpu:
        fix = ("Pass --devices cpu or omit --devices." if not host.gpus else
               f"Pass GPU ids below {host.gpus}, or --devices gpu for all of them.")
        return f"Received --devices {spec}; this host has {host.describe()}. {fix}"
    if not missing_cpu:
        return None
    needed = max(device.index for device in wanted) + 1
    if cpu_replicas is None:
        return (f"Received --devices {spec}; this host has {host.describe()}. Pass --cpu-replicas {needed} to split "
                f"the CPU into {needed} logical devices (/cpu:0 to /cpu:{needed - 1}), or --devices cpu.")
    flag = split_by.startswith("--")
    fits = f"--devices {','.join(f'cpu:{index}' for index in range(len(wanted)))}" if len(wanted) <= host.cpus else None
    if flag:
        fix = f"Pass {fits} or --cpu-replicas {needed}." if fits else f"Pass --cpu-replicas {needed}."
    else:
        fix = f"Pass {fits}, or set {split_by}={needed}." if fits else f"Set {split_by}={needed}."
    split = "1 logical device (/cpu:0)" if cpu_replicas == 1 else \
        f"{cpu_replicas} logical devices (/cpu:0 to /cpu:{cpu_replicas - 1})"
    given = f"--cpu-replicas {cpu_replicas}" if flag else f"{split_by}={cpu_replicas}"
    return f"Received --devices {spec} with {given}, which splits the CPU into {split}. {fix}"


def check_device_flag(spec: str, cpu_replicas: int | None,
                      gpus: Callable[[], int | None] = visible_gpus) -> None:
    """``--devices``, checked against this host before the script starts (GPUs counted only when it names some).

    Raises:
        DeviceError: a malformed spec, or devices this host lacks.
    """
    request = parse_devices(spec, name="--devices")
    if request is None:
        return
    count = gpus() if names_gpus(request) else 0
    if count is None:
        return  # TensorFlow could not tell here: the hook checks it in the script's process
    host = HostInfo(cpus=cpu_replicas or 1, gpus=count, cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    error = device_flag_error(spec, request, host, cpu_replicas=cpu_replicas)
    if error is not None:
        raise DeviceError(error)
