"""Check the device specifications users write against the host.

Plain ``MirroredStrategy(devices=...)`` accepts almost anything: on a CPU-only
host ``["/gpu:0"]`` silently runs on the CPU and ``["/cpu:0", "/cpu:7"]`` hangs
at the first step. Here every spec is parsed into :class:`Device` values
(:func:`parse_devices`, pure, in :mod:`tfstrategy.parsing` so that ``TFSTRATEGY_DEVICES``
names it as its parser) and then checked against the host (:func:`resolve_devices`),
so a wrong spec fails at once with a message that says what to pass instead.
"""

from __future__ import annotations

from tfstrategy.errors import DeviceError
from tfstrategy.parsing import Device as Device  # re-exported, as the three below: parsing a spec moved there
from tfstrategy.parsing import DeviceRequest as DeviceRequest
from tfstrategy.parsing import DeviceSpec as DeviceSpec
from tfstrategy.parsing import parse_devices as parse_devices
from tfstrategy.parsing import shorten
from tfstrategy.selection.host import HostInfo

__all__ = ["Device", "DeviceRequest", "parse_devices", "resolve_devices"]


def resolve_devices(request: DeviceRequest | None, host: HostInfo) -> tuple[Device, ...]:
    """Turn a parsed request into the host's devices, checking each exists.

    ``None`` and ``"all"`` mean every GPU, or every logical CPU on a host
    without GPUs (one CPU unless ``cpu_replicas`` split it).

    Raises:
        DeviceError: a named device does not exist here, or ``"gpu"`` on a
            host without GPUs.
    """
    if request is None or request.keyword == "all":
        if host.gpus:
            return tuple(Device("GPU", i) for i in range(host.gpus))
        return tuple(Device("CPU", i) for i in range(host.cpus))
    if request.keyword == "cpu":
        return tuple(Device("CPU", i) for i in range(host.cpus))
    if request.keyword == "gpu":
        if not host.gpus:
            raise DeviceError(
                f"Received devices='gpu'; this host has no GPU TensorFlow can see: {host.describe()}. "
                "Pass devices='cpu' (--devices cpu) or omit devices; for GPUs install 'tfstrategy[gpu]'."
            )
        return tuple(Device("GPU", i) for i in range(host.gpus))
    available = {"CPU": host.cpus, "GPU": host.gpus}
    missing = [device for device in request.devices if device.index >= available[device.kind]]
    if missing:
        if missing[0].kind == "GPU":
            fix = "Pass --devices cpu (devices='cpu') or omit devices." if not host.gpus else (
                f"Pass GPU ids below {host.gpus}, or 'gpu' for all of them."
            )
        else:
            needed = max(device.index for device in request.devices) + 1
            fix = (
                f"Pass cpu_replicas={needed} (--cpu-replicas {needed}) to split the CPU into {needed} logical devices "
                f"before TensorFlow starts, or name devices below /cpu:{host.cpus}."
            )
        raise DeviceError(f"Received devices={shorten([str(d) for d in request.devices], 200)}; this host has {host.describe()}. {fix}")
    return request.devices
