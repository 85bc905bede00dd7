"""``tfstrategy k8s``: write the Kubernetes manifests that run a script as one multi-worker job."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from tfstrategy.cli._common import program_from_args
from tfstrategy.contract.exits import EXIT_INVALID, EXIT_PREEMPTED, EXIT_TENSORFLOW_RESTART
from tfstrategy.errors import LaunchError
from tfstrategy.kubernetes.manifests import DEFAULT_PORT, K8sOptions, validate_k8s_options
from tfstrategy.kubernetes.names import name_from_command
from tfstrategy.kubernetes.scheduling import (
    DEFAULT_CPU,
    DEFAULT_MEMORY,
    DEFAULT_TTL,
    KUEUE_QUEUE_LABEL,
    TAINT_EFFECTS,
    parse_node_selector,
    parse_toleration,
    parse_ttl,
)
from tfstrategy.settings import AUDIT_MODES, parse_min_max

__all__ = ["k8s_parser", "k8s_command", "options_from_args"]

DESCRIPTION = textwrap.dedent(
    f"""\
    Write the manifests that run COMMAND as N pods of one MultiWorkerMirroredStrategy
    job on Kubernetes, without an operator: an Indexed Job (one pod per worker, pod i
    named <name>-i.<name> through a headless Service), the Service, and a NetworkPolicy
    that lets only the job's pods reach TensorFlow's gRPC port (TensorFlow's servers
    have no authentication). Each pod runs 'tfstrategy run -- COMMAND', and tfstrategy
    builds its TF_CONFIG from JOB_COMPLETION_INDEX and the variables the Job sets: the
    script needs no change. The image needs TensorFlow and tfstrategy.

    Failures: a pod that exits {EXIT_PREEMPTED} (tfstrategy's preemption: every worker saved) or {EXIT_TENSORFLOW_RESTART}
    (TensorFlow's restart request), or is evicted or preempted, is restarted without
    counting; exit {EXIT_INVALID} (invalid options) fails the Job at once; any other failure
    restarts that pod up to --max-restarts times (its peers fail and restart with
    it), then fails the Job. With --backup-pvc, callbacks=tfstrategy.backup_callbacks()
    in model.fit resumes every restarted worker from the newest step every worker
    backed up, on the claim (ReadWriteMany when pods run on several nodes).
    """
)

EPILOG = textwrap.dedent(
    """\
    example:
      tfstrategy k8s -n 4 --image registry.example.com/train:1 --gpus 1 --cpu 8 --memory 32Gi \\
          --toleration nvidia.com/gpu:NoSchedule --queue user-queue \\
          --backup-pvc train-backups --max-restarts 3 --env DATA_DIR=/data -o train.yaml -- python train.py
      kubectl apply -f train.yaml
      kubectl logs -f -l batch.kubernetes.io/job-name=train --prefix
      kubectl get job train -w

    Needs Kubernetes 1.33 or later (backoffLimitPerIndex is GA there).
    """
)


def k8s_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``tfstrategy k8s``."""
    parser: argparse.ArgumentParser = subparsers.add_parser("k8s", help="write Kubernetes manifests (Indexed Job) that run a script as N workers",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--num-workers", type=int, metavar="N",
                        help="pods in the job, one worker each (with --elastic: MAX, its default)")
    parser.add_argument("--image", required=True, metavar="IMAGE",
                        help="container image with TensorFlow and tfstrategy, e.g. registry.example.com/train:1")
    parser.add_argument("--name", metavar="NAME",
                        help="the Job's and the headless Service's name: a DNS-1035 label (lower-case letters, digits "
                        "and '-', starting with a letter), with NAME-<N-1> at most 63 characters as it is the last "
                        "pod's hostname. Default: the script's name, lower-cased, other characters as '-', 'job-' "
                        "in front unless it starts with a letter (train_v2.py -> train-v2, 2_train.py -> job-2-train)")
    parser.add_argument("--namespace", metavar="NS", help="the objects' namespace (default: kubectl's current one)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="PORT",
                        help=f"TensorFlow's gRPC port in every pod (default: {DEFAULT_PORT})")
    resources = parser.add_argument_group(
        "resources per pod", "Requests place each pod on a node with that much free; a pod without any is\n"
        "BestEffort, the first evicted when a node runs short, so there are always some.")
    resources.add_argument("--cpu", default=DEFAULT_CPU, metavar="Q",
                           help=f"CPUs each pod requests, e.g. 8 or 500m (default: {DEFAULT_CPU}). No CPU limit "
                           "unless --cpu-limit: a throttled worker stalls all its peers in every collective")
    resources.add_argument("--memory", default=DEFAULT_MEMORY, metavar="Q",
                           help=f"memory each pod requests and may use (request = limit), e.g. 32Gi (default: "
                           f"{DEFAULT_MEMORY}); a worker above it is OOM-killed (exit 137, a counted restart): read "
                           "kubectl top pod on a first run and set it")
    resources.add_argument("--cpu-limit", metavar="Q",
                           help="cap each pod's CPU at Q, at least --cpu (default: no cap); equal to --cpu makes the "
                           "pods Guaranteed (what the kubelet's static CPU manager pins cores for)")
    resources.add_argument("--gpus", type=int, default=0, metavar="G", help="NVIDIA GPUs (nvidia.com/gpu), default 0")
    placement = parser.add_argument_group("placement, queues and clean-up")
    placement.add_argument("--queue", metavar="LOCALQUEUE",
                           help=f"submit through Kueue: the Job gets the label {KUEUE_QUEUE_LABEL}=LOCALQUEUE and "
                           "starts suspended, and Kueue starts it when the queue admits its pods' requests "
                           "(kubectl get localqueues lists the queues; without Kueue the Job stays suspended)")
    placement.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                           help="run only on nodes with this label (repeatable; every one must match), e.g. "
                           "cloud.google.com/gke-accelerator=nvidia-l4; kubectl get nodes --show-labels lists them")
    placement.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]",
                           help="allow the pods onto nodes with this taint (repeatable): KEY=VALUE:EFFECT tolerates "
                           "that taint, KEY:EFFECT any value of KEY, no EFFECT every effect; EFFECT is "
                           f"{', '.join(TAINT_EFFECTS)}; e.g. nvidia.com/gpu:NoSchedule (kubectl describe node "
                           "shows a node's taints)")
    placement.add_argument("--image-pull-secret", action="append", default=[], metavar="SECRET",
                           help="a docker-registry Secret in the Job's namespace that pulls --image from a private "
                           "registry (repeatable), e.g. regcred from kubectl create secret docker-registry regcred ...")
    placement.add_argument("--service-account", metavar="SA",
                           help="the pods' ServiceAccount, e.g. one bound to a cloud identity that reads the training "
                           "data (default: the namespace's default)")
    placement.add_argument("--ttl-after-finished", default=str(DEFAULT_TTL), metavar="S",
                           help=f"seconds after the Job finishes before Kubernetes deletes it and its pods, logs "
                           f"included (ttlSecondsAfterFinished; default: {DEFAULT_TTL}, a day), which frees the name "
                           "for the next apply; 'never' keeps them. Backups on --backup-pvc are kept either way")
    faults = parser.add_argument_group("restarts and backups")
    faults.add_argument("--max-restarts", type=int, default=3, metavar="K",
                        help="restart each pod up to K times after a failure (backoffLimitPerIndex; default: 3)")
    faults.add_argument("--grace", type=int, default=30, metavar="S",
                        help="seconds a pod gets after SIGTERM (eviction, preemption) to agree on a step, save its "
                        f"backup and exit {EXIT_PREEMPTED} (terminationGracePeriodSeconds; default: 30)")
    faults.add_argument("--backup-pvc", metavar="CLAIM",
                        help="PersistentVolumeClaim holding the job's backups (a folder NAME on it)")
    faults.add_argument("--backup-dir", metavar="DIR",
                        help="where the backups are mounted in each pod, TFSTRATEGY_BACKUP_DIR (default: /backups)")
    elastic = parser.add_argument_group(
        "elastic jobs", "Each pod runs one node of 'tfstrategy launch --nnodes MIN:MAX' (docs/guides/elastic.md):\n"
        "pod 0 hosts the rendezvous on --port + 1; a pod lost or deleted re-forms the others\n"
        "without it, a pod that (re)starts is taken in, each group resumes from the backups.\n"
        "Scale by changing completions and parallelism together (Kubernetes 1.31+):\n"
        "kubectl patch job NAME --type=merge -p '{\"spec\":{\"completions\":2,\"parallelism\":2}}'")
    elastic.add_argument("--elastic", metavar="MIN:MAX",
                         help="an elastic Indexed Job of MAX pods that trains on while MIN remain (needs "
                         "--backup-pvc, a ReadWriteMany claim, and --launch-secret)")
    elastic.add_argument("--launch-secret", metavar="SECRET",
                         help="the Secret whose key 'secret' holds the launchers' shared secret, e.g. from kubectl "
                         "create secret generic train-secret --from-literal=secret=$(openssl rand -hex 32)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for every pod (repeatable)")
    parser.add_argument("--no-network-policy", action="store_true",
                        help="leave the NetworkPolicy out (e.g. the cluster's network plugin does not enforce them)")
    parser.add_argument("--audit", choices=AUDIT_MODES, metavar="MODE",
                        help="passed to 'tfstrategy run' in the pods: warn (its default), stop or off")
    parser.add_argument("--precision", metavar="POLICY",
                        help="passed to 'tfstrategy run' in the pods: float32, mixed_float16 or mixed_bfloat16")
    parser.add_argument("--no-hook", action="store_true",
                        help="run COMMAND itself instead of 'tfstrategy run -- COMMAND' (the script then calls "
                        "tfstrategy.select() to form the job)")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write the manifests here (default: stdout)")
    parser.add_argument("--json", action="store_true", help="write a JSON list of the objects instead of YAML")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the program every pod runs, after '--'")
    parser.set_defaults(command=k8s_command)
    return parser


def _env_pairs(items: list[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchError(f"Received --env {item!r}; expected NAME=VALUE, e.g. --env DATA_DIR=/data.")
        pairs[key] = value
    return pairs


def options_from_args(args: argparse.Namespace) -> K8sOptions:
    """Validated :class:`K8sOptions` from parsed arguments.

    Raises:
        LaunchError: an invalid value, naming its flag.
    """
    from tfstrategy.training.precision import precision_environment

    command = tuple(program_from_args(args))
    precision_environment(args.precision, {})  # a bad --precision fails here, in one line
    run_options = (*(("--audit", args.audit) if args.audit else ()),
                   *(("--precision", args.precision) if args.precision else ()))
    if args.backup_pvc is None and args.backup_dir is not None:
        raise LaunchError(f"Received --backup-dir {args.backup_dir} without --backup-pvc; a directory in a pod "
                          "disappears with the pod. Name the PersistentVolumeClaim to keep the backups on, "
                          "e.g. --backup-pvc train-backups.")
    elastic = _elastic(args.elastic)
    workers = args.num_workers if args.num_workers is not None else (elastic[1] if elastic else None)
    if workers is None:
        raise LaunchError("Received no -n; expected the number of pods, e.g. tfstrategy k8s -n 4 --image IMAGE -- "
                          "python train.py (or --elastic MIN:MAX).")
    return validate_k8s_options(K8sOptions(
        command=command, num_workers=workers, image=args.image,
        name=args.name if args.name is not None else name_from_command(command, workers),
        namespace=args.namespace, port=args.port, cpu=args.cpu, memory=args.memory, cpu_limit=args.cpu_limit,
        gpus=args.gpus, backup_pvc=args.backup_pvc,
        backup_dir=args.backup_dir or "/backups", max_restarts=args.max_restarts, grace=args.grace, env=_env_pairs(args.env),
        network_policy=not args.no_network_policy, hook=not args.no_hook, run_options=run_options,
        ttl_after_finished=parse_ttl(args.ttl_after_finished), queue=args.queue,
        node_selector=parse_node_selector(args.node_selector),
        tolerations=tuple(parse_toleration(text) for text in args.toleration),
        image_pull_secrets=tuple(args.image_pull_secret), service_account=args.service_account,
        elastic=elastic, launch_secret=args.launch_secret,
    ))


def _elastic(text: str | None) -> tuple[int, int] | None:
    """``--elastic MIN:MAX`` as ``(MIN, MAX)``.

    Raises:
        LaunchError: not two counts ``MIN:MAX``.
    """
    if text is None:
        return None
    parsed = parse_min_max(text)
    if parsed is None or parsed[0] is None:
        raise LaunchError(f"Received --elastic {text!r}; expected MIN:MAX, the fewest and the most pods the job trains "
                          "with, e.g. --elastic 2:4.")
    return parsed[0], parsed[1]


def k8s_command(args: argparse.Namespace) -> int:
    """Write the manifests; 0."""
    from tfstrategy.kubernetes.manifests import manifests
    from tfstrategy.kubernetes.yaml_text import dump_all

    options = options_from_args(args)
    objects = manifests(options)
    text = json.dumps(objects, indent=2) + "\n" if args.json else dump_all(objects)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text)
    except OSError as error:
        raise LaunchError(f"Received -o {args.output}, which cannot be written ({error.strerror or error}); "
                          "expected a writable file path, e.g. -o train.yaml.") from error
    kinds = ", ".join(f"{obj['kind']} {obj['metadata']['name']}" for obj in objects)
    print(f"tfstrategy k8s: wrote {kinds} to {args.output}; apply with: kubectl apply -f {args.output}", file=sys.stderr)
    return 0
