"""Cluster environments: who started this process, who its peers are, and what its scheduler says.

One :class:`~tfstrategy.environments.base.ClusterEnvironment` subclass per
environment, one module each, and one ordered detect list,
:data:`ENVIRONMENTS`: the first class whose ``detect()`` is true describes the
process (:func:`detect_environment`). The order is the precedence:

1. ``tfstrategy launch`` (it writes ``TF_CONFIG`` and its own variables, even
   inside a Slurm allocation or a Ray task);
2. Ray Train (Ray writes ``TF_CONFIG`` in its workers);
3. ``TF_CONFIG`` written by anyone else: an explicit cluster always wins over a
   derived one;
4. a pod of an Indexed Job from ``tfstrategy k8s`` (tfstrategy derives ``TF_CONFIG``
   from ``JOB_COMPLETION_INDEX`` and the variables the generated Job sets);
5. Slurm (tfstrategy derives ``TF_CONFIG`` from the job step).

The job id and the restart count are read here and nowhere else
(:func:`job_id`, :func:`restart_count`): ``TFSTRATEGY_JOB_ID`` if the user set
it, else what the environments present say (a launch inside a Slurm job keeps
the Slurm job's id, and counts both the requeues and the launcher's restarts).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping

from tfstrategy.environments.base import ClusterEnvironment
from tfstrategy.environments.kubernetes import KubernetesEnvironment
from tfstrategy.environments.launcher import Launcher
from tfstrategy.environments.ray import Ray
from tfstrategy.environments.slurm import Slurm
from tfstrategy.environments.tf_config import TFConfig
from tfstrategy.errors import TFStrategyError
from tfstrategy.settings import ENV_JOB_ID, JOB_ID

__all__ = [
    "ENVIRONMENTS",
    "ClusterEnvironment",
    "detect_environment",
    "environment_type",
    "job_id",
    "job_identity",
    "preemption_signal",
    "restart_count",
]

#: The detect list, in precedence order: one entry per environment.
ENVIRONMENTS: list[type[ClusterEnvironment]] = [Launcher, Ray, TFConfig, KubernetesEnvironment, Slurm]


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def environment_type(environ: Mapping[str, str] | None = None) -> type[ClusterEnvironment] | None:
    """The first environment of :data:`ENVIRONMENTS` that detects itself, without validating it."""
    environ = _environ(environ)
    return next((kind for kind in ENVIRONMENTS if kind.detect(environ)), None)


def detect_environment(environ: Mapping[str, str] | None = None) -> ClusterEnvironment | None:
    """The environment this process runs in (the first of :data:`ENVIRONMENTS` that detects itself), or ``None``.

    Raises:
        TFStrategyError: its variables are invalid (the message names the variable and what sets it).
    """
    environ = _environ(environ)
    kind = environment_type(environ)
    return None if kind is None else kind(environ)


def _present(environ: Mapping[str, str]) -> Iterator[ClusterEnvironment]:
    """Every environment that detects itself, in order; one whose variables do not validate says nothing."""
    for kind in ENVIRONMENTS:
        if kind.detect(environ):
            try:
                yield kind(environ)
            except TFStrategyError:
                continue


def job_identity(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The job's id and the variable it came from, or ``None`` when nothing names the job.

    ``TFSTRATEGY_JOB_ID`` (set by the user, passed on by ``tfstrategy launch``) wins;
    else the first environment present with a job id (``slurm-7`` from ``SLURM_JOB_ID``).
    """
    environ = _environ(environ)
    explicit = JOB_ID.text(environ)
    if explicit:
        return explicit, ENV_JOB_ID
    for environment in _present(environ):
        found = environment.job_id()
        if found:
            return found, environment.job_id_variable or environment.name
    return None


def job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The job's id: the same on every worker and after every restart (see :func:`job_identity`)."""
    identity = job_identity(environ)
    return None if identity is None else identity[0]


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times this job was restarted before this start, over every environment present.

    A ``tfstrategy launch --max-restarts`` inside a requeued Slurm job counts both.
    """
    return sum(environment.restart_count() for environment in _present(_environ(environ)))


def preemption_signal(environ: Mapping[str, str] | None = None) -> int:
    """The signal this process's scheduler sends before stopping it: the environment's, else SIGTERM."""
    try:
        environment = detect_environment(environ)
    except TFStrategyError:
        environment = None
    return environment.preemption_signal() if environment is not None else int(signal.SIGTERM)
