"""``tfstrategy launch``: run a training script as N local multi-worker processes."""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from tfstrategy.cli._common import quiet_tensorflow
from tfstrategy.launch import network_isolation
from tfstrategy.launch.supervisor import JOIN_TIMEOUT_STATUS, Launcher, LaunchOptions, validate_launch_options
from tfstrategy.launch.worker_hook import AUDIT_MODES

DESCRIPTION = textwrap.dedent(
    f"""\
    Run COMMAND as N workers of one MultiWorkerMirroredStrategy job on this machine
    (like torchrun --standalone). The script needs no change: each worker gets a
    TF_CONFIG naming free ports on 127.0.0.1, so tf.distribute.MultiWorkerMirroredStrategy()
    (or tfstrategy.select()) in it forms the job, and a start-up hook gives every
    Python worker tfstrategy's side: the Keras workarounds its release needs, the
    "joined" signal, a collective timeout, and a scope audit before fit (--audit).
    Output lines are prefixed '[worker i]'.

    Supervision: --timeout bounds only the wait for every worker to join (its
    strategy exists; for a non-Python program, every worker's port accepts
    connections). A joined job runs as long as it is healthy. When a worker exits
    non-zero or dies, every other worker is stopped within seconds and the first
    failure is reported with its exception and last lines. With --max-restarts K
    the whole group is restarted up to K times; callbacks=tfstrategy.backup_callbacks()
    in model.fit resumes each worker from its own directory under --backup-dir.
    Ctrl-C or SIGTERM is passed on to every worker, which get --grace seconds to
    exit. Processes the workers started are stopped with them.

    Exit status: 0 when every worker exits 0; else the first failed worker's status
    (128+N when killed by signal N), {JOIN_TIMEOUT_STATUS} when workers did not join
    in time, 130 on Ctrl-C, 2 on invalid options."""
)

EPILOG = textwrap.dedent(
    """\
    examples:
      tfstrategy launch -n 2 -- python train.py --epochs 3
      tfstrategy launch -n 4 --max-restarts 2 --backup-dir /tmp/ckpt -- python train.py
      tfstrategy launch -n 2 --timeout 60 -- python train.py
      tfstrategy launch -n 2 --audit stop -- python -m mypackage.train

    On real machines, set TF_CONFIG per machine instead (tfstrategy.tf_config_from_hosts,
    or tfstrategy.tf_config_from_slurm under srun) and run the script directly."""
)


def launch_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tfstrategy launch``."""
    parser = subparsers.add_parser(
        "launch",
        help="run a script as N local multi-worker processes, supervised",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--num-workers", type=int, required=True, metavar="N", help="worker processes to start")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restart the whole group up to K times after a failure (default: 0)")
    parser.add_argument("--backup-dir", type=Path, metavar="DIR",
                        help="base of the per-worker BackupAndRestore directories DIR/worker-i "
                        "(default with --max-restarts: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds for every worker to join, i.e. to create its strategy (default: 300; 0: no "
                        "limit); a joined job is never stopped for running long")
    parser.add_argument("--grace", type=float, default=10.0, metavar="S",
                        help="seconds workers get to exit after Ctrl-C or SIGTERM is passed on (default: 10)")
    parser.add_argument("--audit", default="warn", choices=AUDIT_MODES,
                        help="before fit/evaluate, variables made outside the strategy's scope: warn (default) "
                        "reports them once, stop refuses to train, off skips the audit")
    parser.add_argument("--isolate-network", action="store_true",
                        help="run the job in a private network namespace with only loopback, so TensorFlow's servers "
                        "(which listen on 0.0.0.0) are unreachable from other hosts; workers then have no network")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and TensorFlow's own log lines")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the program to run in every worker, after '--'")
    parser.set_defaults(command=launch_command)
    return parser


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    """Validated :class:`LaunchOptions` from parsed arguments.

    Raises:
        LaunchError: invalid values.
    """
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    return validate_launch_options(
        LaunchOptions(
            command=tuple(program),
            num_workers=args.num_workers,
            max_restarts=args.max_restarts,
            backup_dir=args.backup_dir,
            join_timeout=None if args.timeout == 0 else args.timeout,
            grace=args.grace,
            audit=args.audit,
        )
    )


def _command_line(args: argparse.Namespace, options: LaunchOptions) -> list[str]:
    """These arguments as a ``tfstrategy`` command line (to re-run it in a network namespace)."""
    line = ["launch", "-n", str(options.num_workers), "--max-restarts", str(options.max_restarts),
            "--timeout", str(args.timeout), "--grace", str(options.grace), "--audit", options.audit,
            "--isolate-network"]
    if options.backup_dir is not None:
        line += ["--backup-dir", str(options.backup_dir.resolve())]
    if args.debug:
        line.append("--debug")
    return [*line, "--", *options.command]


def launch_command(args: argparse.Namespace) -> int:
    """Run the job; its exit status."""
    quiet_tensorflow(args.debug)
    options = options_from_args(args)
    if args.isolate_network:
        if not network_isolation.is_isolated():
            network_isolation.reexec_isolated(_command_line(args, options))
        network_isolation.bring_up_loopback()
        print("tfstrategy launch: in a private network namespace: workers reach each other on 127.0.0.1 only, "
              "other hosts cannot reach them", file=sys.stderr)
    result = Launcher(options).run()
    if result.restart_seconds:
        timings = ", ".join(f"{seconds:.1f} s" for seconds in result.restart_seconds)
        rejoined = ", ".join(f"{seconds:.1f} s" for seconds in result.rejoin_seconds) or "never"
        print(f"tfstrategy launch: {result.restarts} restart(s); failure to relaunch {timings}; "
              f"failure to all workers joined again {rejoined}", file=sys.stderr)
    return result.returncode

