"""``tfstrategy check``: prove a strategy works on this host before training on it."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
from collections.abc import Iterator

from tfstrategy._tf import ensure_tensorflow_installed
from tfstrategy.cli._common import (
    add_output_arguments,
    add_strategy_arguments,
    check_device_flag,
    import_tensorflow_quietly,
    names_gpus,
    strategy_flags,
)

__all__ = ["DESCRIPTION", "check_parser"]

#: Seconds ``check`` waits for the other tasks of a multi-worker TF_CONFIG.
DEFAULT_JOIN_TIMEOUT = 120.0

DESCRIPTION = """\
Build the how-to's model inside the selected strategy's scope, train one batch,
and verify the strategy end to end. The first four lines are those of the how-to's
strategy-demo.py:

  strategy MirroredStrategy
  replicas 1
  model_strategy True
  train_on_batch True

then the devices, whether every model/optimizer/metric variable was created in the
scope, an all-reduce across replicas, and how a global batch splits per replica.

With --equivalence it then trains a small model for a few steps from the same
initial weights on one replica and on the selected N replicas, and prints the
largest weight difference for Keras fit (steps_per_execution 1 and 8), for
tfstrategy's custom-loop step, and for a planted bug (a loop averaging the loss
per replica), which must come out DIFFERENT. Logical CPUs must be split before
TensorFlow starts, so rehearse N replicas with --cpu-replicas N.

With a TF_CONFIG of several tasks (MultiWorkerMirroredStrategy), the check first
waits for the other tasks to start, at most --join-timeout seconds, and fails
naming each task that did not; each of its collectives then waits at most as
long (unless TFSTRATEGY_COLLECTIVE_TIMEOUT says otherwise).

exit status: 0 every check passed, 1 a check failed (or a peer never started), 2 bad input.

examples:
  tfstrategy check                       # every GPU, or the CPU as one replica
  tfstrategy check --cpu-replicas 4      # rehearse 4 replicas on the CPU
  tfstrategy check --devices gpu:0,gpu:1 # two chosen GPUs
  tfstrategy check --json                # one JSON object for scripts
  tfstrategy check --cpu-replicas 4 --equivalence  # 4 replicas train like 1?
"""


def check_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``check``."""
    parser = subparsers.add_parser(
        "check",
        help="verify a distribution strategy on this host (the how-to's strategy-demo.py and more)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_strategy_arguments(parser)
    parser.add_argument(
        "--precision",
        metavar="POLICY",
        help="Keras global dtype policy to check under: float32, mixed_float16 or mixed_bfloat16 (env TFSTRATEGY_PRECISION)",
    )
    parser.add_argument(
        "--equivalence",
        action="store_true",
        help="also check that training on the N replicas matches 1 replica (fit, custom loop, planted bug)",
    )
    parser.add_argument(
        "--join-timeout",
        metavar="SECONDS",
        type=_join_timeout,
        default=DEFAULT_JOIN_TIMEOUT,
        help=f"with a multi-worker TF_CONFIG, how long to wait for the other tasks to start (default: {DEFAULT_JOIN_TIMEOUT:g})",
    )
    add_output_arguments(parser, json_help="print one JSON object instead of key value lines")
    parser.set_defaults(command=check_command)
    return parser


def _check_collective_timeout(cluster_tasks: int, join_timeout: float) -> float | None:
    """Bound each of the check's collectives by ``--join-timeout`` under a multi-worker cluster.

    A job has no collective timeout by default (TensorFlow holds a thread per collective for that long); the
    check runs a few collectives only, so it bounds them and fails rather than hang on a peer that died.
    ``TFSTRATEGY_COLLECTIVE_TIMEOUT`` still decides when set (``None`` here: select() reads it).
    """
    from tfstrategy.settings import COLLECTIVE_TIMEOUT

    if cluster_tasks <= 1 or COLLECTIVE_TIMEOUT.text(os.environ):
        return None
    return join_timeout


def _join_timeout(text: str) -> float:
    try:
        value = float(text) if len(text) <= 32 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"received {text[:40]!r}; expected seconds > 0, e.g. --join-timeout 60")
    return value


@contextlib.contextmanager
def _collector_skips_objects_so_far() -> Iterator[None]:
    """Inside the block, the cyclic garbage collector leaves alone the objects that exist now.

    Once TensorFlow is imported, the process holds ~350,000 objects the collector
    tracks (TensorFlow's and Keras' modules); each full collection walks them all,
    ~0.2 s of CPU on TF 2.21 and Python 3.11, and frees none. The check's own
    work triggers one. :func:`gc.freeze` takes them out of the collector's sight
    (objects made later are collected as usual) and :func:`gc.unfreeze` puts
    them back, so the process is left as it was. A process that froze objects
    itself keeps its own arrangement.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _without_plotting() -> Iterator[None]:
    """Keep Keras from importing matplotlib while TensorFlow imports, where it is installed.

    Keras 3 imports ``matplotlib.pyplot`` at start-up for its image-gallery plots
    (``keras.src.visualization``, inside ``try: ... except ImportError``): 1.1 s
    on this 2-core host (``python -X importtime -c "import keras"``, TF 2.21, Keras
    3.15, matplotlib 3.11), for plots the check never draws. A ``None`` in
    ``sys.modules`` makes that import fail at once; the entry is removed after,
    so a later ``import matplotlib`` works as usual. A process that imported it
    already keeps it.
    """
    if "matplotlib" in sys.modules:
        yield
        return
    sys.modules["matplotlib"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if "matplotlib" in sys.modules and sys.modules["matplotlib"] is None:
            del sys.modules["matplotlib"]


def validate_check_arguments(args: argparse.Namespace) -> None:
    """What ``check`` can refuse before TensorFlow loads (seconds): its flags, and the settings select() reads.

    Raises:
        TFStrategyError: an invalid flag or ``TFSTRATEGY_*`` setting, or flags that cannot go together.
    """
    from tfstrategy.runtime.select import resolve_request
    from tfstrategy.training.precision import precision_environment

    strategy_flags(args.strategy, args.devices, args.cpu_replicas)
    precision_environment(args.precision, os.environ)
    resolve_request(strategy=args.strategy, devices=args.devices, cpu_replicas=args.cpu_replicas)


def check_command(args: argparse.Namespace) -> int:
    """Run the check; return the exit status."""
    validate_check_arguments(args)
    ensure_tensorflow_installed("this command")
    with _without_plotting():
        import_tensorflow_quietly(args.debug)
    with _collector_skips_objects_so_far():
        return _check(args)


def _check(args: argparse.Namespace) -> int:
    from tfstrategy.diagnostics.check import run_check
    from tfstrategy.errors import PeerTimeoutError
    from tfstrategy.runtime.select import resolve_request, select
    from tfstrategy.settings import StrategyKind

    request = resolve_request(strategy=args.strategy, devices=args.devices, cpu_replicas=args.cpu_replicas)
    if args.devices is not None and request.devices is not None and names_gpus(request.devices):
        # The GPUs --devices names, now that TensorFlow can count them (its CPUs were checked before the import).
        from tfstrategy.selection.host import HostInfo

        check_device_flag(args.devices, request.cpu_replicas, gpus=lambda: HostInfo.detect().gpus)
    # The request's cluster: a TF_CONFIG, or the one an environment derives (a Slurm step, a Kubernetes pod).
    cluster = request.cluster
    if cluster is not None and request.cluster_tasks > 1 and request.kind in (StrategyKind.AUTO,
                                                                              StrategyKind.MULTI_WORKER):
        # Creating the strategy would wait for every peer forever, deaf to SIGTERM.
        from tfstrategy.multiworker.peers import wait_for_peers

        try:
            wait_for_peers(
                cluster,
                args.join_timeout,
                progress=lambda line: print(f"tfstrategy check: {line}", file=sys.stderr, flush=True),
            )
        except PeerTimeoutError as error:
            print(f"tfstrategy check: failed: {error}", file=sys.stderr)
            return 1
    timeout = _check_collective_timeout(request.cluster_tasks, args.join_timeout)
    selection = select(strategy=args.strategy, devices=args.devices, cpu_replicas=args.cpu_replicas,
                       precision=args.precision, collective_timeout=timeout)
    report = run_check(selection)
    if args.equivalence:
        from tfstrategy.diagnostics.equivalence import add_equivalence

        add_equivalence(report, selection, progress=lambda message: print(f"equivalence: {message}", file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print("\n".join(report.lines()))
    if not report.passed:
        print(f"tfstrategy check: failed: {', '.join(report.failures)}", file=sys.stderr)
        return 1
    return 0
