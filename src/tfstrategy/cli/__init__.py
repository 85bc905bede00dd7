"""The ``tfstrategy`` command: registers subcommands and turns errors into one line."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from tfstrategy.cli._parser import Parser
from tfstrategy.cli.check import check_parser
from tfstrategy.cli.env import env_parser
from tfstrategy.cli.k8s import k8s_parser
from tfstrategy.cli.launch import launch_parser
from tfstrategy.cli.run import run_parser
from tfstrategy.contract.exits import EXIT_FAILURE, EXIT_INVALID, signal_status
from tfstrategy.errors import TFStrategyError

SUBCOMMANDS = (check_parser, env_parser, run_parser, launch_parser, k8s_parser)


def build_parser() -> argparse.ArgumentParser:
    """The root parser with every subcommand registered."""
    parser = Parser(
        prog="tfstrategy",
        description="TensorFlow distribution strategies, correct, checked and fast.",
        epilog="Run 'tfstrategy COMMAND --help' for a command's options and examples.",
    )
    from tfstrategy import __version__

    parser.add_argument("--version", action="version", version=f"tfstrategy {__version__}")
    # Every subcommand's parser is a Parser too (argparse makes them of the root's class).
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(  # type: ignore[assignment]
        title="commands", metavar="COMMAND", required=True)
    for register in SUBCOMMANDS:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    name = f"tfstrategy {args.command.__name__.removesuffix('_command')}"
    try:
        return int(args.command(args))
    except TFStrategyError as error:
        if args.debug:
            raise
        print(f"{name}: error: {error}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return signal_status(signal.SIGINT)
    except Exception as error:  # anything else is our bug or TensorFlow's: one line, details on demand
        if args.debug:
            raise
        first_line = (str(error).strip().splitlines() or [""])[0]
        print(f"{name}: failed: {type(error).__name__}: {first_line} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
