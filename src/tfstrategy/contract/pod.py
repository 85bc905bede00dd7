"""The pod contract of ``tfstrategy k8s``: the variables a generated Indexed Job gives each pod.

:mod:`tfstrategy.kubernetes.manifests` writes them into the Job; the pod's side,
:class:`tfstrategy.environments.kubernetes.KubernetesEnvironment`, reads them to build ``TF_CONFIG``.
Both import them from here, so the pod's environment needs nothing of the manifest generator.
Pure; nothing here imports TensorFlow or another module of tfstrategy but :mod:`tfstrategy.settings`, whose
:class:`~tfstrategy.settings.Variable` declares each ``TFSTRATEGY_K8S_*`` variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from tfstrategy.settings import Side, Variable, integer

__all__ = ["POD_VARIABLES", "COMPLETION_INDEX", "ENV_K8S_JOB", "ENV_K8S_SERVICE", "ENV_K8S_WORKERS", "ENV_K8S_PORT",
           "ENV_K8S_FAILURES", "ENV_K8S_IGNORED_FAILURES", "JOB_NAME_LABEL", "COMPLETION_INDEX_ANNOTATION", "FAILURE_COUNT_ANNOTATION",
           "IGNORED_FAILURE_COUNT_ANNOTATION"]

#: Set by Kubernetes in every pod of an Indexed Job.
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
# What the generated Job gives each pod, read by KubernetesEnvironment.
K8S_JOB = Variable(name="TFSTRATEGY_K8S_JOB", side=Side.CLUSTER, help="the Indexed Job's name (tfstrategy k8s)",
                   expected="the Job's name")
K8S_SERVICE = Variable(name="TFSTRATEGY_K8S_SERVICE", side=Side.CLUSTER,
                       help="the headless Service that gives each pod its stable hostname", expected="a Service's name")
K8S_WORKERS = Variable(name="TFSTRATEGY_K8S_WORKERS", side=Side.CLUSTER, parse=integer(1),
                       help="the Job's number of workers (its completions)", expected="a count of workers, 1 or more")
K8S_PORT = Variable(name="TFSTRATEGY_K8S_PORT", side=Side.CLUSTER, parse=integer(1),
                    help="the port every worker's TensorFlow server listens on", expected="a port number")
K8S_FAILURES = Variable(name="TFSTRATEGY_K8S_FAILURES", side=Side.CLUSTER, parse=integer(0),
                        help="how often this pod's index failed (the Job controller's annotation)",
                        expected="a count, 0 or more")
K8S_IGNORED_FAILURES = Variable(name="TFSTRATEGY_K8S_IGNORED_FAILURES", side=Side.CLUSTER, parse=integer(0),
                                help="how often this pod's index failed in a way the Job ignored (preempted)",
                                expected="a count, 0 or more")
#: The pod contract's variables, declared above.
K8S_VARIABLES = (K8S_JOB, K8S_SERVICE, K8S_WORKERS, K8S_PORT, K8S_FAILURES, K8S_IGNORED_FAILURES)
ENV_K8S_JOB, ENV_K8S_SERVICE, ENV_K8S_WORKERS = K8S_JOB.name, K8S_SERVICE.name, K8S_WORKERS.name
ENV_K8S_PORT, ENV_K8S_FAILURES, ENV_K8S_IGNORED_FAILURES = K8S_PORT.name, K8S_FAILURES.name, K8S_IGNORED_FAILURES.name

#: The Job controller's label and annotations the Downward API passes in.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-failure-count"
IGNORED_FAILURE_COUNT_ANNOTATION = "batch.kubernetes.io/job-index-ignored-failure-count"

#: Each variable of the pod contract and the manifest field that sets it (for the environment's errors).
POD_VARIABLES: Mapping[str, str] = {
    COMPLETION_INDEX: "set by Kubernetes in a Job with spec.completionMode: Indexed",
    ENV_K8S_JOB: f"the container's env, fieldRef metadata.labels['{JOB_NAME_LABEL}']",
    ENV_K8S_SERVICE: "the container's env, equal to spec.template.spec.subdomain (the headless Service's name)",
    ENV_K8S_WORKERS: "the container's env, equal to the Job's spec.completions and spec.parallelism",
    ENV_K8S_PORT: "the container's env, equal to the container's ports[0].containerPort",
    ENV_K8S_FAILURES: f"the container's env, fieldRef metadata.annotations['{FAILURE_COUNT_ANNOTATION}']",
    ENV_K8S_IGNORED_FAILURES: f"the container's env, fieldRef metadata.annotations['{IGNORED_FAILURE_COUNT_ANNOTATION}']",
}
