"""One job or a clear refusal: what the hook does with each strategy a script creates under a multi-worker ``TF_CONFIG``.

Pure decisions (no TensorFlow): :func:`decide_mirrored` for ``MirroredStrategy``
with or without a device list, :func:`refusal` for the kinds that cannot be made
part of one MultiWorkerMirroredStrategy job. The hook (:mod:`tfstrategy.runtime.rewrites`)
applies them; ``docs/guides/unchanged-scripts.md`` lists them as a table.

============================== ======= ==========================================================
strategy the script creates     outcome  why
============================== ======= ==========================================================
``MultiWorkerMirroredStrategy`` joins    it is the job
``MirroredStrategy()``          joins    becomes a MultiWorkerMirroredStrategy over the workers
``MirroredStrategy(devices)``   joins    if the list is this worker's devices (all its GPUs, or its CPU; ``[]``)
``MirroredStrategy(devices)``   refused  other lists: MultiWorkerMirroredStrategy cannot honour them
``OneDeviceStrategy``           refused  one device of one worker: each worker would train alone
``CentralStorageStrategy``      refused  one machine's variables: each worker would train alone
``ParameterServerStrategy``     refused  needs chief, worker and ps tasks; not supported by launch yet
``ClusterCoordinator``          refused  the parameter-server coordinator, same reason
``TPUStrategy``                 refused  the TPU system coordinates TPU hosts, not TF_CONFIG workers
no strategy, ``fit()``          refused  each worker would train alone on all the data
============================== ======= ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tfstrategy.runtime.device_lists import DeviceList, decide_listed
from tfstrategy.selection.devices import Device
from tfstrategy.selection.host import HostInfo

__all__ = ["JOIN", "REFUSE", "Decision", "decide_mirrored", "refusal", "REFUSED_CLASSES"]

JOIN, REFUSE = "join", "refuse"

#: Why each refused class cannot join, and what to do instead.
REFUSED_CLASSES = {
    "OneDeviceStrategy": (
        "it places everything on one device of this worker, so each worker would train alone on all the data",
        "Use tf.distribute.MirroredStrategy() or MultiWorkerMirroredStrategy() to train as one job, "
        "or run the script as one process (python or tfstrategy run)",
    ),
    "CentralStorageStrategy": (
        "it keeps the variables on one machine, so each worker would train alone on all the data",
        "Use tf.distribute.MirroredStrategy() or MultiWorkerMirroredStrategy(), or run the script as one process",
    ),
    "ParameterServerStrategy": (
        "tfstrategy does not support parameter-server training yet (it needs chief, worker and ps tasks; "
        "launch starts N identical workers)",
        "Run it without tfstrategy launch (its own cluster, or an in-process one), "
        "or use MultiWorkerMirroredStrategy",
    ),
    "ClusterCoordinator": (
        "tfstrategy does not support parameter-server training yet (the coordinator needs ps tasks; "
        "launch starts N identical workers)",
        "Run it without tfstrategy launch, or use MultiWorkerMirroredStrategy",
    ),
    "TPUStrategy": (
        "the TPU system coordinates a TPU pod's hosts, not TF_CONFIG workers, so launch cannot make it one job",
        "Run the script once on the TPU VM, without tfstrategy launch",
    ),
}
REFUSED_CLASSES["TPUStrategyV2"] = REFUSED_CLASSES["TPUStrategy"]


@dataclass(frozen=True, kw_only=True)
class Decision:
    """``join`` (make it the MultiWorkerMirroredStrategy of the job) or ``refuse`` (with the one line)."""

    action: str
    message: str = ""


def _where(num_workers: int) -> str:
    return f"under a multi-worker TF_CONFIG ({num_workers} workers, e.g. tfstrategy launch -n {num_workers})"


def refusal(what: str, num_workers: int) -> str:
    """The one line for a refused class (a key of :data:`REFUSED_CLASSES`) or ``"fit"``."""
    if what == "fit":
        return (
            f"tfstrategy stopped Model.fit() before its first step: it was called without a strategy "
            f"{_where(num_workers)}, so each worker would train alone on all the data. Create "
            "tf.distribute.MultiWorkerMirroredStrategy() (or MirroredStrategy()) and build and compile the model in "
            "its scope, or run the script as one process (python or tfstrategy run)."
        )
    why, fix = REFUSED_CLASSES[what]
    return f"tfstrategy refused {what} {_where(num_workers)}: {why}. {fix}."


def decide_mirrored(listed: DeviceList | None, worker_devices: Sequence[Device], num_workers: int, *,
                    host: HostInfo | None = None, where: str = "an unknown line") -> Decision:
    """Whether ``MirroredStrategy(devices)`` can join a job whose workers each replicate over ``worker_devices``.

    Args:
        listed: the script's device list, read (:func:`~tfstrategy.runtime.device_lists.read_device_list`),
            ``None`` when it gave none.
        worker_devices: what MultiWorkerMirroredStrategy uses on this worker (every GPU, else CPU:0).
        num_workers: workers in the job.
        host: this worker's devices: a listed GPU it lacks is said as such (what was asked, what it has, the fix);
            a CPU list is the job's question (``--cpu-replicas`` cannot help a multi-worker job).
        where: the script's ``file:line``, for that line.
    """
    if listed is None or listed.every_local_device:  # [], list_logical_devices('GPU') on a CPU host
        return Decision(action=JOIN)
    if host is not None and any(device.kind == "GPU" for device in listed.local):
        missing = decide_listed(listed, where=where, chosen=None, host=host)
        if missing.stop:
            return Decision(action=REFUSE, message=missing.stop)
    if listed.readable_local and sorted(set(listed.local)) == sorted(set(worker_devices)):
        return Decision(action=JOIN)
    local = ",".join(str(device) for device in worker_devices)
    return Decision(
        action=REFUSE,
        message=(
            f"tfstrategy refused MirroredStrategy(devices={listed.shown()}) {_where(num_workers)}: "
            f"MultiWorkerMirroredStrategy replicates over each worker's own devices ({local} here), so this list "
            "cannot join the job and each worker would train alone. Omit devices (MirroredStrategy()) to train as one "
            "job, or run the script as one process (python or tfstrategy run --cpu-replicas N)."
        ),
    )


def worker_devices(gpus: int) -> tuple[Device, ...]:
    """The devices MultiWorkerMirroredStrategy uses on a worker with ``gpus`` GPUs."""
    return tuple(Device("GPU", index) for index in range(gpus)) or (Device("CPU", 0),)
