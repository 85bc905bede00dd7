"""The parsers of what users write in settings (device specs, port ranges, run ids, node counts, collective
timeouts, audit modes) and the wording their errors share.

Beneath :mod:`tfstrategy.settings`, so a ``Variable`` there names its parser and nothing is parsed twice:
the same function reads ``--devices``, ``devices=`` and ``TFSTRATEGY_DEVICES``, each error naming the one
it came from (a flag as ``--devices cpu:9``, an argument or a variable as ``devices='cpu:9'``). Pure: no
TensorFlow, no host; checking a spec against the host is :mod:`tfstrategy.selection.devices`' part.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tfstrategy.errors import DeviceError, LaunchError, StrategyError

__all__ = ["closest", "did_you_mean", "shorten", "received", "spell", "Device", "DeviceRequest", "DeviceSpec",
           "parse_devices", "parse_port_range", "parse_run_id", "AUDIT_MODES", "parse_min_max", "parse_collective_timeout",
           "validate_audit_mode"]


def closest(received: str, options: Iterable[str]) -> str | None:
    """The option a mistyped ``received`` most likely meant (``mirored`` -> ``mirrored``), or None."""
    matches = difflib.get_close_matches(received.lower(), list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(received: str, options: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest option, or ``''``: the hint every error message appends."""
    match = closest(received, options)
    return f" Did you mean {match!r}?" if match else ""


def shorten(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, so a 10 KB value makes a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def received(name: str, value: object) -> str:
    """A value as an error message names it: ``--devices cpu:9`` for a flag (a name starting ``--``, as the
    CLI passes), ``devices='cpu:9'`` for a keyword argument or ``TFSTRATEGY_DEVICES='cpu:9'`` for a variable.

    Example:
        >>> received("--strategy", "mirored")
        '--strategy mirored'
        >>> received("strategy", "mirored")
        "strategy='mirored'"
    """
    if name.startswith("--"):
        text = str(value)
        return f"{name} {text if len(text) <= 80 else f'{text[:80]}... ({len(text)} characters)'}"
    return f"{name}={shorten(value)}"


def spell(name: str, setting: str, value: str) -> str:
    """How a fix names ``setting=value`` in the vocabulary of ``name``: ``--cpu-replicas 4`` when ``name`` is a
    flag, else the keyword argument ``cpu_replicas=4`` (a string value quoted)."""
    if name.startswith("--"):
        return f"--{setting.replace('_', '-')} {value}"
    return f"{setting}={value if value.isdigit() else repr(value)}"


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


#: A run id: a folder name (letters, digits, ``.``, ``_``, ``-``), not starting with a dot.
_RUN_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


def parse_run_id(text: str, source: str = "--run-id") -> str:
    """``text`` as a run id, the name of one folder; ``source`` names where it came from.

    Raises:
        LaunchError: a path, an empty name, or characters other than letters, digits, ``.``, ``_`` and ``-``.
    """
    if not _RUN_ID.fullmatch(text):
        raise LaunchError(f"Received {source} {text!r}; expected one folder name of letters, digits, '.', '_' and '-' "
                          "(not starting with '.'), e.g. --run-id exp1 or --run-id \"$SLURM_JOB_ID\".")
    return text


def parse_port_range(text: str, source: str = "--port-range") -> tuple[int, int]:
    """``LOW-HIGH`` (or one port) as ``(low, high)``; ``source`` names where the text came from.

    Raises:
        LaunchError: anything but one or two integers joined by '-'.
    """
    parts = [part.strip() for part in text.split("-")]
    if not 1 <= len(parts) <= 2 or not all(part.isdigit() for part in parts):
        raise LaunchError(f"Received {source} {text!r}; expected LOW-HIGH, the ports the workers may listen on, "
                          "e.g. --port-range 29500-29599.")
    return int(parts[0]), int(parts[-1])


#: The values of ``--audit`` / ``TFSTRATEGY_AUDIT`` (here, below the hook's module, so the CLI's parser
#: offers them without loading the hook).
AUDIT_MODES = ("warn", "stop", "off")


def parse_min_max(text: str) -> tuple[int | None, int] | None:
    """``N`` as ``(None, N)`` and ``MIN:MAX`` as ``(MIN, MAX)`` (torchrun's node counts); ``None`` if neither.

    Only the shape: each caller checks the counts against what it runs (``--nnodes``, ``k8s --elastic``).
    """
    low, sep, high = text.strip().partition(":")
    if not sep:
        return (None, int(low)) if low.isdigit() else None
    return (int(low), int(high)) if low.isdigit() and high.isdigit() else None



def parse_collective_timeout(value: object, *, name: str = "collective_timeout") -> float | None:
    """Seconds > 0 as a float; ``None`` for "wait forever" (``"none"``, ``0`` or ``inf``).

    Raises:
        StrategyError: not a finite positive number, ``0``, ``inf`` or ``"none"``.
    """
    text = str(value).strip().lower()
    if text in ("none", "0", "0.0", "inf", "infinity"):
        return None
    number = math.nan
    if not isinstance(value, bool) and len(text) <= 32:
        try:
            number = float(text)
        except ValueError:
            pass
    if not math.isfinite(number) or number <= 0:
        raise StrategyError(
            f"Received {name}={shorten(value)}; expected seconds > 0 (e.g. 120), or 'none' to wait forever "
            "as TensorFlow does by default."
        )
    return number


def validate_audit_mode(mode: object, *, name: str = "--audit") -> str:
    """``warn``, ``stop`` or ``off``.

    Raises:
        StrategyError: anything else.
    """
    text = str(mode).strip().lower()
    if text not in AUDIT_MODES:
        raise StrategyError(
            f"Received {name} {mode!r}; expected one of {', '.join(AUDIT_MODES)}: warn reports variables made outside "
            "the strategy's scope and trains on, stop refuses to train, off skips the audit."
        )
    return text
