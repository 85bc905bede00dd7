"""What devices this host offers, as a plain value the pure choosers can read."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tfstrategy._tf import tf

__all__ = ["HostInfo"]


@dataclass(frozen=True, kw_only=True)
class HostInfo:
    """The logical devices TensorFlow exposes on this host.

    Tests build it by hand (``HostInfo(cpus=1, gpus=4)``) to stand in for
    hardware that cannot exist here; :meth:`detect` reads the real host.
    """

    cpus: int = 1
    gpus: int = 0
    tpus: int = 0
    cuda_visible_devices: str | None = None

    def device_names(self) -> list[str]:
        """Short names of every usable device, e.g. ``['/cpu:0', '/gpu:0']``."""
        return [f"/cpu:{i}" for i in range(self.cpus)] + [f"/gpu:{i}" for i in range(self.gpus)]

    def describe(self) -> str:
        """One phrase for error messages: the devices and CUDA_VISIBLE_DEVICES."""
        cuda = self.cuda_visible_devices
        cuda_text = "unset" if cuda is None else repr(cuda)
        return f"{self.device_names()} (CUDA_VISIBLE_DEVICES is {cuda_text})"

    @classmethod
    def detect(cls) -> HostInfo:
        """Count the logical devices this process will have, without starting the runtime.

        It reads the visible physical devices and their logical configuration
        rather than ``list_logical_devices``, because starting the runtime here
        would make a later ``cpu_replicas`` split or MultiWorkerMirroredStrategy
        creation fail, and would initialise every GPU.
        """
        config = tf().config

        def logical_count(kind: str) -> int:
            return sum(len(config.get_logical_device_configuration(device) or [device]) for device in config.get_visible_devices(kind))

        return cls(
            cpus=logical_count("CPU"),
            gpus=logical_count("GPU"),
            tpus=len(config.list_physical_devices("TPU")),
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        )
