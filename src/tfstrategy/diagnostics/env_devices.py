"""Devices for the environment report: what TensorFlow and ``nvidia-smi`` see, read without starting the runtime."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfstrategy import _compat
from tfstrategy._tf import tf

__all__ = ["DeviceFacts", "GPUInfo", "describe_build", "describe_gpus", "describe_nvidia_smi", "parse_nvidia_smi", "read_device_facts"]


@dataclass(frozen=True, kw_only=True)
class GPUInfo:
    """One physical GPU as TensorFlow reports it, without initialising it."""

    name: str
    model: str | None = None
    compute_capability: str | None = None
    visible: bool = True
    memory_limits_mb: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeviceFacts:
    """Devices of this process; tests build it by hand for GPUs that cannot exist here."""

    physical: tuple[str, ...] = ("CPU:0",)
    logical: tuple[str, ...] = ("/cpu:0",)
    gpus: tuple[GPUInfo, ...] = ()
    runtime_started: bool = False
    #: ``nvidia-smi`` rows (index, name, memory), or ``None`` when it is not installed.
    nvidia_smi: tuple[dict[str, str], ...] | None = None


def _short(device: Any) -> str:
    # PhysicalDevice(name='/physical_device:GPU:0', ...) -> "GPU:0"
    return str(device.name).rsplit("physical_device:", 1)[-1]


def read_device_facts() -> DeviceFacts:
    """Read devices without starting the runtime or initialising a GPU."""
    config = tf().config
    started = _compat.runtime_started()
    physical = config.list_physical_devices()
    visible = {device.name for device in config.get_visible_devices()}
    if started:
        # Once started, the runtime's own list is exact and reading it costs nothing.
        logical = tuple(
            f"/{d.device_type.lower()}:{d.name.rsplit(':', 1)[-1]}"
            for d in config.list_logical_devices()
            if d.device_type in ("CPU", "GPU", "TPU")
        )
    else:
        names: list[str] = []
        for kind in ("CPU", "GPU", "TPU"):
            visible_of_kind = config.get_visible_devices(kind)
            count = sum(len(config.get_logical_device_configuration(d) or [d]) for d in visible_of_kind)
            names += [f"/{kind.lower()}:{i}" for i in range(count)]
        logical = tuple(names)
    gpus = []
    for device in physical:
        if device.device_type != "GPU":
            continue
        details = config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        logical_configs = config.get_logical_device_configuration(device) or []
        limits = tuple(int(c.memory_limit) for c in logical_configs if c.memory_limit is not None)
        gpus.append(
            GPUInfo(
                name=_short(device),
                model=details.get("device_name"),
                compute_capability=".".join(str(part) for part in capability) if capability else None,
                visible=device.name in visible,
                memory_limits_mb=limits,
            )
        )
    return DeviceFacts(
        physical=tuple(_short(d) for d in physical),
        logical=logical,
        gpus=tuple(gpus),
        runtime_started=started,
        nvidia_smi=read_nvidia_smi(),
    )


def read_nvidia_smi(timeout: float = 10.0) -> tuple[dict[str, str], ...] | None:
    """GPU names and total memory from ``nvidia-smi`` (a separate process: our GPUs stay untouched)."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        result = subprocess.run(
            [executable, "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return ({"error": f"nvidia-smi failed: {error}"},)
    if result.returncode != 0:
        return ({"error": f"nvidia-smi exited {result.returncode}: {result.stderr.strip()[:200]}"},)
    return parse_nvidia_smi(result.stdout)


def parse_nvidia_smi(output: str) -> tuple[dict[str, str], ...]:
    """Parse ``nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader`` lines."""
    rows = []
    for line in output.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 3:
            rows.append({"index": parts[0], "name": parts[1], "memory": parts[2]})
    return tuple(rows)


def describe_build(build: Mapping[str, object]) -> str:
    """``CUDA build (CUDA 12.5, cuDNN 9)`` or ``CPU-only build``."""
    if build.get("is_cuda_build"):
        return f"CUDA build (CUDA {build.get('cuda_version', '?')}, cuDNN {build.get('cudnn_version', '?')})"
    if build.get("is_rocm_build"):
        return f"ROCm build (ROCm {build.get('rocm_version', '?')})"
    return "CPU-only build (no CUDA)"


def describe_gpus(devices: DeviceFacts) -> str:
    """One phrase per GPU TensorFlow sees, e.g. ``GPU:0 NVIDIA A100 (compute 8.0)``."""
    if not devices.gpus:
        return "none visible to TensorFlow"
    parts = []
    for gpu in devices.gpus:
        text = gpu.name + (f" {gpu.model}" if gpu.model else "")
        extras = [f"compute {gpu.compute_capability}"] if gpu.compute_capability else []
        if gpu.memory_limits_mb:
            extras.append("memory limit " + "+".join(f"{mb} MB" for mb in gpu.memory_limits_mb))
        if not gpu.visible:
            extras.append("hidden by set_visible_devices")
        parts.append(text + (f" ({', '.join(extras)})" if extras else ""))
    return "; ".join(parts)


def describe_nvidia_smi(rows: tuple[dict[str, str], ...] | None) -> str:
    if rows is None:
        return "not installed"
    if not rows:
        return "no GPU listed"
    return "; ".join(row.get("error") or f"{row['index']}: {row['name']}, {row['memory']}" for row in rows)
