"""Choose a distribution strategy and its devices from plain values (pure: no TensorFlow).

:func:`choose` decides which strategy and devices to use and records why; it
never touches TensorFlow, so every rule is testable with a made-up
:class:`~tfstrategy.selection.host.HostInfo`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfstrategy.errors import StrategyError
from tfstrategy.selection.devices import Device, DeviceRequest, resolve_devices
from tfstrategy.selection.host import HostInfo
from tfstrategy.settings import StrategyKind

__all__ = ["Choice", "choose"]


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


def _where_tasks_come_from(source: str) -> str:
    from tfstrategy.environments import ENVIRONMENTS

    kind = next((kind for kind in ENVIRONMENTS if kind.name == source), None)
    if kind is None:
        return f"{source} describes"
    return kind.tasks_phrase or f"the {kind.name} cluster has"


def choose(
    *,
    kind: StrategyKind,
    devices: DeviceRequest | None,
    cpu_replicas: int | None,
    host: HostInfo,
    cluster_tasks: int = 0,
    cluster_source: str = "TF_CONFIG",
) -> Choice:
    """Decide the strategy and devices from plain values; no TensorFlow involved.

    Args:
        kind: the requested kind; ``AUTO`` is resolved here.
        devices: the parsed ``devices=`` request, or ``None``.
        cpu_replicas: logical CPUs requested as replicas, or ``None``.
        host: the devices this host offers (after any CPU split).
        cluster_tasks: chief and worker tasks of the cluster (0 without one).
        cluster_source: the name of the cluster environment it comes from (``"TF_CONFIG"``, ``"Slurm"``: see
            :data:`tfstrategy.environments.ENVIRONMENTS`).

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
            reasons.append(f"auto: {_where_tasks_come_from(cluster_source)} {cluster_tasks} tasks, so "
                           "MultiWorkerMirroredStrategy")
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
