"""``select()``: settings, choice, strategy, and every process-wide step, in one visible place.

:func:`select` reads the settings (argument > ``TFSTRATEGY_*`` > default,
:func:`resolve_request`), chooses purely (:func:`~tfstrategy.choose`), builds
the strategy (:func:`~tfstrategy.build`), and around those takes the named
steps of its plan (:func:`tfstrategy.runtime.plan.plan_steps`, the plan ``tfstrategy
env`` prints), each recorded on the :class:`Selection`:

1. ``split_cpu``: split the CPU into logical devices (``cpu_replicas``);
2. ``record_creation_sites``: remember where variables are created, so the
   scope audit can name a stray one's file:line;
3. ``slurm_tf_config``: inside a Slurm job step of 2+ tasks without
   ``TF_CONFIG``, set ``TF_CONFIG`` from the step
   (:mod:`tfstrategy.multiworker.slurm`). The environment variable, not a
   cluster resolver passed to the strategy, because Keras, ``save_model``,
   ``backup_callbacks`` and user code read the task and the chief from it;
4. ``signal_launcher``: under ``tfstrategy launch``, say "creating the strategy"
   and then "joined" (:mod:`tfstrategy.multiworker.worker_protocol`);
5. ``apply_patches``: install the Keras workarounds the installed release needs
   (:mod:`tfstrategy.patches`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfstrategy import _versions
from tfstrategy.multiworker.cluster import load_cluster_config
from tfstrategy.multiworker.slurm import SlurmStepCluster, cluster_from_slurm_step
from tfstrategy.multiworker.worker_protocol import signal_joined, signal_starting
from tfstrategy.patches import apply_patches
from tfstrategy.patches.mechanism import PatchStatus
from tfstrategy.runtime.plan import PlanInputs, Step, plan_steps
from tfstrategy.scope.creation_sites import start_recording
from tfstrategy.selection.choose import Choice, choose
from tfstrategy.selection.cpu_split import configure_cpu_replicas, validate_cpu_replicas
from tfstrategy.selection.devices import DeviceRequest, DeviceSpec, parse_devices
from tfstrategy.selection.host import HostInfo
from tfstrategy.selection.strategies import build
from tfstrategy.settings import (
    ENV_CPU_REPLICAS,
    ENV_DEVICES,
    ENV_JOIN_FILE,
    ENV_STRATEGY,
    StrategyKind,
    resolve_collective_timeout,
    resolve_setting,
    setting_name,
)
from tfstrategy.training.precision import resolve_precision, set_precision

__all__ = ["Selection", "resolve_request", "select"]


@dataclass(frozen=True, kw_only=True)
class Selection:
    """A ready strategy, why it was chosen, and what :func:`select` changed in the process to get it."""

    strategy: Any
    choice: Choice
    sources: Mapping[str, str] = field(default_factory=dict)
    #: The process-wide steps select() took, in order: ``(name, what it did)``.
    steps: tuple[tuple[str, str], ...] = ()
    #: What each Keras workaround found and installed (see :mod:`tfstrategy.patches`).
    patches: tuple[PatchStatus, ...] = ()

    @property
    def kind(self) -> StrategyKind:
        return self.choice.kind

    @property
    def num_replicas(self) -> int:
        """Replicas in sync across the whole job (all workers)."""
        return int(self.strategy.num_replicas_in_sync)

    def scope(self) -> Any:
        """The strategy's scope: build model, optimizer and metrics inside it."""
        return self.strategy.scope()

    def explain(self) -> str:
        """Why this strategy: the rules that applied, the settings' sources, and the steps taken."""
        parts = list(self.choice.reasons)
        settings = ", ".join(f"{name} from {source}" for name, source in self.sources.items())
        if settings:
            parts.append(settings)
        parts.extend(f"{name}: {done}" for name, done in self.steps)
        return "; ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Request:
    """What :func:`select` was asked for, after precedence and validation, before any TensorFlow call."""

    kind: StrategyKind
    devices: DeviceRequest | None
    cpu_replicas: int | None
    cluster_tasks: int
    collective_timeout: float | None
    sources: Mapping[str, str]
    #: Where the cluster comes from: ``"TF_CONFIG"``, ``"Slurm"``, or None for one process.
    cluster_source: str | None = None
    #: The cluster built from the Slurm job step, when ``cluster_source == "Slurm"``.
    slurm: SlurmStepCluster | None = None
    #: The Keras global dtype policy to set, or ``None`` to leave Keras' alone.
    precision: str | None = None


def resolve_request(
    strategy: StrategyKind | str | None = None,
    devices: DeviceSpec | None = None,
    cpu_replicas: int | None = None,
    *,
    collective_timeout: float | str | None = None,
    precision: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Request:
    """Apply argument > ``TFSTRATEGY_*`` > default and validate each setting and ``TF_CONFIG``.

    Pure apart from reading the environment; :func:`select` and ``tfstrategy env``
    share it so the report predicts exactly what ``select`` would do.

    Raises:
        TFStrategyError: a setting is invalid or code and environment conflict.
    """
    kind_setting = resolve_setting(
        "strategy", strategy, ENV_STRATEGY, StrategyKind.AUTO, env,
        normalise=lambda v, n: StrategyKind.parse(v, name=n).value,
    )
    devices_setting = resolve_setting("devices", devices, ENV_DEVICES, None, env, normalise=_devices_key)
    replicas_setting = resolve_setting(
        "cpu_replicas", cpu_replicas, ENV_CPU_REPLICAS, None, env,
        normalise=lambda v, n: str(validate_cpu_replicas(v, name=n)),
    )
    # Errors name where a bad value came from: TFSTRATEGY_CPU_REPLICAS='abc', not cpu_replicas='abc'.
    kind = StrategyKind.parse(kind_setting.value, name=setting_name("strategy", kind_setting, ENV_STRATEGY))
    request = parse_devices(devices_setting.value, name=setting_name("devices", devices_setting, ENV_DEVICES))
    replicas = validate_cpu_replicas(
        replicas_setting.value, name=setting_name("cpu_replicas", replicas_setting, ENV_CPU_REPLICAS)
    )
    timeout, timeout_source = resolve_collective_timeout(collective_timeout, env)
    cluster = load_cluster_config(env)
    # Only a multi-worker request reads the Slurm step: a refused layout must not break strategy='mirrored'.
    multi = kind in (StrategyKind.AUTO, StrategyKind.MULTI_WORKER)
    slurm = cluster_from_slurm_step(env) if multi and cluster is None else None
    if slurm is not None:
        cluster = slurm.config
    sources = {"strategy": kind_setting.source}
    if devices_setting.value is not None:
        sources["devices"] = devices_setting.source
    if replicas is not None:
        sources["cpu_replicas"] = replicas_setting.source
    if kind in (StrategyKind.AUTO, StrategyKind.MULTI_WORKER) and timeout_source != "default":
        sources["collective_timeout"] = timeout_source
    chosen_precision, precision_source = resolve_precision(precision, env)
    if chosen_precision is not None:
        sources["precision"] = precision_source
    return Request(
        precision=chosen_precision,
        kind=kind,
        devices=request,
        cpu_replicas=replicas,
        cluster_tasks=cluster.num_workers if cluster else 0,
        collective_timeout=timeout,
        sources=sources,
        cluster_source=("Slurm" if slurm else "TF_CONFIG") if cluster else None,
        slurm=slurm,
    )


def select_plan(request: Request, env: Mapping[str, str] | None = None) -> tuple[Step, ...]:
    """The process-wide steps :func:`select` takes for ``request`` (``tfstrategy env`` prints the same plan)."""
    env = os.environ if env is None else env
    return plan_steps(PlanInputs(
        consumer="select", kind=request.kind, cpu_replicas=request.cpu_replicas,
        devices=request.devices.text if request.devices is not None else None,
        cluster_tasks=request.cluster_tasks, cluster_source=request.cluster_source,
        under_launcher=bool(env.get(ENV_JOIN_FILE)), precision=request.precision,
    ))


def _devices_key(value: Any, name: str) -> str:
    return str(parse_devices(value, name=name))


def select(
    strategy: StrategyKind | str | None = None,
    devices: DeviceSpec | None = None,
    cpu_replicas: int | None = None,
    *,
    collective_timeout: float | str | None = None,
    precision: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Selection:
    """Select, validate and build a distribution strategy in one call.

    Each argument left as ``None`` falls back to its ``TFSTRATEGY_*`` variable
    (``TFSTRATEGY_STRATEGY``, ``TFSTRATEGY_DEVICES``, ``TFSTRATEGY_CPU_REPLICAS``,
    ``TFSTRATEGY_COLLECTIVE_TIMEOUT``), then to the default: ``auto`` on every
    visible GPU or the CPU, and a 300 s collective timeout. Inside a Slurm job
    step of 2+ tasks without ``TF_CONFIG`` (``srun python train.py``), ``auto``
    is MultiWorkerMirroredStrategy over the step's tasks.

    Args:
        strategy: ``auto``, ``mirrored``, ``one_device``, ``default``,
            ``multi_worker`` or ``tpu``.
        devices: e.g. ``"gpu:0,gpu:1"``, ``[0, 1]``, ``"cpu"``; ``None`` for all.
        cpu_replicas: split the CPU into this many logical devices and use
            them as replicas. Must come before anything runs a TensorFlow op
            (importing TensorFlow first is fine).
        collective_timeout: seconds a multi-worker collective may wait for a
            peer before raising; ``"none"`` waits forever.
        precision: the Keras global dtype policy to set before the model is
            built: ``float32``, ``mixed_float16`` or ``mixed_bfloat16``
            (``TFSTRATEGY_PRECISION``; default: leave Keras' policy alone).
        env: environment to read instead of ``os.environ``.

    Raises:
        TFStrategyError: any invalid input, with a message saying how to fix it.
        UnsupportedVersionError: TensorFlow or Keras is older than supported.

    Example:
        >>> selection = tfstrategy.select(cpu_replicas=4)
        >>> with selection.scope():
        ...     model = build_model()
    """
    _versions.require_supported(env)
    request = resolve_request(strategy, devices, cpu_replicas, collective_timeout=collective_timeout,
                              precision=precision, env=env)
    planned = {step.name for step in select_plan(request)}
    steps: list[tuple[str, str]] = []
    if "split_cpu" in planned:
        count = configure_cpu_replicas(request.cpu_replicas)
        steps.append(("split_cpu", f"{count} logical CPU devices"))
    choice = choose(
        kind=request.kind,
        devices=request.devices,
        cpu_replicas=request.cpu_replicas,
        host=HostInfo.detect(),
        cluster_tasks=request.cluster_tasks,
        cluster_source=request.cluster_source or "TF_CONFIG",
    )
    if "slurm_tf_config" in planned and request.slurm is not None:
        os.environ["TF_CONFIG"] = request.slurm.config.to_json()
        steps.append(("slurm_tf_config", f"set TF_CONFIG from {request.slurm.describe()}"))
    if start_recording():
        steps.append(("record_creation_sites", "on in this thread, for the scope audit"))
    starting = signal_starting()
    strategy = build(choice, collective_timeout=request.collective_timeout)
    if signal_joined() or starting:
        steps.append(("signal_launcher", "told tfstrategy launch this worker joined"))
    patches = apply_patches()
    installed = [status.name for status in patches if status.installed]
    if installed:
        steps.append(("apply_patches", ", ".join(installed)))
    if "set_precision" in planned:
        steps.append(("set_precision", set_precision(request.precision)))
    return Selection(strategy=strategy, choice=choice, sources=request.sources, steps=tuple(steps), patches=patches)
