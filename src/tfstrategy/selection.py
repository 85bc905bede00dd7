"""Choose a distribution strategy (pure), then build it (TensorFlow).

:func:`choose` decides from plain values which strategy and devices to use and
records why; it never touches TensorFlow, so every rule is testable with a
made-up :class:`~tfstrategy.host.HostInfo`. :func:`build` instantiates the
choice. :func:`select` does both, reading ``TFSTRATEGY_*`` variables and
splitting the CPU first when asked.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfstrategy._tf import tf
from tfstrategy.cluster import load_cluster_config
from tfstrategy.devices import Device, DeviceRequest, DeviceSpec, parse_devices, resolve_devices
from tfstrategy.errors import StrategyError
from tfstrategy.host import HostInfo
from tfstrategy.runtime import configure_cpu_replicas, validate_cpu_replicas
from tfstrategy.settings import (
    ENV_CPU_REPLICAS,
    ENV_DEVICES,
    ENV_STRATEGY,
    StrategyKind,
    resolve_setting,
)
from tfstrategy.sites import start_recording
from tfstrategy.worker import collective_timeout_from_env, signal_joined, signal_starting

#: Seconds a collective op may wait for a peer before MultiWorkerMirroredStrategy
#: raises instead of hanging on a dead or stalled worker.
DEFAULT_COLLECTIVE_TIMEOUT = 300.0


@dataclass(frozen=True, kw_only=True)
class Choice:
    """Which strategy to build, on which devices, and why."""

    kind: StrategyKind
    devices: tuple[Device, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def replicas(self) -> int:
        """Replicas in this process (multi-worker jobs multiply it by the workers)."""
        return max(1, len(self.devices))


def _refuse_devices(kind: StrategyKind, request: DeviceRequest | None) -> None:
    if request is not None:
        raise StrategyError(
            f"Received devices={request.text!r} with strategy={kind.value!r}, which does not take devices. "
            "Omit devices, or pass strategy='mirrored' (or 'one_device') to choose devices."
        )


def _refuse_cpu_replicas(kind: StrategyKind, cpu_replicas: int | None, fix: str) -> None:
    if cpu_replicas is not None and cpu_replicas > 1:
        raise StrategyError(f"Received cpu_replicas={cpu_replicas} with strategy={kind.value!r}; {fix}")


def choose(
    *,
    kind: StrategyKind,
    devices: DeviceRequest | None,
    cpu_replicas: int | None,
    host: HostInfo,
    cluster_tasks: int = 0,
) -> Choice:
    """Decide the strategy and devices from plain values; no TensorFlow involved.

    Args:
        kind: the requested kind; ``AUTO`` is resolved here.
        devices: the parsed ``devices=`` request, or ``None``.
        cpu_replicas: logical CPUs requested as replicas, or ``None``.
        host: the devices this host offers (after any CPU split).
        cluster_tasks: chief and worker tasks in ``TF_CONFIG`` (0 when unset).

    Raises:
        StrategyError: the combination cannot work (e.g. devices with
            ``default``, or ``tpu`` on a host without a TPU).
        DeviceError: the devices do not exist on this host.

    Example:
        >>> choose(kind=StrategyKind.AUTO, devices=None, cpu_replicas=None, host=HostInfo(gpus=2)).devices
        (Device(kind='GPU', index=0), Device(kind='GPU', index=1))
    """
    reasons: list[str] = []
    if kind is StrategyKind.AUTO:
        if cluster_tasks > 1:
            kind = StrategyKind.MULTI_WORKER
            reasons.append(f"auto: TF_CONFIG describes {cluster_tasks} tasks, so MultiWorkerMirroredStrategy")
        else:
            kind = StrategyKind.MIRRORED
            reasons.append("auto: one machine, so MirroredStrategy")

    if kind is StrategyKind.MULTI_WORKER:
        _refuse_devices(kind, devices)
        _refuse_cpu_replicas(
            kind, cpu_replicas, "each worker uses its own GPUs or one CPU. Use `tfstrategy launch -n N` to rehearse N workers."
        )
        local = tuple(Device("GPU", i) for i in range(host.gpus)) or (Device("CPU", 0),)
        reasons.append(f"each worker replicates over {'its GPUs' if host.gpus else 'its CPU'}")
        return Choice(kind=kind, devices=local, reasons=tuple(reasons))
    if kind is StrategyKind.DEFAULT:
        _refuse_devices(kind, devices)
        _refuse_cpu_replicas(kind, cpu_replicas, "the default strategy has one replica. Pass strategy='mirrored'.")
        reasons.append("default: no distribution, TensorFlow places ops itself")
        return Choice(kind=kind, reasons=tuple(reasons))
    if kind is StrategyKind.TPU:
        _refuse_devices(kind, devices)
        _refuse_cpu_replicas(kind, cpu_replicas, "TPUs are not simulated on the CPU. Pass strategy='mirrored'.")
        if not host.tpus:
            raise StrategyError(
                f"Received strategy='tpu'; this host has no TPU TensorFlow can see: {host.describe()}. "
                "Run on a TPU VM (or set TPU_NAME for a TPU node), or pass strategy='auto'."
            )
        reasons.append(f"tpu: {host.tpus} TPU core(s) visible")
        return Choice(kind=kind, reasons=tuple(reasons))

    requested = devices
    if cpu_replicas is not None:
        if devices is not None and (devices.keyword == "gpu" or any(d.kind == "GPU" for d in devices.devices)):
            raise StrategyError(
                f"Received cpu_replicas={cpu_replicas} with devices={devices.text!r}; CPU replicas and GPU "
                "devices exclude each other. Remove cpu_replicas to train on GPUs, or pass devices='cpu'."
            )
        devices = devices or DeviceRequest(keyword="cpu", text="cpu")
    chosen = resolve_devices(devices, host)
    if cpu_replicas is not None:
        chosen = chosen[:cpu_replicas]
        reasons.append(f"cpu_replicas={cpu_replicas}: the CPU split into {cpu_replicas} logical devices")
    elif requested is None or requested.keyword == "all":
        what = f"every visible GPU ({host.gpus})" if host.gpus else "the CPU, as no GPU is visible"
        reasons.append(f"devices not restricted: {what}")
    else:
        reasons.append(f"devices={requested.text!r} as requested")

    if kind is StrategyKind.ONE_DEVICE:
        if devices is None or devices.keyword == "all":
            chosen = chosen[:1]
        if len(chosen) != 1:
            raise StrategyError(
                f"Received strategy='one_device' with devices {[str(d) for d in chosen]}; it takes exactly one "
                "device. Pass e.g. devices='/gpu:0', or strategy='mirrored' for several."
            )
    return Choice(kind=kind, devices=chosen, reasons=tuple(reasons))


_COLLECTIVE_KEY_BASES = itertools.count(1)


def _mirrored_with_own_collective_keys(devices: list[str]) -> Any:
    """A MirroredStrategy whose collective keys no other strategy in this process uses.

    Every MirroredStrategy starts its collective group and instance keys at the
    same numbers, so a second one over the same devices reuses the first one's
    keys, and training another model fails with "Shape mismatch in the collective
    instance 100" (measured on TF 2.21 with 4 CPU replicas). TensorFlow's own
    tests give each strategy a key base; tfstrategy does the same, and puts the
    class default back so strategies made directly are unaffected.
    """
    cls = tf().distribute.MirroredStrategy
    default = cls._collective_key_base
    cls._collective_key_base = next(_COLLECTIVE_KEY_BASES) * 1_000_000
    try:
        return cls(devices=devices)
    finally:
        cls._collective_key_base = default


def build(choice: Choice, *, collective_timeout: float | None = DEFAULT_COLLECTIVE_TIMEOUT) -> Any:
    """Instantiate the strategy a :class:`Choice` describes.

    Args:
        choice: the output of :func:`choose`.
        collective_timeout: for multi-worker, seconds a collective may wait for
            a peer before raising (``None``: wait forever, as TensorFlow does).

    Under ``tfstrategy launch`` it signals joining through ``TFSTRATEGY_JOIN_FILE`` (see
    :mod:`tfstrategy.worker`); for multi-worker it also installs
    :func:`tfstrategy.apply_keras_mwms_fix` where the installed Keras needs it.

    Raises:
        StrategyError: TensorFlow cannot create it here (e.g. no TPU reachable).
    """
    signal_starting()
    strategy = _build(choice, collective_timeout)
    # Under `tfstrategy launch`, tell the launcher this worker has joined the job.
    signal_joined()
    return strategy


def _build(choice: Choice, collective_timeout: float | None) -> Any:
    distribute = tf().distribute
    if choice.kind is StrategyKind.MIRRORED:
        return _mirrored_with_own_collective_keys([device.tf_name for device in choice.devices])
    if choice.kind is StrategyKind.ONE_DEVICE:
        return distribute.OneDeviceStrategy(choice.devices[0].tf_name)
    if choice.kind is StrategyKind.DEFAULT:
        return distribute.get_strategy()
    if choice.kind is StrategyKind.MULTI_WORKER:
        options = distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
        try:
            # Returns once every worker in TF_CONFIG has connected.
            strategy = distribute.MultiWorkerMirroredStrategy(communication_options=options)
        except tf().errors.UnknownError as error:
            if "Could not start gRPC server" not in str(error):
                raise
            config = load_cluster_config()
            where = f"{config.task_name} at {config.address}" if config else "this task"
            raise StrategyError(
                f"Received TF_CONFIG placing {where}, but TensorFlow could not start its server there ({error}); "
                "the port is most likely held by another process. Free it or pick another port in TF_CONFIG "
                "(tfstrategy launch picks free ports itself)."
            ) from error
        # Keras 3's fit/evaluate fail on a multi-worker MWMS without it (see mwms_fix).
        from tfstrategy.mwms_fix import apply_keras_mwms_fix

        apply_keras_mwms_fix()
        return strategy
    if choice.kind is StrategyKind.TPU:
        try:
            resolver = distribute.cluster_resolver.TPUClusterResolver()
            tf().config.experimental_connect_to_cluster(resolver)
            tf().tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError) as error:
            raise StrategyError(
                f"Received strategy='tpu', but TensorFlow could not reach a TPU ({error}). "
                "Check TPU_NAME and that this VM has TPU access, or pass strategy='auto'."
            ) from error
        return distribute.TPUStrategy(resolver)
    raise StrategyError(f"Received a choice of kind {choice.kind!r}, which cannot be built; resolve 'auto' with choose() first.")


@dataclass(frozen=True, kw_only=True)
class Selection:
    """A ready strategy and the record of why it was chosen."""

    strategy: Any
    choice: Choice
    sources: Mapping[str, str] = field(default_factory=dict)

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
        """Why this strategy: settings' sources and the rules that applied."""
        settings = ", ".join(f"{name} from {source}" for name, source in self.sources.items())
        return "; ".join([*self.choice.reasons, settings] if settings else self.choice.reasons)


@dataclass(frozen=True, kw_only=True)
class Request:
    """What :func:`select` was asked for, after precedence and validation, before any TensorFlow call."""

    kind: StrategyKind
    devices: DeviceRequest | None
    cpu_replicas: int | None
    cluster_tasks: int
    sources: Mapping[str, str]


def resolve_request(
    strategy: StrategyKind | str | None = None,
    devices: DeviceSpec | None = None,
    cpu_replicas: int | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Request:
    """Apply argument > ``TFSTRATEGY_*`` > default and validate each setting and ``TF_CONFIG``.

    Pure apart from reading the environment; :func:`select` and ``tfstrategy env``
    share it so the report predicts exactly what ``select`` would do.

    Raises:
        TFStrategyError: a setting is invalid or code and environment conflict.
    """
    kind_setting = resolve_setting(
        "strategy", strategy, ENV_STRATEGY, StrategyKind.AUTO, env, normalise=lambda v: StrategyKind.parse(v).value
    )
    devices_setting = resolve_setting("devices", devices, ENV_DEVICES, None, env, normalise=_devices_key)
    replicas_setting = resolve_setting(
        "cpu_replicas", cpu_replicas, ENV_CPU_REPLICAS, None, env, normalise=lambda v: str(validate_cpu_replicas(v))
    )
    kind = StrategyKind.parse(kind_setting.value)
    request = parse_devices(devices_setting.value)
    replicas = validate_cpu_replicas(replicas_setting.value)
    cluster = load_cluster_config(env)
    sources = {"strategy": kind_setting.source}
    if devices_setting.value is not None:
        sources["devices"] = devices_setting.source
    if replicas is not None:
        sources["cpu_replicas"] = replicas_setting.source
    return Request(
        kind=kind,
        devices=request,
        cpu_replicas=replicas,
        cluster_tasks=cluster.num_workers if cluster else 0,
        sources=sources,
    )


def _devices_key(value: Any) -> str:
    return str(parse_devices(value))


def select(
    strategy: StrategyKind | str | None = None,
    devices: DeviceSpec | None = None,
    cpu_replicas: int | None = None,
    *,
    collective_timeout: float | None = DEFAULT_COLLECTIVE_TIMEOUT,
    env: Mapping[str, str] | None = None,
) -> Selection:
    """Select, validate and build a distribution strategy in one call.

    Each argument left as ``None`` falls back to its ``TFSTRATEGY_*`` variable
    (``TFSTRATEGY_STRATEGY``, ``TFSTRATEGY_DEVICES``, ``TFSTRATEGY_CPU_REPLICAS``),
    then to the default: ``auto`` on every visible GPU or the CPU.

    Args:
        strategy: ``auto``, ``mirrored``, ``one_device``, ``default``,
            ``multi_worker`` or ``tpu``.
        devices: e.g. ``"gpu:0,gpu:1"``, ``[0, 1]``, ``"cpu"``; ``None`` for all.
        cpu_replicas: split the CPU into this many logical devices and use
            them as replicas. Must come before anything starts TensorFlow.
        collective_timeout: seconds a multi-worker collective may wait for a peer;
            ``TFSTRATEGY_COLLECTIVE_TIMEOUT`` replaces the default when set.
        env: environment to read instead of ``os.environ``.

    Raises:
        TFStrategyError: any invalid input, with a message saying how to fix it.

    Example:
        >>> selection = tfstrategy.select(cpu_replicas=4)
        >>> with selection.scope():
        ...     model = build_model()
    """
    request = resolve_request(strategy, devices, cpu_replicas, env=env)
    if collective_timeout == DEFAULT_COLLECTIVE_TIMEOUT:
        collective_timeout = collective_timeout_from_env(collective_timeout, env)
    if request.cpu_replicas is not None and request.kind in (StrategyKind.AUTO, StrategyKind.MIRRORED, StrategyKind.ONE_DEVICE):
        configure_cpu_replicas(request.cpu_replicas)
    choice = choose(
        kind=request.kind,
        devices=request.devices,
        cpu_replicas=request.cpu_replicas,
        host=HostInfo.detect(),
        cluster_tasks=request.cluster_tasks,
    )
    # From here on tfstrategy is active: record where variables are created so
    # the scope audit can name the file:line of any made outside the scope.
    start_recording()
    return Selection(strategy=build(choice, collective_timeout=collective_timeout), choice=choice, sources=request.sources)
