"""``tfstrategy launch``: run a training script as N local multi-worker processes."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tfstrategy._tf import ensure_tensorflow_installed
from tfstrategy.cli._common import add_program_arguments, program_from_args, quiet_tensorflow
from tfstrategy.contract.exits import EXIT_STALL, help_table
from tfstrategy.errors import LaunchError
from tfstrategy.settings import (
    ENV_LAUNCH_SECRET,
    ENV_NODE_RANK,
    ENV_PORT_RANGE,
    ENV_RUN_ID,
    NODE_RANK,
    PORT_RANGE,
    RUN_ID,
    parse_min_max,
)

if TYPE_CHECKING:  # the launcher's modules load when a job starts, not for `tfstrategy check`
    from tfstrategy.launch.console import ConsoleView
    from tfstrategy.launch.rendezvous import NodeOptions
    from tfstrategy.launch.slurm import SlurmNodes
    from tfstrategy.launch.supervisor import LaunchOptions

__all__ = ["DESCRIPTION", "EPILOG", "FAMILIAR_FLAGS", "launch_parser"]

#: Flags of torchrun, Accelerate and mpirun, and the flag of ours a user who types them means.
FAMILIAR_FLAGS = {
    **dict.fromkeys(("--nproc-per-node", "--nproc", "--nprocs", "--np", "-np", "--num-processes", "--num-proc",
                     "--workers", "--world-size"), "--num-workers"),
    **dict.fromkeys(("--master-addr", "--master-port", "--rdzv-endpoint", "--main-process-ip",
                     "--main-process-port"), "--master"),
    "--num-machines": "--nnodes",
    "--machine-rank": "--node-rank",
}

DESCRIPTION = textwrap.dedent(
    """\
    Run COMMAND as N workers of one MultiWorkerMirroredStrategy job on this machine
    (like torchrun --standalone). The script needs no change: each worker gets a
    TF_CONFIG naming free ports on 127.0.0.1, so tf.distribute.MultiWorkerMirroredStrategy()
    (or tfstrategy.select()) in it forms the job, and a start-up hook gives every
    Python worker tfstrategy's side: the Keras workarounds its release needs, the
    "joined" signal, and a scope audit before fit (--audit).
    Output lines are prefixed '[worker i]': a worker's stdout goes to stdout, its
    stderr to stderr, with the launcher's own lines. Worker 0's progress bar is live (on a
    terminal), a line every worker prints is shown once, and TensorFlow's shutdown
    noise stays in the log files (--console-workers, --debug).

    Supervision: --timeout bounds only the wait for every worker to join (its
    strategy exists; for a non-Python program, every worker's port accepts
    connections). A joined job runs as long as it is healthy. When a worker exits
    non-zero or dies, every other worker is stopped within seconds and the first
    failure is reported with its exception and last lines. With --max-restarts K
    the whole group is restarted up to K times; callbacks=tfstrategy.backup_callbacks()
    in model.fit resumes every worker from the newest step every worker backed up
    (committed) under --backup-dir.
    Ctrl-C or SIGTERM is passed on to every worker, which get --grace seconds to
    exit; their output from then on goes only to --log-dir (with --debug, to the
    console too), and each worker's end is one line. Processes the workers started
    are stopped with them.

    Root cause first: each worker records its first uncaught exception; the report
    names the earliest real failure across workers (and nodes) and shows TensorFlow's
    echoes of it on the peers (UnavailableError, "Collective ops is aborted") as
    consequences. A worker that stops advancing while its peers wait (stopped, busy
    in a callback, blocked on input) is named after --stall-report seconds (more when
    a step is slow), with every worker's Python stack; --stall-timeout fails the job.
    The workers die with the launcher, however it ends (SIGKILL included).

    Exit status (for Slurm --requeue and Kubernetes podFailurePolicy):
    """
) + help_table() + "\n\n" + textwrap.dedent(
    """\
    Several machines (--nnodes N): run the same command on each, with its own
    --node-rank (or TFSTRATEGY_NODE_RANK) and the same --master HOST:PORT, the
    address of node 0's machine and a free port. Node 0's launcher hosts the
    rendezvous there: every launcher proves it knows the shared secret
    (TFSTRATEGY_LAUNCH_SECRET or --secret-file; never on the command line), offers
    its address and free ports, and receives the whole cluster of N*K workers
    (node R runs workers R*K .. R*K+K-1). The connection stays open as the control
    channel: a failure on any node stops every worker on every node, --max-restarts
    restarts the whole group on every node, Ctrl-C on any launcher stops the whole
    job, and a node missing at --timeout fails every launcher, naming its rank.
    A node silent for 10 s (frozen, unplugged) is lost: that fails the round. When
    node 0's launcher is lost, every node stops: restart the launcher on all nodes.

    Elastic (--nnodes MIN:MAX, with --backup-dir on a file system every node
    shares): the job starts with MIN to MAX nodes; a node lost while MIN remain,
    or one whose launcher gets SIGTERM (it leaves and exits 75), re-forms the
    others without it; a node that starts (again) while fewer than MAX train is
    taken in at a step the workers agree on. Each re-formed group resumes from the
    newest committed backup step; re-formations do not use --max-restarts.
    Node 0 must stay. On one machine, -n MIN:MAX (with --backup-dir) goes on
    without a worker killed with no error of its own while MIN remain, then
    starts a replacement for it, which the group takes at a step the workers
    agree on once it creates its strategy; each replacement uses one of
    --max-restarts (with none left, the lost worker's place stays empty).
    docs/guides/elastic.md has the rules.

    What is authenticated: only this control channel. Every message carries the
    job's identity, a sequence number and an HMAC under per-connection keys, so a
    man in the middle can cut it (the job stops, naming the node) but cannot join,
    forge, replay or reorder. NOT authenticated: TensorFlow's own gRPC servers, the
    workers' ports. They accept anyone and listen on every interface (TensorFlow
    has no option to bind one address): whoever reaches them can run operations in
    the workers. Allow those ports only between the nodes (--port-range keeps them
    in one range): firewall rules in docs/guides/clusters.md, "Security model"."""
)

EPILOG = textwrap.dedent(
    """\
    examples:
      tfstrategy launch -n 2 -- python train.py --epochs 3
      tfstrategy launch -n 4 --max-restarts 2 --backup-dir backups/run1 -- python train.py
      tfstrategy launch -n 2 --timeout 60 -- python train.py
      tfstrategy launch -n 2 --audit stop -- python -m mypackage.train
      tfstrategy launch -n 4 --log-dir logs --tee --console-workers 0 -- python train.py
                                           # output in logs/<run id>/attempt-0/worker-<i>/

    two machines, 10.0.0.5 (node 0) and 10.0.0.6, with 2 workers each:
      export TFSTRATEGY_LAUNCH_SECRET=$(cat ~/.tfstrategy-secret)   # the same file on both
      tfstrategy launch --nnodes 2 --node-rank 0 --master 10.0.0.5:29400 -n 2 -- python train.py   # on 10.0.0.5
      tfstrategy launch --nnodes 2 --node-rank 1 --master 10.0.0.5:29400 -n 2 -- python train.py   # on 10.0.0.6

    under Slurm, either way (export TFSTRATEGY_LAUNCH_SECRET first for the launcher):
      srun python train.py                 # select() builds TF_CONFIG from the step; no launcher, no diagnosis
      srun --ntasks-per-node=1 tfstrategy launch -n 4 -- python train.py
                                           # one launcher a node: --nnodes, --node-rank and --master come from
                                           # the step; supervision and the diagnosis of a hang, as above"""
)


def launch_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``tfstrategy launch``."""
    parser = subparsers.add_parser(
        "launch",
        familiar=FAMILIAR_FLAGS,
        help="run a script as N local multi-worker processes, supervised",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-n", "--num-workers", action=_WorkerCount, required=True, metavar="N|MIN:MAX",
                        help="worker processes to start (on each machine with --nnodes). MIN:MAX (one machine, "
                        "with --backup-dir): start MAX; a worker killed with no error of its own (SIGKILL, the OOM "
                        "killer, its device gone) re-forms the others without it from the newest committed step "
                        "while MIN remain, which is not a restart; a replacement for it, started then, uses one of "
                        "--max-restarts")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restart the whole group up to K times after a failure (default: 0); under -n MIN:MAX, "
                        "each replacement of a lost worker uses one too")
    parser.add_argument("--backup-dir", type=Path, metavar="DIR",
                        help="the job's backup directory (created 0700; each worker's part in DIR/worker-i), read by "
                        "tfstrategy.backup_callbacks(); refused if another user owns it or others can write it "
                        "(default with --max-restarts: a private directory, removed when the job succeeds, kept "
                        "with its resume command printed when it does not)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds for every worker to join, i.e. to create its strategy (default: 300; 0: no "
                        "limit); a joined job is never stopped for running long")
    parser.add_argument("--grace", type=float, default=10.0, metavar="S",
                        help="seconds workers get to exit after Ctrl-C or SIGTERM is passed on (default: 10)")
    parser.add_argument("--sentinel", default="epoch", metavar="WHEN",
                        help="check that every worker and replica holds the same finite weights: epoch (default: "
                        "at each epoch's end), every N steps, or off (env TFSTRATEGY_SENTINEL)")
    parser.add_argument("--stall-report", type=float, default=30.0, metavar="S",
                        help="seconds without progress before a stuck worker is named and every worker's stack "
                        "printed (default: 30; 20 steps' time when that is longer)")
    parser.add_argument("--stall-timeout", type=float, default=120.0, metavar="S",
                        help=f"seconds without progress that fail the job with status {EXIT_STALL} (or restart it "
                        "with --max-restarts) (default: 120; 0: only report stalls)")
    output = parser.add_argument_group("output")
    output.add_argument("--log-dir", type=Path, metavar="DIR",
                        help="write each worker's stdout and stderr to DIR/RUN_ID/attempt-K/worker-I/"
                        "{stdout,stderr}.log instead of the console")
    output.add_argument("--run-id", metavar="ID",
                        help="with --log-dir: the run's folder under DIR, e.g. exp1 or \"$SLURM_JOB_ID\" (the same on "
                        f"every node of one job) (default: ${ENV_RUN_ID}, else the start time and a short random part, "
                        "e.g. 20261206-103000-3f9a, so a second run never overwrites the first)")
    output.add_argument("--tee", action="store_true", help="with --log-dir: also copy every worker's output, both streams, to the console (takes no value)")
    output.add_argument("--console-workers", metavar="LIST",
                        help="only these workers' lines on the console, e.g. 0 or 1,2; the first one's progress bar "
                        "is live (like torchrun's --local-ranks-filter). Default: every worker's, worker 0's progress "
                        "live, and another worker's line that repeats worker 0's shown once; 'all': every line of "
                        "every worker, repeats included. With --log-dir and no --tee: none. The log files keep "
                        "every line")
    parser.add_argument("--port-range", metavar="LOW-HIGH",
                        help="the workers' ports on each machine come from LOW..HIGH, e.g. 29500-29599, so a firewall "
                        f"can allow just those (default: ${ENV_PORT_RANGE}, else the kernel's ephemeral range)")
    parser.add_argument("--isolate-network", action="store_true",
                        help="run the job in a private network namespace with only loopback, so TensorFlow's servers "
                        "(which listen on 0.0.0.0) are unreachable from other hosts; workers then have no network")
    nodes = parser.add_argument_group("several machines (no scheduler)")
    nodes.add_argument("--nnodes", action=_NodeCount, metavar="N|MIN:MAX",
                       help="machines in the job, each running this command with -n workers (default: 1, this one; "
                       "inside a Slurm job step, the step's tasks). MIN:MAX makes the job elastic: it starts with "
                       "at least MIN nodes, goes on without a node it loses while MIN remain, and takes nodes "
                       "(back) in up to MAX, each time resuming from the newest committed backup step "
                       "(needs --backup-dir on a file system every node shares)")
    nodes.add_argument("--rendezvous-wait", type=float, default=10.0, metavar="SECONDS",
                       help="with --nnodes MIN:MAX, how long the first round waits for more than MIN nodes "
                       "(default: 10)")
    nodes.add_argument("--node-rank", type=int, metavar="R",
                       help=f"this machine's rank 0..N-1, 0 on the --master machine (default: ${ENV_NODE_RANK})")
    nodes.add_argument("--master", metavar="HOST:PORT",
                       help="node 0's address and a free port for the rendezvous, the same on every node, "
                       "e.g. 10.0.0.5:29400")
    nodes.add_argument("--node-address", metavar="ADDR",
                       help="the address other nodes reach this one's workers at (default: the address this "
                       "machine reaches the master from), e.g. behind NAT or on a second network")
    nodes.add_argument("--secret-file", type=Path, metavar="FILE",
                       help=f"file holding the shared secret every node proves it knows (default: ${ENV_LAUNCH_SECRET})")
    add_program_arguments(parser, where=" in every worker")
    parser.set_defaults(command=launch_command)
    return parser


class _WorkerCount(argparse.Action):
    """``-n N`` or ``MIN:MAX``: ``num_workers`` is N (or MAX), ``min_workers`` MIN (``None`` for a fixed count)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        text = str(values).strip()
        parsed = parse_min_max(text)
        if parsed is None and text.lstrip("-").isdigit():
            parsed = (None, int(text))  # a negative count: refused with the others by validate_launch_options
        if parsed is None:
            raise argparse.ArgumentError(self, f"Received -n {text!r}; expected a worker count N, or MIN:MAX for a job "
                                         "that goes on while at least MIN of its MAX workers remain, e.g. -n 2 or "
                                         "-n 2:4.")
        namespace.min_workers, namespace.num_workers = parsed


class _NodeCount(argparse.Action):
    """``--nnodes N`` or ``MIN:MAX``: ``nnodes`` is N (or MAX), ``min_nodes`` MIN (``None`` for a fixed count)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from tfstrategy.launch.rendezvous.options import parse_nnodes

        try:
            fewest, count = parse_nnodes(str(values))
        except LaunchError as error:
            raise argparse.ArgumentError(self, str(error)) from None
        namespace.nnodes, namespace.min_nodes = count, fewest


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    """Validated :class:`LaunchOptions` from parsed arguments.

    Raises:
        LaunchError: invalid values.
    """
    from tfstrategy.launch import backup_dir
    from tfstrategy.launch.options import parse_port_range
    from tfstrategy.launch.supervisor import LaunchOptions, validate_launch_options

    program = program_from_args(args)
    _refuse_a_value_after_tee(args)
    if args.nnodes is None:  # not resolved yet (launch_command resolves it first)
        args, _ = node_arguments(args, os.environ)
    nodes = node_options_from_args(args, os.environ)
    view = console_view(args.console_workers, debug=args.debug)
    port_range = PORT_RANGE.read(os.environ) if args.port_range is None else parse_port_range(args.port_range)
    run_id = args.run_id
    if run_id is None and args.log_dir is not None:
        run_id = RUN_ID.read(os.environ)
    return validate_launch_options(
        LaunchOptions(
            command=tuple(program),
            num_workers=args.num_workers,
            min_workers=getattr(args, "min_workers", None),
            max_restarts=args.max_restarts,
            backup_dir=backup_dir.checked_backup_dir(args.backup_dir),
            join_timeout=None if args.timeout == 0 else args.timeout,
            grace=args.grace,
            audit=args.audit,
            nodes=nodes,
            stall_report=args.stall_report,
            stall_timeout=None if args.stall_timeout == 0 else args.stall_timeout,
            log_dir=args.log_dir,
            run_id=run_id,
            tee=args.tee,
            # "all" names every worker, so that with --log-dir they reach the console without --tee.
            console_workers=(frozenset(range(max(args.num_workers, 0) * args.nnodes)) if view.every_line
                             else _worker_list(args.console_workers)),
            console_view=view,
            port_range=port_range,
            precision=args.precision,
            sentinel=args.sentinel,
            profile_dir=Path(args.profile_dir) if args.profile else None,
            profile_every=args.profile_every,
            profile_probes=args.profile_probes,
        )
    )


def _refuse_a_value_after_tee(args: argparse.Namespace) -> None:
    """``--tee 3`` (torchrun's, which picks the streams) would make ``3`` the program: say ``--tee`` takes no value.

    Raises:
        LaunchError: the program, given without ``--``, starts with a number right after ``--tee``.
    """
    program = list(args.program)
    if not args.tee or not program or program[0] == "--" or not program[0].replace(",", "").isdigit():
        return
    rest = program[2:] if program[1:2] == ["--"] else program[1:]
    log_dir = args.log_dir if args.log_dir is not None else "logs"
    raise LaunchError(f"--tee takes no value (received '--tee {program[0]}'); it copies every worker's output, "
                      f"both streams, to the console as well as to --log-dir. Drop the {program[0]} and put the "
                      f"command after '--', e.g. tfstrategy launch -n {args.num_workers} --log-dir {log_dir} --tee -- "
                      f"{' '.join(rest) or 'python train.py'}.")


def _worker_indices(text: str) -> list[int]:
    """``--console-workers 1,0`` as indices, in order.

    Raises:
        LaunchError: anything but ``all`` or comma-separated non-negative integers.
    """
    parts = [part.strip() for part in text.split(",")]
    if not parts or not all(part.isdigit() for part in parts):
        raise LaunchError(f"Received --console-workers {text!r}; expected comma-separated worker indices or all, e.g. "
                          "--console-workers 0 or --console-workers 0,2.")
    return [int(part) for part in parts]


def _worker_list(text: str | None) -> frozenset[int] | None:
    """``--console-workers 0,2`` as a set (``None``: every worker)."""
    return None if text is None or text.strip() == "all" else frozenset(_worker_indices(text))


def console_view(text: str | None, *, debug: bool = False) -> ConsoleView:
    """The console's view from ``--console-workers`` (the first named is the lead) and ``--debug``.

    Raises:
        LaunchError: a malformed list.
    """
    from tfstrategy.launch.console import ConsoleView

    if text is not None and text.strip() == "all":
        return ConsoleView(every_line=True, debug=debug)
    return ConsoleView(lead=None if text is None else _worker_indices(text)[0], debug=debug)


def node_arguments(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[argparse.Namespace, SlurmNodes | None]:
    """``args`` with the multi-node options a Slurm job step gives (explicit flags win), and that step's view.

    Outside a job step of 2+ tasks (or with ``--nnodes``, ``--node-rank`` or ``--master``, or
    ``TFSTRATEGY_SLURM=off``) only ``--nnodes`` changes: to 1 when it was not given.

    Raises:
        LaunchError: the step's variables cannot be used, or no shared secret (see :func:`slurm_nodes`).
    """
    from tfstrategy.launch.slurm import slurm_nodes

    # --nnodes MIN:MAX alone makes a step's launchers elastic: the rank and the master still come from the step.
    elastic = getattr(args, "min_nodes", None) is not None
    explicit = (any(value is not None for value in (args.node_rank, args.master))
                or (args.nnodes is not None and not elastic))
    slurm = slurm_nodes(env, explicit=explicit, secret_file=args.secret_file is not None)
    if slurm is None:
        return argparse.Namespace(**{**vars(args), "nnodes": 1 if args.nnodes is None else args.nnodes}), None
    if elastic and args.nnodes < slurm.nnodes:
        raise LaunchError(f"Received --nnodes {args.min_nodes}:{args.nnodes} in a Slurm job step of {slurm.nnodes} "
                          f"tasks; expected MAX >= the step's tasks, one launcher a node, e.g. --nnodes "
                          f"{min(args.min_nodes, slurm.nnodes)}:{slurm.nnodes}.")
    return argparse.Namespace(**{**vars(args), "nnodes": args.nnodes if elastic else slurm.nnodes,
                                 "node_rank": slurm.node_rank, "master": slurm.master,
                                 "node_address": args.node_address or slurm.node_address}), slurm


def node_options_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> NodeOptions | None:
    """This machine's place in a multi-node job, or ``None`` without ``--nnodes`` (> 1).

    Raises:
        LaunchError: multi-node options without --nnodes, a missing or malformed --master or rank,
            no shared secret, or --isolate-network (which would cut the nodes apart).
    """
    from tfstrategy.launch.rendezvous import NodeOptions, parse_master, read_secret, validate_node_options

    example = "e.g. tfstrategy launch --nnodes 2 --node-rank 1 --master 10.0.0.5:29400 -n 2 -- python train.py"
    given = [name for name, value in (("--node-rank", args.node_rank), ("--master", args.master),
                                      ("--node-address", args.node_address), ("--secret-file", args.secret_file))
             if value is not None]
    if args.nnodes in (None, 1):
        if given:
            raise LaunchError(f"Received {', '.join(given)} with --nnodes 1; expected --nnodes N (2 or more) for a "
                              f"job on several machines, {example}; or drop {', '.join(given)}.")
        return None
    if args.isolate_network:
        raise LaunchError(f"Received --isolate-network with --nnodes {args.nnodes}; a private network namespace would "
                          "cut this node off from the others. Drop --isolate-network and firewall the workers' ports "
                          "(README: 'Several machines without a scheduler').")
    if args.master is None:
        raise LaunchError(f"Received --nnodes {args.nnodes} without --master; expected node 0's HOST:PORT, {example}.")
    rank = args.node_rank
    if rank is None:
        with contextlib.suppress(LaunchError):  # the message below says what both may hold
            rank = NODE_RANK.read(env, error=LaunchError)
        if rank is None:
            raise LaunchError(f"Received --nnodes {args.nnodes} without --node-rank, and {ENV_NODE_RANK}="
                              f"{NODE_RANK.text(env) or ''!r}; expected this machine's rank 0..{args.nnodes - 1} in "
                              f"either, {example}.")
    host, port = parse_master(args.master)
    node = validate_node_options(NodeOptions(nnodes=args.nnodes, node_rank=rank, master_host=host, master_port=port,
                                             secret=b"", node_address=args.node_address,
                                             min_nodes=getattr(args, "min_nodes", None),
                                             rendezvous_wait=getattr(args, "rendezvous_wait", 10.0)))
    return dataclasses.replace(node, secret=read_secret(args.secret_file, env))


def _command_line(options: LaunchOptions, *, debug: bool) -> list[str]:
    """These options as a ``tfstrategy`` command line (to re-run it in a network namespace)."""
    count = str(options.num_workers) if options.min_workers is None else f"{options.min_workers}:{options.num_workers}"
    line = ["launch", "-n", count, "--max-restarts", str(options.max_restarts),
            "--timeout", f"{options.join_timeout or 0:g}", "--grace", f"{options.grace:g}", "--audit", options.audit,
            "--stall-report", f"{options.stall_report:g}", "--stall-timeout", f"{options.stall_timeout or 0:g}",
            "--isolate-network", "--sentinel", options.sentinel]
    if options.backup_dir is not None:
        line += ["--backup-dir", str(options.backup_dir.resolve())]
    if options.log_dir is not None:
        line += ["--log-dir", str(options.log_dir.resolve()), "--run-id", str(options.run_id)]
        line += ["--tee"] if options.tee else []
    if options.console_workers is not None:
        line += ["--console-workers", ",".join(str(index) for index in sorted(options.console_workers))]
    if options.port_range is not None:
        line += ["--port-range", "{}-{}".format(*options.port_range)]
    if debug:
        line.append("--debug")
    if options.precision:
        line += ["--precision", options.precision]
    if options.profile_dir is not None:
        line += ["--profile", "--profile-dir", str(options.profile_dir), "--profile-every", f"{options.profile_every:g}"]
        if options.profile_probes is not None:
            line += ["--profile-probes", str(options.profile_probes)]
    return [*line, "--", *options.command]


def launch_command(args: argparse.Namespace) -> int:
    """Run the job; its exit status."""
    from tfstrategy.launch import backup_dir, network_isolation
    from tfstrategy.launch.options import worker_settings
    from tfstrategy.launch.supervisor import Launcher

    started = time.monotonic()
    quiet_tensorflow(args.debug)
    args, slurm = node_arguments(args, os.environ)
    options = options_from_args(args)
    if slurm is not None and slurm.node_rank == 0:
        print(f"tfstrategy launch: {slurm.describe()}", file=sys.stderr)
    worker_settings(options, os.environ)  # a setting the environment contradicts fails here, before any worker
    ensure_tensorflow_installed("this command")  # the workers' hook needs it; checked after the flags
    if args.isolate_network:
        if not network_isolation.is_isolated():
            network_isolation.reexec_isolated(_command_line(options, debug=args.debug))
        network_isolation.bring_up_loopback()
        print("tfstrategy launch: in a private network namespace: workers reach each other on 127.0.0.1 only, "
              "other hosts cannot reach them", file=sys.stderr)
    # The resume command: under Slurm the same srun derives the nodes again (a fixed --node-rank would not).
    nodes = None if options.nodes is None or slurm is not None else [
        "--nnodes", options.nodes.shape, "--node-rank", str(options.nodes.node_rank), "--master", args.master]
    env = dict(os.environ)
    result = backup_dir.run_with_backup(options, lambda opts: Launcher(opts, env=env).run(), env=env,
                                        timeout=args.timeout, nodes=nodes,
                                        say=lambda text: print(f"tfstrategy launch: {text}", file=sys.stderr))
    if result.restart_seconds:
        timings = ", ".join(f"{seconds:.1f} s" for seconds in result.restart_seconds)
        rejoined = ", ".join(f"{seconds:.1f} s" for seconds in result.rejoin_seconds) or "never"
        print(f"tfstrategy launch: {result.restarts} restart(s); failure to relaunch {timings}; "
              f"failure to all workers joined again {rejoined}", file=sys.stderr)
    if result.reformations:
        joined = ", ".join(f"{seconds:.1f} s" for seconds in result.reform_seconds) or "never"
        back = any(record.get("joined_worker") is not None for record in result.reformations)
        what = ("nodes lost or joined" if options.min_workers is None else
                "workers lost or taken back" if back else "workers lost")
        print(f"tfstrategy launch: {len(result.reformations)} re-formation(s) for {what} (not restarts); "
              f"re-formation to all workers joined {joined}", file=sys.stderr)
    from tfstrategy.launch.output import status_line

    # One plain last line in every output mode (with --log-dir and no --tee it is the only one).
    print("tfstrategy launch: " + status_line(
        reason=result.reason.value, returncode=result.returncode, workers=result.workers or options.num_workers,
        seconds=time.monotonic() - started, restarts=result.restarts, nodes=args.nnodes, log_dir=options.run_log_dir,
    ), file=sys.stderr)
    return result.returncode
