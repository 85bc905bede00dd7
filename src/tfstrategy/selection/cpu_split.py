"""Split the CPU into logical devices so one laptop can rehearse N replicas."""

from __future__ import annotations

from tfstrategy._tf import tf
from tfstrategy.errors import RuntimeInitializedError, StrategyError


def validate_cpu_replicas(cpu_replicas: object) -> int | None:
    """Check a ``cpu_replicas`` value and return it as an int (or ``None``).

    Raises:
        StrategyError: not a whole number of at least 1.
    """
    if cpu_replicas is None:
        return None
    if isinstance(cpu_replicas, str) and cpu_replicas.strip().isdigit():
        cpu_replicas = int(cpu_replicas)
    if isinstance(cpu_replicas, bool) or not isinstance(cpu_replicas, int) or cpu_replicas < 1:
        raise StrategyError(
            f"Received cpu_replicas={cpu_replicas!r}; expected a whole number of at least 1, "
            "e.g. cpu_replicas=4 (--cpu-replicas 4) to rehearse 4 replicas on the CPU."
        )
    return cpu_replicas


def configure_cpu_replicas(count: int) -> int:
    """Make at least ``count`` logical CPU devices exist; return how many exist.

    Logical devices can only be configured before the TensorFlow runtime starts
    (the first op, ``list_logical_devices`` or strategy creation starts it), so
    call this first thing in a process. If the runtime has already started with
    at least ``count`` logical CPUs, the existing ones are used as they are.

    Raises:
        RuntimeInitializedError: the runtime started with fewer logical CPUs.

    Example:
        >>> configure_cpu_replicas(4)  # before any other TensorFlow call
        4
    """
    config = tf().config
    cpu = config.list_physical_devices("CPU")[0]
    existing = config.get_logical_device_configuration(cpu)
    if existing is not None and len(existing) >= count:
        return len(existing)
    try:
        config.set_logical_device_configuration(cpu, [tf().config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError as error:
        # TensorFlow says "Virtual devices cannot be modified after being initialized".
        have = len(config.list_logical_devices("CPU"))
        if have >= count:
            return have
        raise RuntimeInitializedError(
            f"Received cpu_replicas={count}, but the TensorFlow runtime already started with {have} logical "
            "CPU device(s), and devices cannot be split after that. Call tfstrategy.select(cpu_replicas="
            f"{count}) (or configure_cpu_replicas) before any other TensorFlow call, or set "
            f"TFSTRATEGY_CPU_REPLICAS={count} in the environment."
        ) from error
    return count
