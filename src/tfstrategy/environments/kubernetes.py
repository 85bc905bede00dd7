"""A pod of an Indexed Job written by ``tfstrategy k8s``: its cluster, read from the pod's variables.

Kubernetes sets ``JOB_COMPLETION_INDEX``; the generated Job sets the rest
(:data:`tfstrategy.contract.pod.POD_VARIABLES` names the field that sets each):

* **cluster**: worker ``i`` is ``<job>-<i>.<service>:<port>`` for i in 0..N-1, the stable
  hostname an Indexed Job gives pod ``i`` when its ``subdomain`` names a headless Service;
* **task**: ``JOB_COMPLETION_INDEX``;
* **restart count**: the pod's retries of its index, from the Job controller's annotations
  ``batch.kubernetes.io/job-index-failure-count`` (failures counted against
  ``backoffLimitPerIndex``) plus ``...-ignored-failure-count`` (restarts the
  ``podFailurePolicy`` ignored: tfstrategy's or TensorFlow's preemption exit status), passed in by the Downward API;
  absent annotations mean 0, as Kubernetes documents;
* **preemption**: the kubelet sends SIGTERM (the base class's default), then SIGKILL after
  ``terminationGracePeriodSeconds`` (``tfstrategy k8s --grace``);
* **job id**: the Job's name (label ``batch.kubernetes.io/job-name``), so a Job applied again
  under its name resumes from its backups.

An Indexed Job that ``tfstrategy k8s`` did not write has no ``TFSTRATEGY_K8S_*`` variable and
is not detected: its pods are independent workers unless ``TF_CONFIG`` says otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from tfstrategy.contract.pod import (
    COMPLETION_INDEX,
    ENV_K8S_FAILURES,
    ENV_K8S_IGNORED_FAILURES,
    ENV_K8S_JOB,
    ENV_K8S_PORT,
    ENV_K8S_SERVICE,
    ENV_K8S_WORKERS,
    POD_VARIABLES,
)
from tfstrategy.environments.base import ClusterEnvironment, read_count, variables_line
from tfstrategy.errors import ClusterConfigError
from tfstrategy.multiworker.cluster import ClusterConfig, validate_tf_config

__all__ = ["KubernetesEnvironment", "KubernetesPod", "read_pod"]

_OURS = (ENV_K8S_JOB, ENV_K8S_SERVICE, ENV_K8S_WORKERS, ENV_K8S_PORT)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_DIGITS = 7  # no job has ten million pods, and int() of thousands of digits is slow


@dataclass(frozen=True, kw_only=True)
class KubernetesPod:
    """One pod's place in its Indexed Job."""

    job: str
    service: str
    num_workers: int
    port: int
    index: int
    failures: int = 0
    ignored_failures: int = 0

    def addresses(self) -> list[str]:
        """Every worker's ``<job>-<i>.<service>:<port>``, in index order."""
        return [f"{self.job}-{i}.{self.service}:{self.port}" for i in range(self.num_workers)]


def _problem(name: str, value: str | None, expected: str) -> ClusterConfigError:
    received = f"no {name}" if value is None else f"{name}={value[:60]!r}"
    return ClusterConfigError(f"Received {received} in this Kubernetes pod; expected {expected}. {name} is set by "
                              f"{POD_VARIABLES[name]}: regenerate the manifests with tfstrategy k8s.")


def _integer(environ: Mapping[str, str], name: str, low: int, high: int | None, expected: str) -> int:
    raw = environ.get(name)
    text = (raw or "").strip()
    if raw is None:
        raise _problem(name, None, expected)
    if not (text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS):
        raise _problem(name, raw, expected)
    value = int(text)
    if value < low or (high is not None and value > high):
        raise _problem(name, raw, expected)
    return value


def _label(environ: Mapping[str, str], name: str, expected: str) -> str:
    raw = environ.get(name)
    if raw is None or not _DNS_LABEL.match(raw) or len(raw) > 63:
        raise _problem(name, raw, expected)
    return raw


def read_pod(environ: Mapping[str, str]) -> KubernetesPod:
    """This pod's place in its job, from its variables.

    Raises:
        ClusterConfigError: a missing or malformed variable, in one line naming it and the manifest field
            that sets it.
    """
    job = _label(environ, ENV_K8S_JOB, "the Job's name, e.g. train")
    service = _label(environ, ENV_K8S_SERVICE, "the headless Service's name, e.g. train")
    workers = _integer(environ, ENV_K8S_WORKERS, 1, None, "the number of pods, e.g. 4")
    port = _integer(environ, ENV_K8S_PORT, 1, 65535, "TensorFlow's gRPC port in 1-65535, e.g. 2222")
    index = _integer(environ, COMPLETION_INDEX, 0, workers - 1,
                     f"this pod's index 0..{workers - 1} ({ENV_K8S_WORKERS}={workers})")
    if len(f"{job}-{workers - 1}") > 63:
        raise _problem(ENV_K8S_JOB, job, f"a name short enough that the hostname {job}-{workers - 1} has at most "
                       "63 characters")
    failures = read_count(environ, ENV_K8S_FAILURES, POD_VARIABLES[ENV_K8S_FAILURES])
    ignored = read_count(environ, ENV_K8S_IGNORED_FAILURES, POD_VARIABLES[ENV_K8S_IGNORED_FAILURES])
    return KubernetesPod(job=job, service=service, num_workers=workers, port=port, index=index, failures=failures,
                         ignored_failures=ignored)


class KubernetesEnvironment(ClusterEnvironment):
    """A pod of an Indexed Job from ``tfstrategy k8s``: ``TF_CONFIG`` from the stable pod hostnames."""

    name: ClassVar[str] = "Kubernetes"
    sets_tf_config: ClassVar[bool] = True
    job_id_variable: ClassVar[str | None] = ENV_K8S_JOB
    tasks_phrase: ClassVar[str] = "the Kubernetes Indexed Job has"

    @classmethod
    def detect(cls, environ: Mapping[str, str]) -> bool:
        """Whether any variable of the generated Job is set (the rest are then checked by the constructor)."""
        try:
            return any(name in environ for name in _OURS)
        except Exception:  # an odd mapping: not a Kubernetes pod of ours
            return False

    def __init__(self, environ: Mapping[str, str]) -> None:
        super().__init__(environ)
        self._pod = read_pod(self.environ)

    @property
    def pod(self) -> KubernetesPod:
        """This pod's place in its job."""
        return self._pod

    def cluster_config(self) -> ClusterConfig:
        """This pod's ``TF_CONFIG``: every pod's stable hostname, this pod's index as the task."""
        return validate_tf_config({"cluster": {"worker": self._pod.addresses()},
                                   "task": {"type": "worker", "index": self._pod.index}})

    @property
    def num_workers(self) -> int:
        """Pods in the Indexed Job (``spec.completions``)."""
        return self._pod.num_workers

    @property
    def task_index(self) -> int:
        """``JOB_COMPLETION_INDEX``."""
        return self._pod.index

    def job_id(self) -> str | None:
        """The Job's name: stable across the pods' restarts and a re-apply of the same Job."""
        return self._pod.job

    def restart_count(self) -> int:
        """This pod's retries of its index: counted failures plus the ones the podFailurePolicy ignored."""
        return self._pod.failures + self._pod.ignored_failures

    def describe(self) -> str:
        """``Kubernetes Indexed Job train, 4 pods``."""
        return f"Kubernetes Indexed Job {self._pod.job}, {self._pod.num_workers} pods"

    @classmethod
    def report_lines(cls, environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """The pod's variables and, when they are ours, what they make of it; never raises."""
        values = _variables(environ)
        if not cls.detect(environ):
            return ()
        return (("Kubernetes", variables_line(values, None, "")), ("Kubernetes pod", _describe_pod(environ)))

    @classmethod
    def report_values(cls, environ: Mapping[str, str]) -> dict[str, object]:
        """The pod's variables and what they make of it, for ``--json``; never raises."""
        if not cls.detect(environ):
            return {}
        return {"kubernetes": _variables(environ), "kubernetes_pod": _describe_pod(environ)}


def _variables(environ: Mapping[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in POD_VARIABLES if name in environ}


def _describe_pod(environ: Mapping[str, str]) -> str:
    try:
        pod = read_pod(environ)
    except ClusterConfigError:
        return "invalid (see the Problem line)"  # the report shows select()'s error once, there
    return (f"Kubernetes Indexed Job {pod.job}, {pod.num_workers} pods: this pod is worker {pod.index} at "
            f"{pod.addresses()[pod.index]}, retry {pod.failures + pod.ignored_failures}")
