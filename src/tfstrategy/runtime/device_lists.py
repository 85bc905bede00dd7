"""Device lists as TensorFlow reads them, and what the hook does with one a script wrote (pure, no TensorFlow).

A script hands ``MirroredStrategy`` its devices in any form TensorFlow accepts: ``[]``
(TensorFlow then uses every local device), the result of
``tf.config.list_logical_devices('GPU')`` (empty on a CPU host), ``LogicalDevice``
objects, strings (``"/gpu:0"``, ``"/job:worker/replica:0/task:1/device:CPU:0"``) and GPU
ids. :func:`read_device_list` reads every form into a :class:`DeviceList`: this task's
devices, other tasks' and what tfstrategy cannot read (TensorFlow decides then).
:func:`decide_listed` is what ``tfstrategy run``'s hook does with such a list;
:func:`local_view` is what ``list_logical_devices`` returns inside a launched worker
before its strategy joins (plain TensorFlow's multi-worker job lists local devices only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tfstrategy.errors import DeviceError
from tfstrategy.selection.devices import Device, DeviceRequest, parse_devices, resolve_devices
from tfstrategy.selection.host import HostInfo

__all__ = ["FIXED_DEVICE_STRATEGIES", "replicas_note", "DeviceList", "ListedDecision", "Task", "decide_listed", "local_view", "read_device_list"]

#: A task of the cluster: its job name and index (``("worker", 1)``).
Task = tuple[str, int]

_TASK_RE = re.compile(r"^/job:(?P<job>[^/]+)(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?(?P<rest>/.*)?$",
                      re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class DeviceList:
    """One device list as the script wrote it, read as TensorFlow reads it."""

    #: Each entry as a name (a ``LogicalDevice``'s ``.name``, a string, ``"gpu:N"`` for an int), for messages.
    written: tuple[str, ...] = ()
    #: The devices of this task it names (empty for ``[]``).
    local: tuple[Device, ...] = ()
    #: The entries naming another task's devices.
    foreign: tuple[str, ...] = ()
    #: Why tfstrategy cannot read it (TensorFlow decides), or ``""``.
    unreadable: str = ""

    @property
    def every_local_device(self) -> bool:
        """``[]``: plain TensorFlow uses every local device (every GPU, else every logical CPU)."""
        return not self.written and not self.unreadable

    @property
    def readable_local(self) -> bool:
        """Every entry is one of this task's devices, read."""
        return bool(self.local) and not self.foreign and not self.unreadable

    def shown(self) -> str:
        """The list for a message, e.g. ``['/cpu:0', '/cpu:1']``."""
        return repr(list(self.written))


def _name(item: object) -> str | None:
    """An entry's device name: a string, a ``LogicalDevice``'s ``.name``, ``gpu:N`` for an int; ``None`` otherwise."""
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return f"/gpu:{item}" if item >= 0 else None
    if isinstance(item, str):
        return item.strip()
    name = getattr(item, "name", None)  # tf.config.LogicalDevice (a namedtuple), tf.DeviceSpec-like objects
    return name.strip() if isinstance(name, str) else None


def _owner(name: str, task: Task | None) -> tuple[bool, str]:
    """Whether ``name`` is a device of this process (``localhost`` or ``task``), and its local part."""
    match = _TASK_RE.match(name)
    if match is None:
        return True, name
    job, index, rest = match.group("job"), int(match.group("task") or 0), match.group("rest") or ""
    mine = (job.lower() == "localhost" and index == 0) or (task is not None and (job, index) == task)
    return mine, rest


def read_device_list(devices: object, task: Task | None = None) -> DeviceList:
    """Read ``devices`` as ``MirroredStrategy(devices)`` does; ``task`` is this process's task of a cluster.

    Never raises: what tfstrategy cannot read is ``unreadable`` (TensorFlow decides).

    Example:
        >>> read_device_list(["/job:worker/replica:0/task:1/device:CPU:0"], ("worker", 1)).local
        (Device(kind='CPU', index=0),)
    """
    if isinstance(devices, str):
        devices = [part for part in devices.split(",") if part.strip()]
    if not isinstance(devices, Iterable):
        return DeviceList(unreadable=f"{type(devices).__name__} is not a list of devices")
    written: list[str] = []
    local: list[Device] = []
    foreign: list[str] = []
    for item in list(devices):
        name = _name(item)
        if name is None:
            return DeviceList(written=tuple(written), unreadable=f"{item!r} is not a device name")
        written.append(name)
        mine, rest = _owner(name, task)
        if not mine:
            foreign.append(name)
            continue
        try:
            request = parse_devices([rest])
        except DeviceError as error:
            return DeviceList(written=tuple(written), unreadable=str(error))
        if request is not None:
            local.extend(request.devices)
    if len(set(local)) != len(local):
        return DeviceList(written=tuple(written), unreadable="a device appears twice")
    return DeviceList(written=tuple(written), local=tuple(local), foreign=tuple(foreign))


@dataclass(frozen=True, kw_only=True)
class ListedDecision:
    """What ``MirroredStrategy(devices)`` gets under ``tfstrategy run``, and what is said about it."""

    #: The devices to create it with (TensorFlow names), or ``None``: the list as the script wrote it.
    use: tuple[str, ...] | None = None
    #: The one line that stops the script (exit 2), or ``""``.
    stop: str = ""
    #: The one line reported and the script goes on (a setting with no effect, a device report under warn).
    note: str = ""
    #: What the script's list was replaced with, in its terms, for the exit summary (``""``: kept as written).
    change: str = ""


def decide_listed(listed: DeviceList, *, where: str, chosen: Sequence[Device] | None, host: HostInfo,
                  settings: Sequence[str] = (), warn_only: bool = False) -> ListedDecision:
    """The hook's answer to a device list the script wrote, under ``tfstrategy run`` (one process).

    Args:
        listed: the list, read.
        where: the script's ``file:line``, for messages.
        chosen: the devices tfstrategy would use (``--devices``/``--cpu-replicas``), or ``None`` without them.
        host: this host's devices.
        settings: the flags given, as written (``["--cpu-replicas 4"]``).
        warn_only: ``TFSTRATEGY_DEVICE_CHECK=warn``: a missing device is a note, not a stop.
    """
    if listed.every_local_device:  # [] and list_logical_devices('GPU') on a CPU host: every local device
        if not chosen:
            return ListedDecision()
        given = f" of {' and '.join(settings)}" if settings else ""
        return ListedDecision(use=tuple(device.tf_name for device in chosen),
                              change=f"MirroredStrategy(devices=[]) at {where} (an empty list: every local device) given "
                                     f"the {len(chosen)} device(s){given}")
    if not listed.readable_local:
        return ListedDecision()  # another task's devices, or a form tfstrategy does not read: TensorFlow decides
    head = f"MirroredStrategy(devices={listed.shown()}) at {where}"
    try:
        resolve_devices(DeviceRequest(devices=listed.local, text=""), host)
    except DeviceError as error:
        if warn_only:
            return ListedDecision(note=f"{head}: {error}")
        return ListedDecision(stop=f"tfstrategy stopped {head}: {error}")
    if settings and chosen is not None and set(listed.local) != set(chosen):
        return ListedDecision(note=f"{head} names its own devices, so {' and '.join(settings)} had no effect on it; "
                                   "remove the list from the script to use them")
    return ListedDecision()


def local_view(devices: Iterable[tuple[str, str]], task: Task) -> list[tuple[str, str]]:
    """``(name, device_type)`` of ``task``'s own devices among a configured cluster's, as a lone process names them.

    Plain TensorFlow's multi-worker job lists ``/job:localhost/replica:0/task:0/device:CPU:0``
    until its strategy starts the cluster; the hook configures the cluster at import, so
    ``list_logical_devices`` would list every worker's devices.
    """
    found = []
    for name, kind in devices:
        mine, rest = _owner(name, task)
        if mine:
            found.append((f"/job:localhost/replica:0/task:0{rest}" if rest.startswith("/device:") else name, kind))
    return found


#: The strategies ``--cpu-replicas`` cannot change, and why.
FIXED_DEVICE_STRATEGIES = {
    "OneDeviceStrategy": "it places everything on its one device",
    "MultiWorkerMirroredStrategy": "it replicates over each worker's GPUs, else over its CPU:0",
}


def replicas_note(kind: str, cpu_replicas: str | None, where: str) -> str:
    """The one note for ``--cpu-replicas`` given to a strategy it cannot change, or ``""``."""
    why = FIXED_DEVICE_STRATEGIES.get(kind)
    if not cpu_replicas or why is None:
        return ""
    return (f"{kind} at {where}: --cpu-replicas {cpu_replicas} has no effect on this strategy ({why}); create "
            f"tf.distribute.MirroredStrategy() to train on {cpu_replicas} replicas")
