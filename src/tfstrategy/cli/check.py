"""``tfstrategy check``: prove a strategy works on this host before training on it."""

from __future__ import annotations

import argparse
import json
import sys

from tfstrategy.cli._common import add_output_arguments, add_strategy_arguments, quiet_tensorflow

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

exit status: 0 every check passed, 1 a check failed, 2 bad input.

examples:
  tfstrategy check                       # every GPU, or the CPU as one replica
  tfstrategy check --cpu-replicas 4      # rehearse 4 replicas on the CPU
  tfstrategy check --devices gpu:0,gpu:1 # two chosen GPUs
  tfstrategy check --json                # one JSON object for scripts
"""


def check_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``check``."""
    parser = subparsers.add_parser(
        "check",
        help="verify a distribution strategy on this host (the how-to's strategy-demo.py and more)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_strategy_arguments(parser)
    add_output_arguments(parser, json_help="print one JSON object instead of key value lines")
    parser.set_defaults(command=check_command)
    return parser


def check_command(args: argparse.Namespace) -> int:
    """Run the check; return the exit status."""
    quiet_tensorflow(args.debug)
    from tfstrategy.check import run_check

    report = run_check(strategy=args.strategy, devices=args.devices, cpu_replicas=args.cpu_replicas)
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print("\n".join(report.lines()))
    if not report.passed:
        print(f"tfstrategy check: failed: {', '.join(report.failures)}", file=sys.stderr)
        return 1
    return 0
