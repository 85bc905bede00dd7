"""Split the CPU into logical devices so one laptop can rehearse N replicas."""

from __future__ import annotations

from tfstrategy._tf import tf
from tfstrategy.errors import RuntimeInitializedError, StrategyError
from tfstrategy.settings import received

__all__ = ["validate_cpu_replicas", "configure_cpu_replicas"]

#: The most logical CPU devices a rehearsal may ask for. Each one gets its own
#: thread pools and a copy of every variable: measured on a 2-core host, 64
#: replicas take ~50 s and ~0.9 GB for ``tfstrategy check``, 256 take ~130 s and
#: ~1.8 GB, and 100000 ran without bound. No host has more than 16 GPUs to rehearse.
MAX_CPU_REPLICAS = 64


def validate_cpu_replicas(cpu_replicas: object, *, name: str = "cpu_replicas") -> int | None:
    """Check a ``cpu_replicas`` value and return it as an int (or ``None``).

    Args:
        cpu_replicas: an int, or its text (from the CLI or ``TFSTRATEGY_CPU_REPLICAS``).
        name: what the value is called in messages (``--cpu-replicas`` spells it as a flag).

    Raises:
        StrategyError: not a whole number from 1 to :data:`MAX_CPU_REPLICAS`.
    """
    if cpu_replicas is None:
        return None
    value = cpu_replicas
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit() and len(value.strip()) <= 6:
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        example = "--cpu-replicas 4" if name.startswith("--") else "cpu_replicas=4 (--cpu-replicas 4)"
        raise StrategyError(
            f"Received {received(name, cpu_replicas)}; expected a whole number of at least 1, "
            f"e.g. {example} to rehearse 4 replicas on the CPU."
        )
    if value > MAX_CPU_REPLICAS:
        raise StrategyError(
            f"Received {received(name, cpu_replicas)}; expected at most {MAX_CPU_REPLICAS}, because every logical CPU "
            f"device gets its own thread pools and a copy of every variable ({MAX_CPU_REPLICAS} already take about a "
            "minute and 1 GB to check). Rehearse the replica count of the host you target, e.g. --cpu-replicas 8."
        )
    return value


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
