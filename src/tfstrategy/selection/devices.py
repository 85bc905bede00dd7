"""Parse and validate the device specifications users write.

Plain ``MirroredStrategy(devices=...)`` accepts almost anything: on a CPU-only
host ``["/gpu:0"]`` silently runs on the CPU and ``["/cpu:0", "/cpu:7"]`` hangs
at the first step. Here every spec is parsed into :class:`Device` values
(:func:`parse_devices`, pure) and then checked against the host
(:func:`resolve_devices`), so a wrong spec fails at once with a message that
says what to pass instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tfstrategy.errors import DeviceError
from tfstrategy.selection.host import HostInfo
from tfstrategy.settings import did_you_mean, received, shorten

__all__ = ["Device", "DeviceRequest", "parse_devices", "resolve_devices"]

#: What a user may pass as ``devices=``: a keyword or comma-separated string,
#: or a list of device strings and GPU ids.
DeviceSpec = str | Sequence[str | int]

KEYWORDS = ("all", "cpu", "gpu")
ACCEPTED_FORMS = "'all', 'cpu', 'gpu', 'gpu:0,gpu:1', '/gpu:0', '/device:GPU:1' or GPU ids such as '0,1'"

_DEVICE_RE = re.compile(
    r"^(?P<job>/job:[^/]+(?:/replica:\d+)?(?:/task:\d+)?)?"
    r"/?(?:device:)?(?P<kind>cpu|gpu|tpu):(?P<index>\d{1,6})$",
    re.IGNORECASE | re.ASCII,
)
_LOCAL_JOB_RE = re.compile(r"^/job:localhost(?:/replica:0)?(?:/task:0)?$", re.IGNORECASE)
_GLUED_RE = re.compile(r"^/?(?:device:)?(cpu|gpu|tpu):?(\d{1,6})$", re.IGNORECASE | re.ASCII)
#: Device ids have at most this many digits (int() refuses over 4300, and no host has a million devices).
_MAX_DIGITS = 6


@dataclass(frozen=True, order=True)
class Device:
    """One local device: ``kind`` is ``"CPU"`` or ``"GPU"``; ``index`` its number."""

    kind: str
    index: int

    def __str__(self) -> str:
        return f"/{self.kind.lower()}:{self.index}"

    @property
    def tf_name(self) -> str:
        """The name TensorFlow's strategies take, e.g. ``/device:GPU:0``."""
        return f"/device:{self.kind}:{self.index}"


@dataclass(frozen=True)
class DeviceRequest:
    """A parsed spec: either a keyword (``all``/``cpu``/``gpu``) or explicit devices."""

    keyword: str | None = None
    devices: tuple[Device, ...] = ()
    text: str = ""

    def __str__(self) -> str:
        return self.text


def _received(spec: object, name: str = "devices") -> str:
    return f"Received {received(name, spec)}"


def _parse_item(item: object, spec: object, name: str = "devices") -> Device:
    if isinstance(item, bool) or not isinstance(item, (str, int)):
        raise DeviceError(
            f"{_received(spec, name)}; each device must be a string such as '/gpu:0' or an int GPU id, "
            f"not {type(item).__name__} {shorten(item)}. Pass for example devices=['/gpu:0', '/gpu:1']."
        )
    if isinstance(item, int):
        if item < 0:
            raise DeviceError(f"{_received(spec, name)}; GPU ids are 0 or more, got {item}. Pass for example devices=[0, 1].")
        return Device("GPU", item)
    text = item.strip()
    if text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS:
        return Device("GPU", int(text))
    match = _DEVICE_RE.match(text)
    if match is None:
        glued = _GLUED_RE.match(text)
        hint = did_you_mean(text, [f"{glued.group(1).lower()}:{glued.group(2)}"]) if glued else ""
        raise DeviceError(f"{_received(spec, name)}; {shorten(item)} is not a device. Expected {ACCEPTED_FORMS}.{hint}")
    job = match.group("job")
    if job and not _LOCAL_JOB_RE.match(job):
        raise DeviceError(
            f"{_received(spec, name)}; {item!r} names a device of another task ({job}). MirroredStrategy only uses "
            "this process's devices: pass local devices such as '/gpu:0', and use strategy='multi_worker' "
            "(or `tfstrategy launch`) to train across machines."
        )
    kind = match.group("kind").upper()
    if kind == "TPU":
        raise DeviceError(
            f"{_received(spec, name)}; TPUs are not chosen through devices=. Pass strategy='tpu' "
            "(CLI: --strategy tpu) and omit devices."
        )
    return Device(kind, int(match.group("index")))


def parse_devices(spec: DeviceSpec | None, *, name: str = "devices") -> DeviceRequest | None:
    """Parse a device spec without looking at the host.

    Args:
        spec: ``None`` (no preference), a keyword (``"all"``, ``"cpu"``, ``"gpu"``),
            a comma-separated string (``"gpu:0,gpu:1"``, ``"0,1"``) or a list of
            device strings and GPU ids (``["/gpu:0", 1]``).
        name: what the spec is called in messages (``TFSTRATEGY_DEVICES`` when read from there, ``--devices``
            spells it as a flag).

    Returns:
        The parsed request, or ``None`` when ``spec`` is ``None``.

    Raises:
        DeviceError: the spec is empty, malformed, names TPUs or remote tasks,
            mixes CPUs and GPUs, or repeats a device.

    Example:
        >>> parse_devices("/device:GPU:1,gpu:0").devices
        (Device(kind='GPU', index=1), Device(kind='GPU', index=0))
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        text = spec.strip()
        if text.lower() in KEYWORDS:
            return DeviceRequest(keyword=text.lower(), text=text.lower())
        if not text:
            raise DeviceError(f"{_received(spec, name)}; expected {ACCEPTED_FORMS}. Omit devices to use every GPU (or the CPU).")
        if any(not part.strip() for part in text.split(",")):
            raise DeviceError(f"{_received(spec, name)}; it has an empty entry between commas. Expected {ACCEPTED_FORMS}.")
        items: Sequence[object] = [part if part.strip().lower() != "tpu" else "tpu:0" for part in text.split(",")]
    elif isinstance(spec, (list, tuple)):
        items = spec
        if not items:
            raise DeviceError(
                f"{_received(spec, name)}; an empty list selects no device. Omit devices to use every GPU "
                "(or the CPU), or name at least one, e.g. ['/gpu:0']."
            )
        for item in items:
            if isinstance(item, str) and "," in item:
                raise DeviceError(
                    f"{_received(spec, name)}; list entries are single devices but {item!r} holds several. "
                    f"Pass {[part.strip() for part in item.split(',')]!r} or the string {item!r} on its own."
                )
            if isinstance(item, str) and item.strip().lower() in KEYWORDS:
                raise DeviceError(f"{_received(spec, name)}; the keyword {item!r} stands alone: pass devices={item!r}, not a list.")
    else:
        raise DeviceError(
            f"{_received(spec, name)} ({type(spec).__name__}); expected a string or a list of devices, "
            f"such as {ACCEPTED_FORMS}."
        )
    devices = tuple(_parse_item(item, spec, name) for item in items)
    kinds = sorted({device.kind for device in devices})
    if len(kinds) > 1:
        raise DeviceError(
            f"{_received(spec, name)}; it mixes CPU and GPU replicas, which MirroredStrategy cannot keep in sync "
            "efficiently. Pass only GPUs (e.g. 'gpu') or only CPUs (e.g. 'cpu')."
        )
    seen: set[Device] = set()
    for device in devices:
        if device in seen:
            raise DeviceError(f"{_received(spec, name)}; {device} appears twice. Name each device once.")
        seen.add(device)
    text = ",".join(str(device) for device in devices)
    return DeviceRequest(devices=devices, text=text)


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
