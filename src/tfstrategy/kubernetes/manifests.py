"""The manifests of ``tfstrategy k8s``: an Indexed Job, its headless Service and a NetworkPolicy (pure).

Each pod of an Indexed Job gets ``JOB_COMPLETION_INDEX`` and the hostname ``<job>-<index>``;
with the pod template's ``subdomain`` naming a headless Service, ``<job>-<index>.<service>``
resolves to it from every pod of the namespace. The pods learn the rest from the
variables of :data:`POD_VARIABLES` (the pod contract, :mod:`tfstrategy.contract.pod`), which
:class:`tfstrategy.environments.kubernetes.KubernetesEnvironment` reads to build
``TF_CONFIG``. Everything here returns plain dicts; :mod:`tfstrategy.kubernetes.yaml_text`
writes them.

Exit codes and ``podFailurePolicy`` (first matching rule wins): a pod with the condition
``DisruptionTarget`` (preempted, evicted or drained: not the job's fault) is restarted without
counting; then each exit status of the contract's table
(:data:`tfstrategy.contract.exits.EXIT_STATUSES`) gets its ``kubernetes`` action: ``Ignore`` for
tfstrategy's preemption (every worker saved) and TensorFlow's ``PreemptionCheckpointHandler``
restart request (which the Kubernetes docs' example treats as permanent: not here), ``FailJob`` for
invalid options or usage (tfstrategy's CLI, argparse, python's "can't open file": a retry cannot
help); anything else is counted, retried up to ``backoffLimitPerIndex`` times (a lost peer makes
the survivors exit 1 too, so 1 cannot mean "user error, give up").

``maxFailedIndexes: 0`` fails the whole Job once one index used up its retries (its peers
could never finish without it), and ``podReplacementPolicy: Failed`` keeps a replacement pod
from starting while the old one still holds its task (TensorFlow refuses a duplicate task).

Names follow each kind's rule (:mod:`tfstrategy.kubernetes.names`), checked on every object
written; resources, placement and queues are :mod:`tfstrategy.kubernetes.scheduling`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfstrategy.contract.exits import EXIT_STATUSES, PodAction
from tfstrategy.contract.exits import EXIT_TENSORFLOW_RESTART as TENSORFLOW_RESTART_EXIT_CODE  # noqa: F401 (moved there)
from tfstrategy.contract.pod import (
    COMPLETION_INDEX,
    COMPLETION_INDEX_ANNOTATION,
    ENV_K8S_FAILURES,
    ENV_K8S_IGNORED_FAILURES,
    ENV_K8S_JOB,
    ENV_K8S_PORT,
    ENV_K8S_SERVICE,
    ENV_K8S_WORKERS,
    FAILURE_COUNT_ANNOTATION,
    IGNORED_FAILURE_COUNT_ANNOTATION,
    JOB_NAME_LABEL,
    POD_VARIABLES,
)
from tfstrategy.errors import LaunchError
from tfstrategy.kubernetes.names import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    MAX_HOSTNAME,
    NAME_IN_LABEL,
    check_generated_names,
    check_names,
    derive_name,
    name_problem,
)
from tfstrategy.kubernetes.scheduling import (
    DEFAULT_CPU,
    DEFAULT_MEMORY,
    DEFAULT_TTL,
    KUEUE_QUEUE_LABEL,
    Toleration,
    check_quantity,
    parse_node_selector,
    parse_toleration,
    parse_ttl,
    quantity,
    resources,
)
from tfstrategy.settings import BACKUP_DIR, ENV_LAUNCH_SECRET, ENV_NODE_RANK, JOB_ID

__all__ = [
    "K8sOptions", "validate_k8s_options", "manifests", "job_manifest", "service_manifest", "network_policy_manifest",
    "pod_failure_policy", "POD_VARIABLES", "ENV_K8S_JOB", "ENV_K8S_SERVICE", "ENV_K8S_WORKERS", "ENV_K8S_PORT",
    "ENV_K8S_FAILURES", "ENV_K8S_IGNORED_FAILURES", "COMPLETION_INDEX", "CONTAINER_NAME",
]

CONTAINER_NAME = "worker"
DEFAULT_PORT = 2222  # Kubeflow TFJob's port, which images and firewall rules often already allow

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_RESERVED = frozenset({"TF_CONFIG", BACKUP_DIR.name, JOB_ID.name, *POD_VARIABLES})
_EXAMPLE = "e.g. tfstrategy k8s -n 4 --image registry.example.com/train:1 -- python train.py"


@dataclass(frozen=True, kw_only=True)
class K8sOptions:
    """What ``tfstrategy k8s`` generates; see ``tfstrategy k8s --help`` for each field."""

    command: tuple[str, ...]
    num_workers: int
    image: str
    name: str
    namespace: str | None = None
    port: int = DEFAULT_PORT
    #: Requests; ``None`` leaves one out (a pod with neither is BestEffort, evicted first).
    cpu: str | None = DEFAULT_CPU
    memory: str | None = DEFAULT_MEMORY
    cpu_limit: str | None = None
    gpus: int = 0
    backup_pvc: str | None = None
    backup_dir: str = "/backups"
    max_restarts: int = 3
    grace: int = 30
    env: Mapping[str, str] = field(default_factory=dict)
    network_policy: bool = True
    hook: bool = True
    #: Options of ``tfstrategy run`` in the pods, e.g. ``("--audit", "stop")``.
    run_options: tuple[str, ...] = ()
    #: Seconds a finished Job is kept; ``None`` keeps it until deleted.
    ttl_after_finished: int | None = DEFAULT_TTL
    #: Kueue LocalQueue; the Job is then written suspended, for Kueue to start.
    queue: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str | None = None
    #: ``--elastic MIN:MAX``: each pod runs one node of ``tfstrategy launch --nnodes MIN:MAX`` (``num_workers`` is MAX).
    elastic: tuple[int, int] | None = None
    #: The Secret whose key ``secret`` is the launchers' shared secret (``--launch-secret``; elastic jobs).
    launch_secret: str | None = None

    @property
    def rendezvous_port(self) -> int:
        """Node 0's rendezvous port in an elastic job: the one after TensorFlow's."""
        return self.port + 1


def validate_k8s_options(options: K8sOptions) -> K8sOptions:
    """Check every field; return the options unchanged.

    Raises:
        LaunchError: the first invalid field, naming the flag that sets it.
    """
    if not options.command:
        raise LaunchError(f"Received no command after '--'; expected the program every pod runs, {_EXAMPLE}.")
    if options.num_workers < 1:
        raise LaunchError(f"Received -n {options.num_workers}; expected 1 or more pods, {_EXAMPLE}.")
    if not options.image or any(char.isspace() for char in options.image):
        raise LaunchError(f"Received --image {options.image!r}; expected a container image reference without "
                          f"spaces that has TensorFlow and tfstrategy installed, {_EXAMPLE}.")
    _check_name(options)
    if options.namespace is not None and (problem := name_problem(options.namespace, DNS1123_LABEL)) is not None:
        raise LaunchError(f"Received --namespace {options.namespace!r}, which {problem}; expected a namespace name, "
                          f"{DNS1123_LABEL.expected()}, e.g. --namespace ml-team.")
    if not 1 <= options.port <= 65535:
        raise LaunchError(f"Received --port {options.port}; expected TensorFlow's gRPC port in 1-65535, e.g. --port 2222.")
    _check_resources(options)
    if options.gpus < 0:
        raise LaunchError(f"Received --gpus {options.gpus}; expected the number of GPUs per pod, 0 or more.")
    if options.max_restarts < 0:
        raise LaunchError(f"Received --max-restarts {options.max_restarts}; expected 0 or more restarts of each pod.")
    if options.grace < 1:
        raise LaunchError(f"Received --grace {options.grace}; expected the seconds a pod gets after SIGTERM to agree "
                          "on a step, save and exit, 1 or more (Kubernetes' default is 30).")
    check_names("--backup-pvc", [options.backup_pvc] if options.backup_pvc is not None else [], "train-backups")
    if not options.backup_dir.startswith("/") or options.backup_dir.rstrip("/") == "":
        raise LaunchError(f"Received --backup-dir {options.backup_dir!r}; expected an absolute path inside the pod "
                          "other than '/', e.g. --backup-dir /backups.")
    if options.run_options and not options.hook:
        raise LaunchError(f"Received {' '.join(options.run_options)} with --no-hook; these are options of "
                          "'tfstrategy run', which --no-hook leaves out. Drop one or the other.")
    for key in options.env:
        if not _ENV_NAME.match(key):
            raise LaunchError(f"Received --env {key!r}; expected NAME=VALUE with a variable name such as "
                              "DATA_DIR=/data.")
        if key in _RESERVED:
            raise LaunchError(f"Received --env {key}=...; tfstrategy sets {key} in each pod from the other flags. "
                              "Drop it (the port is --port, the backups --backup-pvc and --backup-dir).")
    _check_placement(options)
    _check_elastic(options)
    return options


def _check_elastic(options: K8sOptions) -> None:
    if options.elastic is None:
        if options.launch_secret is not None:
            raise LaunchError(f"Received --launch-secret {options.launch_secret} without --elastic; only an elastic "
                              "job's launchers use it. Drop it, or add --elastic MIN:MAX.")
        return
    fewest, most = options.elastic
    example = ("e.g. tfstrategy k8s --elastic 2:4 --launch-secret train-secret --backup-pvc train-backups "
               "--image IMAGE -- python train.py")
    if not 1 <= fewest <= most or most != options.num_workers:
        raise LaunchError(f"Received --elastic {fewest}:{most} with -n {options.num_workers}; expected 1 <= MIN <= MAX "
                          f"and -n MAX (or no -n), {example}.")
    if options.backup_pvc is None:
        raise LaunchError(f"Received --elastic {fewest}:{most} without --backup-pvc; every re-formed group resumes "
                          "from the job's backups, which every pod must read: name a ReadWriteMany "
                          f"PersistentVolumeClaim, {example}.")
    if options.launch_secret is None:
        raise LaunchError(f"Received --elastic {fewest}:{most} without --launch-secret; the pods' launchers prove to "
                          "each other that they belong to the job with a shared secret. Create one (kubectl create "
                          "secret generic train-secret --from-literal=secret=$(python -c 'import secrets; "
                          f"print(secrets.token_hex(32))')) and name it, {example}.")
    check_names("--launch-secret", [options.launch_secret], "train-secret")
    if not options.hook:
        raise LaunchError(f"Received --elastic {fewest}:{most} with --no-hook; each pod runs 'tfstrategy launch', "
                          "which always starts the script under tfstrategy's hook. Drop --no-hook.")
    if options.rendezvous_port > 65535:
        raise LaunchError(f"Received --port {options.port} with --elastic; the rendezvous listens on the next port, "
                          "which must be 65535 or less. Pick a lower --port.")


def _check_name(options: K8sOptions) -> None:
    # The name is the Service's (a DNS-1035 label) and the prefix of every pod's hostname
    # <name>-<index> (a DNS-1123 label of at most 63 characters, which <name>-<index>.<service> resolves).
    last = f"{options.name}-{options.num_workers - 1}"
    problem = name_problem(options.name, DNS1035_LABEL)
    if problem is None and len(last) > MAX_HOSTNAME:
        problem = f"makes the last pod's hostname {last!r} {len(last)} characters long"
    if problem is not None:
        raise LaunchError(f"Received --name {options.name!r}, which {problem}; it names the headless Service, so it must "
                          f"be {DNS1035_LABEL.title} ({DNS1035_LABEL.describes}), short enough that the pod hostnames "
                          f"up to {last!r} have at most 63 characters. Use e.g. --name "
                          f"{derive_name(options.name, options.num_workers)}.")


def _check_resources(options: K8sOptions) -> None:
    for flag, value, example in (("--cpu", options.cpu, "500m"), ("--memory", options.memory, "16Gi"),
                                 ("--cpu-limit", options.cpu_limit, "8")):
        if value is not None:
            check_quantity(flag, value, example)
    if options.cpu is not None and options.cpu_limit is not None:
        request, limit = quantity(options.cpu), quantity(options.cpu_limit)
        if request is not None and limit is not None and limit < request:
            raise LaunchError(f"Received --cpu-limit {options.cpu_limit} below --cpu {options.cpu}; Kubernetes refuses "
                              f"a limit under the request. Raise --cpu-limit to {options.cpu} or more, or lower --cpu.")


def _check_placement(options: K8sOptions) -> None:
    if options.ttl_after_finished is not None:
        parse_ttl(str(options.ttl_after_finished))  # the CLI's one-line refusal of a negative or an over-int32
    if options.queue is not None:
        problem = name_problem(options.queue, NAME_IN_LABEL)
        if problem is not None:
            raise LaunchError(f"Received --queue {options.queue!r}, which {problem}; expected the name of a Kueue "
                              f"LocalQueue in the Job's namespace (kubectl get localqueues lists them), "
                              f"{NAME_IN_LABEL.expected()}, e.g. --queue user-queue.")
        if options.cpu is None and options.memory is None and not options.gpus:
            raise LaunchError("Received --queue without any resource request; Kueue admits a Job by the resources "
                              "its pods request. Set --cpu, --memory or --gpus.")
    parse_node_selector(f"{key}={value}" for key, value in options.node_selector.items())
    for toleration in options.tolerations:
        parse_toleration(toleration.text())
    check_names("--image-pull-secret", options.image_pull_secrets, "regcred")
    check_names("--service-account", [options.service_account] if options.service_account is not None else [],
                "trainer")


def pod_failure_policy() -> dict[str, Any]:
    """The Job's ``podFailurePolicy``, from the contract's exit statuses (each one's ``kubernetes`` action)."""
    rules: list[dict[str, Any]] = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    for action in (PodAction.IGNORE, PodAction.FAIL_JOB):  # Count needs no rule: it is what an unmatched exit gets
        codes = sorted(status.code for status in EXIT_STATUSES if status.kubernetes is action)
        rules.append({"action": action.value,
                      "onExitCodes": {"containerName": CONTAINER_NAME, "operator": "In", "values": codes}})
    return {"rules": rules}


def _metadata(options: K8sOptions, name: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if options.namespace is not None:
        metadata["namespace"] = options.namespace
    metadata["labels"] = {"app.kubernetes.io/name": options.name, "app.kubernetes.io/managed-by": "tfstrategy"}
    return metadata


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def pod_environment(options: K8sOptions) -> list[dict[str, Any]]:
    """The container's ``env``: the pod contract, the backups and the user's ``--env``."""
    if options.elastic is not None:  # the pod's launcher forms the cluster: no pod contract
        return [
            {"name": ENV_NODE_RANK, **_field(f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']")},
            {"name": ENV_LAUNCH_SECRET, "valueFrom": {"secretKeyRef": {"name": options.launch_secret, "key": "secret"}}},
            {"name": JOB_ID.name, **_field(f"metadata.labels['{JOB_NAME_LABEL}']")},
            *_values(options.env),
        ]
    env: list[dict[str, Any]] = [
        {"name": ENV_K8S_JOB, **_field(f"metadata.labels['{JOB_NAME_LABEL}']")},
        {"name": ENV_K8S_SERVICE, "value": options.name},
        {"name": ENV_K8S_WORKERS, "value": str(options.num_workers)},
        {"name": ENV_K8S_PORT, "value": str(options.port)},
        {"name": ENV_K8S_FAILURES, **_field(f"metadata.annotations['{FAILURE_COUNT_ANNOTATION}']")},
        {"name": ENV_K8S_IGNORED_FAILURES, **_field(f"metadata.annotations['{IGNORED_FAILURE_COUNT_ANNOTATION}']")},
        # The job's identity in its backups: the Job's name, so a Job applied again under the same name resumes.
        {"name": JOB_ID.name, **_field(f"metadata.labels['{JOB_NAME_LABEL}']")},
    ]
    if options.backup_pvc is not None:
        env.extend(_values(BACKUP_DIR.to_environ(options.backup_dir)))
    env.extend(_values(options.env))
    return env


def _values(environ: Mapping[str, str]) -> list[dict[str, Any]]:
    return [{"name": key, "value": value} for key, value in environ.items()]


def pod_command(options: K8sOptions) -> list[str]:
    """What each pod runs: the command under ``tfstrategy run``, or, elastic, one node of ``tfstrategy launch``."""
    if options.elastic is not None:
        fewest, most = options.elastic
        # The pod's stable name (<job>-<index>.<service>), which the kubelet expands from the pod's rank.
        return ["tfstrategy", "launch", "--nnodes", f"{fewest}:{most}", "--master",
                f"{options.name}-0.{options.name}:{options.rendezvous_port}",
                "--node-address", f"{options.name}-$({ENV_NODE_RANK}).{options.name}", "-n", "1",
                "--port-range", f"{options.port}-{options.port}", "--backup-dir", options.backup_dir,
                "--grace", str(max(1, options.grace - 5)), *options.run_options, "--", *options.command]
    return ["tfstrategy", "run", *options.run_options, "--", *options.command] if options.hook else list(options.command)


def _ports(options: K8sOptions) -> list[tuple[str, int]]:
    ports = [("tf-grpc", options.port)]
    return ports if options.elastic is None else [*ports, ("rendezvous", options.rendezvous_port)]


def job_manifest(options: K8sOptions) -> dict[str, Any]:
    """The Indexed Job: one pod per worker, each running the command under ``tfstrategy run`` (or ``launch``)."""
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": options.image,
        "command": pod_command(options),
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in _ports(options)],
        "env": pod_environment(options),
    }
    amounts = resources(options.cpu, options.memory, options.cpu_limit, options.gpus)
    if amounts:
        container["resources"] = amounts
    pod: dict[str, Any] = {"subdomain": options.name, "restartPolicy": "Never",
                           # SIGTERM then SIGKILL after this: the time tfstrategy's preemption has to save.
                           "terminationGracePeriodSeconds": options.grace, "containers": [container]}
    if options.service_account is not None:
        pod["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": secret} for secret in options.image_pull_secrets]
    if options.node_selector:
        pod["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        pod["tolerations"] = [toleration.manifest() for toleration in options.tolerations]
    if options.backup_pvc is not None:
        container["volumeMounts"] = [{"name": "backups", "mountPath": options.backup_dir, "subPath": options.name}]
        pod["volumes"] = [{"name": "backups", "persistentVolumeClaim": {"claimName": options.backup_pvc}}]
    metadata = _metadata(options, options.name)
    spec: dict[str, Any] = {}
    if options.queue is not None:
        metadata["labels"][KUEUE_QUEUE_LABEL] = options.queue
        # Kueue's documented way: created suspended, unsuspended by Kueue once the queue admits it.
        spec["suspend"] = True
    if options.ttl_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = options.ttl_after_finished
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            **spec,
            "completionMode": "Indexed",
            "completions": options.num_workers,
            "parallelism": options.num_workers,
            "backoffLimitPerIndex": options.max_restarts,
            "maxFailedIndexes": 0,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": pod_failure_policy(),
            "template": {"metadata": {"labels": {"app.kubernetes.io/name": options.name}}, "spec": pod},
        },
    }


def service_manifest(options: K8sOptions) -> dict[str, Any]:
    """The headless Service that gives each pod the name ``<job>-<index>.<service>``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(options, options.name),
        "spec": {
            "clusterIP": "None",
            # A pod's name resolves before it is Ready: workers connect to each other while starting.
            "publishNotReadyAddresses": True,
            "selector": {JOB_NAME_LABEL: options.name},
            "ports": [{"name": name, "port": port, "targetPort": port, "protocol": "TCP"} for name, port in _ports(options)],
        },
    }


def network_policy_manifest(options: K8sOptions) -> dict[str, Any]:
    """Only the job's own pods may reach its TensorFlow port (the gRPC server has no authentication)."""
    pods = {"matchLabels": {JOB_NAME_LABEL: options.name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(options, f"{options.name}-tf-grpc"),
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": pods}],
                         "ports": [{"protocol": "TCP", "port": port} for _, port in _ports(options)]}],
        },
    }


def manifests(options: K8sOptions) -> list[dict[str, Any]]:
    """Every object to apply, in order: the Service, the NetworkPolicy (unless turned off), the Job.

    Raises:
        LaunchError: invalid options.
    """
    validate_k8s_options(options)
    objects = [service_manifest(options)]
    if options.network_policy:
        objects.append(network_policy_manifest(options))
    objects.append(job_manifest(options))
    check_generated_names(objects)
    return objects
