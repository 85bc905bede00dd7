"""What the plan of a process depends on, derived once from arguments and the environment, with one error policy.

:func:`derive_inputs` applies argument > ``TFSTRATEGY_*`` > default to every
setting, validates each, and asks the cluster-environment detect list which
cluster this process is part of. ``select()``, the start-up hook and
``tfstrategy env`` all call it, so they plan from the same :class:`PlanInputs`;
anything invalid raises a :class:`~tfstrategy.errors.TFStrategyError` naming
where the bad value came from, for every consumer alike.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tfstrategy.environments import ClusterEnvironment, detect_environment
from tfstrategy.multiworker.cluster import ClusterConfig
from tfstrategy.selection.cpu_split import validate_cpu_replicas
from tfstrategy.selection.devices import DeviceRequest, DeviceSpec, parse_devices
from tfstrategy.settings import (
    AUDIT,
    CPU_REPLICAS,
    DEVICE_CHECK,
    DEVICES,
    JOIN_FILE,
    PROFILE,
    STRATEGY,
    StrategyKind,
    resolve_collective_timeout,
    resolve_setting,
    setting_name,
    validate_audit_mode,
)

__all__ = ["PlanInputs", "derive_inputs", "resolved_kind", "validate_audit_mode", "SELECT", "HOOK"]

SELECT, HOOK = "select", "hook"
_MULTI_KINDS = (StrategyKind.AUTO, StrategyKind.MULTI_WORKER)


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """Everything the plan depends on, as plain values."""

    #: ``"select"`` or ``"hook"``.
    consumer: str
    #: The requested kind (``select()``); ``None`` for the hook (the script creates its own strategy).
    kind: StrategyKind | None = None
    devices: DeviceRequest | None = None
    cpu_replicas: int | None = None
    #: Training tasks of the cluster, 0 for none.
    cluster_tasks: int = 0
    #: The name of the cluster environment detected (``"TF_CONFIG"``, ``"Slurm"``, ...; see
    #: :data:`tfstrategy.environments.ENVIRONMENTS`), or ``None``.
    cluster_source: str | None = None
    #: That environment (``tfstrategy.environments``), and the cluster it describes.
    environment: ClusterEnvironment | None = field(default=None, compare=False, repr=False)
    cluster: ClusterConfig | None = field(default=None, compare=False, repr=False)
    collective_timeout: float | None = None
    #: Where each setting came from: ``argument``, ``env TFSTRATEGY_...`` or ``default``.
    sources: Mapping[str, str] = field(default_factory=dict)
    #: ``tfstrategy launch`` started this process (it has a join file to write).
    under_launcher: bool = False
    #: The hook's ``--audit`` mode.
    audit: str = "warn"
    #: The Keras global dtype policy to set, or ``None``.
    precision: str | None = None
    #: The performance report's directory (``--profile``/``TFSTRATEGY_PROFILE``), or ``None``.
    profile: str | None = None
    #: The settings that came from the environment, as the command line names them (``--devices gpu:0``,
    #: ``--cpu-replicas 4``): what the hook's notes about a script's own device list quote.
    flags: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: ``TFSTRATEGY_DEVICE_CHECK`` as given (checked where the hook acts on a device list: ``stop`` or ``warn``).
    device_check: str | None = field(default=None, compare=False)

    @property
    def multi_worker(self) -> bool:
        return self.cluster_tasks > 1

    @property
    def sets_tf_config(self) -> bool:
        """The environment derives the cluster, so a step writes ``TF_CONFIG`` from it."""
        return self.environment is not None and self.environment.sets_tf_config and self.cluster is not None


def resolved_kind(kind: StrategyKind, cluster_tasks: int) -> StrategyKind:
    """What ``auto`` becomes: multi-worker when a cluster of 2+ tasks exists, else MirroredStrategy."""
    if kind is StrategyKind.AUTO:
        return StrategyKind.MULTI_WORKER if cluster_tasks > 1 else StrategyKind.MIRRORED
    return kind


def derive_inputs(
    consumer: str,
    strategy: StrategyKind | str | None = None,
    devices: DeviceSpec | None = None,
    cpu_replicas: int | None = None,
    *,
    collective_timeout: float | str | None = None,
    precision: str | None = None,
    env: Mapping[str, str] | None = None,
) -> PlanInputs:
    """Resolve and validate every setting and the cluster for ``consumer`` (``"select"`` or ``"hook"``).

    Pure apart from reading the environment.

    Raises:
        TFStrategyError: a setting or the cluster description is invalid, or code and environment conflict.
    """
    from tfstrategy.training.precision import resolve_precision

    if consumer not in (SELECT, HOOK):
        raise ValueError(f"unknown consumer {consumer!r}")
    env = os.environ if env is None else env
    # Errors name where a bad value came from: TFSTRATEGY_DEVICES='gpu0', not devices='gpu0'.
    kind_setting = STRATEGY.resolve("strategy", strategy, env, StrategyKind.parse)
    devices_setting = DEVICES.resolve("devices", devices, env, parse_devices)
    kind: StrategyKind = kind_setting.value
    request: DeviceRequest | None = devices_setting.value
    # TFSTRATEGY_CPU_REPLICAS' own parser is the launch contract's (any count of 1 or more); select() and the hook
    # also refuse more than MAX_CPU_REPLICAS, with validate_cpu_replicas' advice.
    replicas_setting = resolve_setting("cpu_replicas", cpu_replicas, CPU_REPLICAS.name, None, env,
                                       normalise=lambda v, n: str(validate_cpu_replicas(v, name=n)))
    replicas = validate_cpu_replicas(replicas_setting.value,
                                     name=setting_name("cpu_replicas", replicas_setting, CPU_REPLICAS.name))
    timeout, timeout_source = resolve_collective_timeout(collective_timeout, env)
    # The flag's validator, whose message says what each mode does (the contract's parser only lists them).
    audit = validate_audit_mode(AUDIT.text(env) or AUDIT.default, name=AUDIT.name)
    chosen_precision, precision_source = resolve_precision(precision, env)
    # An environment that derives the cluster (a Slurm step, ...) is read only when a multi-worker job can
    # use it: a layout it refuses must not break select(strategy='mirrored'). The hook always may.
    may_derive = consumer == HOOK or kind in _MULTI_KINDS
    environment, cluster = _cluster(env, may_derive)
    sources = {"strategy": kind_setting.source}
    if devices_setting.value is not None:
        sources["devices"] = devices_setting.source
    if replicas is not None:
        sources["cpu_replicas"] = replicas_setting.source
    if kind in _MULTI_KINDS and timeout_source != "default":
        sources["collective_timeout"] = timeout_source
    if chosen_precision is not None:
        sources["precision"] = precision_source
    if environment is not None:
        sources["cluster" if cluster is not None else "environment"] = environment.name
    profile = PROFILE.text(env)
    flags = {flag: text for flag, variable in (("--devices", DEVICES), ("--cpu-replicas", CPU_REPLICAS))
             if (text := variable.text(env))}
    return PlanInputs(
        consumer=consumer, kind=kind if consumer == SELECT else None, devices=request, cpu_replicas=replicas,
        cluster_tasks=cluster.num_workers if cluster is not None else 0,
        cluster_source=environment.name if environment is not None else None, environment=environment,
        cluster=cluster,
        collective_timeout=timeout, sources=sources, under_launcher=JOIN_FILE.text(env) is not None, audit=audit,
        precision=chosen_precision, profile=profile if profile and profile.lower() != "off" else None,
        flags=flags, device_check=DEVICE_CHECK.text(env),
    )


def _cluster(env: Mapping[str, str], may_derive: bool) -> tuple[ClusterEnvironment | None, ClusterConfig | None]:
    """The detected cluster environment and its cluster (``None, None`` for one process)."""
    environment = detect_environment(env)
    if environment is None or (environment.sets_tf_config and not may_derive):
        return None, None
    if environment.sets_tf_config and environment.num_workers < 2:
        return environment, None  # e.g. a Slurm batch script without srun: one worker, no cluster to derive
    return environment, environment.cluster_config()
